"""A run's checkpoints: `checkpoints/iter_N/` written aside and renamed into place, then
`checkpoints/latest` pointed at it, so a crash never leaves a half-written checkpoint as the
one `--resume` continues from.

Each holds `rllib/` (algorithm, learner and optimizer state), `adapter/` (the policy's LoRA
adapter in peft format + value head) and `reflectrl_state.json` (iteration, curriculum stage,
run totals, every worker's env random streams), and with `rl.success_replay` its buffer
(`success_replay.pkl`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reflectrl.atomic_files import atomic_dir, write_json, write_text
from reflectrl.errors import CheckpointError
from reflectrl.run_dir import CHECKPOINT_STATE_FILE, CHECKPOINTS_DIR, LATEST_CHECKPOINT


def write_checkpoint(
    run_dir: Path,
    iteration: int,
    algo: Any,
    save_adapter: Callable[[Path], None],
    state: dict[str, Any],
    save_extra: Callable[[Path], None] | None = None,
) -> Path:
    """RLlib checkpoint + peft adapter + our state, as `checkpoints/iter_<iteration>`.

    A write that fails (disk full, a read-only or vanished run dir) raises CheckpointError in
    one line; the half-written folder is removed and `latest` still names the previous one."""
    root = run_dir / CHECKPOINTS_DIR
    name = f"iter_{iteration:06d}"
    final = root / name
    try:
        with atomic_dir(final) as tmp:
            # RLlib reads a relative path as a URI without a scheme and fails: always absolute.
            algo.save_to_path(str((tmp / "rllib").resolve()))
            save_adapter(tmp / "adapter")
            write_json(tmp / CHECKPOINT_STATE_FILE, state)
            if save_extra is not None:  # more files of the run's (success replay's buffer)
                save_extra(tmp)
        write_text(root / LATEST_CHECKPOINT, name)
    except OSError as err:
        previous = (
            (root / LATEST_CHECKPOINT).read_text().strip()
            if (root / LATEST_CHECKPOINT).is_file()
            else None
        )
        kept = f"{previous} stays the latest" if previous else "no earlier checkpoint exists"
        raise CheckpointError(
            f"cannot write checkpoint {name} in {root}: {err.strerror or err} "
            f"({type(err).__name__}); {kept}; free space or fix the run dir's permissions, then "
            f"continue with `reflectrl launch --resume {run_dir}`"
        ) from None
    return final


def read_state(checkpoint: Path) -> dict[str, Any]:
    return json.loads((checkpoint / CHECKPOINT_STATE_FILE).read_text())
