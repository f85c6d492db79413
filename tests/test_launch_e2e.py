"""End to end with real Ray, real RLlib and a real vLLM reflection server (tiny models)."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from reflectrl.config import load_config

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "configs" / "smoke.yaml"
ROW_KEYS = {
    "iteration",
    "env_steps",
    "episodes",
    "success_rate",
    "episode_return_mean",
    "stage",
    "reflection_calls",
    "env_steps_per_s",
    "weight_sync_bytes",
    "adapter_version",
}

pytestmark = pytest.mark.integration


def reflectrl(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    return subprocess.run(
        [sys.executable, "-m", "reflectrl.cli", "launch", *args],
        capture_output=True,
        text=True,
        timeout=1200,
        env=env,
        cwd=REPO,
    )


def read_rows(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_cli_smoke_run_writes_the_run_directory_and_resumes(tmp_path: Path) -> None:
    run = tmp_path / "run"
    result = reflectrl(
        "--workers", "2", "--config", str(SMOKE), "--iterations", "2", "--output", str(run)
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Ray dashboard: http://127.0.0.1:" in result.stdout
    progress = [line for line in result.stdout.splitlines() if line.startswith("iter ")]
    assert len(progress) == 2 and "success" in progress[0] and "steps/s" in progress[0]

    rows = read_rows(run)
    assert [r["iteration"] for r in rows] == [1, 2]
    assert all(set(r) >= ROW_KEYS for r in rows)
    assert rows[-1]["reflection_calls"] > 0
    assert rows[-1]["env_steps"] >= 2 * 64
    assert 0 < rows[-1]["weight_sync_bytes"] < 1_000_000  # LoRA only, not the whole LM
    assert rows[0]["stage"] == "pickup" and rows[1]["stage"] == "dropoff"  # smoke caps pickup at 1
    assert load_config(run / "config.yaml") == load_config(SMOKE, ["run.iterations=2"])
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    assert (run / "reflection_server.log").stat().st_size > 0
    checkpoint = run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()
    assert (checkpoint / "rllib" / "rllib_checkpoint.json").is_file()
    assert (checkpoint / "adapter" / "adapter_config.json").is_file()
    state = json.loads((checkpoint / "reflectrl_state.json").read_text())
    assert state["iteration"] == 2 and state["curriculum"]["stage"] == "dropoff"
    assert state["adapter_version"] == 2 and all(r["updated"] for r in rows)
    with (checkpoint / "rllib" / "learner_group" / "learner" / "state.pkl").open("rb") as f:
        learner_state = pickle.load(f)
    optimizer = learner_state["optimizer"]["default_policy_default_optimizer"]["state"]
    assert optimizer["state"], "the checkpoint must hold the optimizer's moments"

    # Resume continues the same run: iteration 3 appended, curriculum stage kept.
    result = reflectrl("--workers", "2", "--resume", str(run), "--iterations", "3")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_rows(run)
    assert [r["iteration"] for r in rows] == [1, 2, 3]
    assert rows[2]["stage"] == "dropoff" and rows[2]["env_steps"] > rows[1]["env_steps"]


@pytest.fixture(scope="module")
def ray_session() -> Any:
    import ray

    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_weights_and_stage_reach_every_worker(
    ray_session: Any, tmp_path: Path, tokenizer: Any
) -> None:
    import torch
    from ray.rllib.core.columns import Columns

    from reflectrl.launch import Run
    from reflectrl.rollout_workers.vector_env import ReflectRLVectorEnv

    config = load_config(SMOKE, ["run.iterations=2"])
    run = Run(config, tmp_path / "run", workers=2)
    try:
        run.start()
        probe_env = ReflectRLVectorEnv(
            load_config(SMOKE, ["reflection.enabled=false"]), tokenizer, None, num_envs=2
        )
        obs, _ = probe_env.reset()
        batch = {Columns.OBS: {k: torch.as_tensor(v) for k, v in obs.items()}}

        def logits_on_runner(runner: Any) -> np.ndarray:
            out = runner.module.forward_inference(batch)
            return out[Columns.ACTION_DIST_INPUTS].numpy()

        before = run.learner_module().forward_inference(batch)[Columns.ACTION_DIST_INPUTS]
        row = run.train_iteration()
        assert row["reflection_calls"] > 0
        learner = run.learner_module().forward_inference(batch)[Columns.ACTION_DIST_INPUTS]
        assert not torch.allclose(before, learner)  # the update changed the policy...
        group = run.algo.env_runner_group
        for worker_logits in group.foreach_env_runner(logits_on_runner, local_env_runner=False):
            np.testing.assert_allclose(worker_logits, learner.numpy(), atol=1e-6)  # ...everywhere

        # The smoke curriculum caps `pickup` at one iteration: every worker now plays dropoff.
        stages = group.foreach_env_runner(
            lambda runner: runner.env.unwrapped.stage, local_env_runner=False
        )
        assert stages == ["dropoff", "dropoff"]
        row = run.train_iteration()
        assert row["stage"] == "dropoff"
    finally:
        run.close()
