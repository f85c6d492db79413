"""The driver SIGKILLed mid-iteration, then `--resume`: in a deterministic config the result is
bitwise the result of a run that was never interrupted, the two running side by side so that
each loads the other's cores. Real CLI, Ray and RLlib."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tests.helpers import assert_console_is_ours, cli_env, run_cli

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "configs" / "smoke.yaml"
ITERATIONS = 2  # killed as iteration 2 starts; the resume runs it
# Reflection off, one worker, whole episodes per iteration: nothing in flight at a checkpoint.
DETERMINISTIC = [
    "--workers", "1", "--config", str(SMOKE), "--iterations", str(ITERATIONS),
    "--set", "reflection.enabled=false", "--set", "sft.enabled=false",
    "--set", "eval.enabled=false", "--set", "run.checkpoint_every=1",
    "--set", "ppo.batch_mode=complete_episodes", "--set", "ppo.train_batch_size=96",
    # Group resets and success replay: their counters and buffer are restored too.
    "--set", "rl.group_size=2", "--set", "rl.success_replay.episodes=50",
]  # fmt: skip

# Under load, RLlib used to drop a weight sync whose predecessor's reply it had not seen yet,
# so a worker sampled with older weights depending on timing (ReflectRLPPO.training_step now
# resends them). Two runs on shared cores, with the other test process beside them, keep that
# kind of timing dependence visible: no two of them see the same timings.
pytestmark = pytest.mark.integration


def launch(output: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """The deterministic run into `output`, started in the background; its stderr's file."""
    stderr = output.with_suffix(".stderr")
    with stderr.open("wb") as sink:  # a file, not a pipe: nobody reads it while it runs
        process = subprocess.Popen(
            [sys.executable, "-m", "reflectrl.cli", "launch", *DETERMINISTIC, "--output",
             str(output)],
            stdout=subprocess.DEVNULL,
            stderr=sink,
            cwd=REPO,
            env=cli_env(),
        )  # fmt: skip
    return process, stderr


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


def replayed(checkpoint: Path) -> list[tuple[list[int], list[float]]]:
    """Success replay's buffer in a checkpoint: each episode's actions and rewards."""
    from reflectrl.rl.success_replay import REPLAY_FILE, SuccessReplay

    replay = SuccessReplay(capacity=50)
    replay.load(checkpoint / REPLAY_FILE)
    return [([int(a) for a in e.get_actions()], list(e.get_rewards())) for e in replay.episodes]


def test_a_resume_after_a_killed_driver_equals_a_straight_run(tmp_path: Path) -> None:
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    # The straight run and the one whose driver is SIGKILLed as soon as iteration 2 is under
    # way start together; the killed one is resumed while the straight one may still run. It
    # must end bitwise where the straight run did.
    straight_run, straight_log = launch(straight)
    killed_run, killed_log = launch(killed)
    try:
        latest = killed / "checkpoints" / "latest"
        deadline = time.monotonic() + 600
        while not (latest.is_file() and latest.read_text() == "iter_000001"):
            assert killed_run.poll() is None, killed_log.read_text()[-3000:]
            assert time.monotonic() < deadline, "no first checkpoint"
            time.sleep(0.05)
        os.kill(killed_run.pid, signal.SIGKILL)  # iteration 2 has just started
        killed_run.wait(timeout=30)
        assert latest.read_text() == "iter_000001"  # iteration 2 never finished

        result = run_cli("launch", "--workers", "1", "--resume", str(killed), timeout=900)
        assert result.returncode == 0, result.stderr[-3000:]
        assert "iter    2/2" in result.stdout and "iter    1/2" not in result.stdout
        assert_console_is_ours(result, killed)
        assert straight_run.wait(timeout=900) == 0, straight_log.read_text()[-3000:]
    finally:  # a failed check leaves no run behind
        for run in (straight_run, killed_run):
            if run.poll() is None:
                run.kill()
                run.wait()

    a = straight / "checkpoints" / "iter_000002"
    b = killed / "checkpoints" / "iter_000002"
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
    assert replayed(a) == replayed(b)
    rows_a = (straight / "metrics.jsonl").read_text().splitlines()
    rows_b = (killed / "metrics.jsonl").read_text().splitlines()
    assert len(rows_a) == len(rows_b) == ITERATIONS

    # `reflectrl eval --run` evaluates the resumed run's final policy with the run's config.
    out = tmp_path / "again.json"
    result = run_cli("eval", "--run", str(killed), "--episodes", "1", "--out", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    again = json.loads(out.read_text())
    assert again["greedy"]["all"]["episodes"] == 1 and "greedy    all" in result.stdout
