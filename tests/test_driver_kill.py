"""The driver SIGKILLed mid-iteration, then `--resume`: in a deterministic config the result is
bitwise the result of a run that was never interrupted, while another process keeps a core
busy. Real CLI, Ray and RLlib."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tests.helpers import run_cli

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "configs" / "smoke.yaml"
ITERATIONS = 3
# Reflection off, one worker, whole episodes per iteration: nothing in flight at a checkpoint.
DETERMINISTIC = [
    "--workers", "1", "--config", str(SMOKE), "--iterations", str(ITERATIONS),
    "--set", "reflection.enabled=false", "--set", "sft.enabled=false",
    "--set", "eval.enabled=false", "--set", "run.checkpoint_every=1",
    "--set", "ppo.batch_mode=complete_episodes", "--set", "ppo.train_batch_size=96",
]  # fmt: skip

# Under load, RLlib used to drop a weight sync whose predecessor's reply it had not seen yet,
# so a worker sampled with older weights depending on timing (ReflectRLPPO.training_step now
# resends them). The burner keeps that kind of timing dependence visible.
pytestmark = pytest.mark.integration

BURN = "import time\nend = time.monotonic() + 1800\nwhile time.monotonic() < end:\n    pass\n"


@contextmanager
def cpu_burner() -> Iterator[None]:
    """A busy-looping process while the block runs (in `make test` the other test process
    loads the other core)."""
    burner = subprocess.Popen([sys.executable, "-c", BURN])
    try:
        yield
    finally:
        burner.kill()
        burner.wait()


def learner_state(checkpoint: Path) -> dict:
    with (checkpoint / "rllib" / "learner_group" / "learner" / "state.pkl").open("rb") as f:
        return pickle.load(f)


def flat(tree: object, prefix: str = "") -> dict[str, np.ndarray]:
    if isinstance(tree, dict):
        out: dict[str, np.ndarray] = {}
        for key, value in tree.items():
            out.update(flat(value, f"{prefix}/{key}"))
        return out
    if isinstance(tree, np.ndarray | torch.Tensor | float | int):
        return {prefix: np.asarray(tree)}
    return {}


def test_a_resume_after_a_killed_driver_equals_a_straight_run(tmp_path: Path) -> None:
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    result = run_cli("launch", *DETERMINISTIC, "--output", str(straight), timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]

    # The same run beside a busy core, its driver SIGKILLed as soon as iteration 2 is under
    # way, then resumed: it must end bitwise where the straight run did.
    with cpu_burner():
        process = subprocess.Popen(
            [sys.executable, "-m", "reflectrl.cli", "launch", *DETERMINISTIC, "--output",
             str(killed)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=REPO,
        )  # fmt: skip
        latest = killed / "checkpoints" / "latest"
        deadline = time.monotonic() + 600
        while not (latest.is_file() and latest.read_text() == "iter_000001"):
            assert process.poll() is None and time.monotonic() < deadline, "no first checkpoint"
            time.sleep(0.05)
        os.kill(process.pid, signal.SIGKILL)  # iteration 2 has just started
        process.wait(timeout=30)
        assert latest.read_text() == "iter_000001"  # iteration 2 never finished

        result = run_cli("launch", "--workers", "1", "--resume", str(killed), timeout=900)
        assert result.returncode == 0, result.stderr[-3000:]
        assert "iter    2/3" in result.stdout and "iter    1/3" not in result.stdout

    a = straight / "checkpoints" / "iter_000003"
    b = killed / "checkpoints" / "iter_000003"
    adapter_a = load_file(a / "adapter" / "adapter_model.safetensors")
    adapter_b = load_file(b / "adapter" / "adapter_model.safetensors")
    assert adapter_a.keys() == adapter_b.keys() and adapter_a
    for name in adapter_a:
        assert torch.equal(adapter_a[name], adapter_b[name]), name
    head_a = torch.load(a / "adapter" / "value_head.pt")
    head_b = torch.load(b / "adapter" / "value_head.pt")
    assert all(torch.equal(head_a[k], head_b[k]) for k in head_a)
    optimizer_a = flat(learner_state(a)["optimizer"])
    optimizer_b = flat(learner_state(b)["optimizer"])
    moments = [k for k in optimizer_a if k.endswith(("exp_avg", "exp_avg_sq"))]
    assert moments and optimizer_a.keys() == optimizer_b.keys()
    for key in optimizer_a:
        np.testing.assert_array_equal(optimizer_a[key], optimizer_b[key], err_msg=key)
    rows_a = (straight / "metrics.jsonl").read_text().splitlines()
    rows_b = (killed / "metrics.jsonl").read_text().splitlines()
    assert len(rows_a) == len(rows_b) == ITERATIONS

    # `reflectrl eval --run` evaluates the resumed run's final policy with the run's config.
    out = tmp_path / "again.json"
    result = run_cli("eval", "--run", str(killed), "--episodes", "1", "--out", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    again = json.loads(out.read_text())
    assert again["greedy"]["all"]["episodes"] == 1 and "greedy    all" in result.stdout
