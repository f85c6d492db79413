"""A run's checkpoints: `checkpoints/iter_N/` written aside and renamed into place, then
`checkpoints/latest` pointed at it, so a crash never leaves a half-written checkpoint as the
one `--resume` continues from.

Each holds `rllib/` (algorithm, learner and optimizer state), `adapter/` (the policy's LoRA
adapter in peft format + value head) and `reflectrl_state.json` (iteration, curriculum stage,
run totals, every worker's env random streams).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reflectrl.errors import CheckpointError, ConfigError

STATE_FILE = "reflectrl_state.json"


def latest_checkpoint(run_dir: Path) -> Path | None:
    pointer = run_dir / "checkpoints" / "latest"
    if not pointer.is_file():
        return None
    path = run_dir / "checkpoints" / pointer.read_text().strip()
    if not (path / STATE_FILE).is_file():
        raise ConfigError(f"checkpoint {path} is incomplete; point checkpoints/latest at another")
    return path


def write_checkpoint(
    run_dir: Path,
    iteration: int,
    algo: Any,
    save_adapter: Callable[[Path], None],
    state: dict[str, Any],
) -> Path:
    """RLlib checkpoint + peft adapter + our state, as `checkpoints/iter_<iteration>`.

    A write that fails (disk full, a read-only or vanished run dir) raises CheckpointError in
    one line; the half-written folder is removed and `latest` still names the previous one."""
    root = run_dir / "checkpoints"
    name = f"iter_{iteration:06d}"
    final, tmp = root / name, root / f".{name}.tmp"
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        # RLlib reads a relative path as a URI without a scheme and fails: always absolute.
        algo.save_to_path(str((tmp / "rllib").resolve()))
        save_adapter(tmp / "adapter")
        (tmp / STATE_FILE).write_text(json.dumps(state, indent=2))
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        pointer_tmp = root / ".latest.tmp"
        pointer_tmp.write_text(name)
        pointer_tmp.replace(root / "latest")
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        previous = (root / "latest").read_text().strip() if (root / "latest").is_file() else None
        kept = f"{previous} stays the latest" if previous else "no earlier checkpoint exists"
        raise CheckpointError(
            f"cannot write checkpoint {name} in {root}: {err.strerror or err} "
            f"({type(err).__name__}); {kept}; free space or fix the run dir's permissions, then "
            f"continue with `reflectrl launch --resume {run_dir}`"
        ) from None
    return final


def read_state(checkpoint: Path) -> dict[str, Any]:
    return json.loads((checkpoint / STATE_FILE).read_text())
