"""Learners as Ray actors (`run.num_learners` >= 1), rollouts in half precision, and the two
faults of the learner side: a learner actor killed, a checkpoint that cannot be written.
Real Ray and RLlib, tiny models, no reflection server."""

from __future__ import annotations

import os
import resource
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from reflectrl.config import load_config
from reflectrl.errors import CheckpointError, LearnerDiedError

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "configs" / "smoke.yaml"

pytestmark = pytest.mark.integration


XDIST_SPREAD = True  # no module fixtures: its tests may run in different test processes


@pytest.fixture
def ray4() -> Any:
    import ray

    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def config_with(*overrides: str) -> Any:
    return load_config(
        SMOKE,
        [
            "reflection.enabled=false",
            "curriculum.enabled=false",
            "run.checkpoint_every=1",
            "policy.lora.target_modules=[q_proj,k_proj,v_proj,o_proj]",
            *overrides,
        ],
    )


def worker_states(run: Any) -> list[dict[str, np.ndarray]]:

    # An EnvRunner's `module` is the single-agent module itself.
    return run.algo.env_runner_group.foreach_env_runner(
        lambda runner: runner.module.get_state(), local_env_runner=False
    )


def assert_states_equal(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(np.asarray(a[key]), np.asarray(b[key]), err_msg=key)


def train_and_check_sync(run: Any, learners: int, iterations: int) -> dict[str, np.ndarray]:
    """Train; then every learner (equal under DDP) and every rollout worker holds the weights
    the learner group reports, and the update changed them. Returns that state."""
    group = run.algo.learner_group
    assert group.is_remote and len(group) == learners
    pids = [r.get() for r in group.foreach_learner(lambda learner: os.getpid())]
    assert len(set(pids)) == learners and os.getpid() not in pids  # actors, not the driver
    before = run.algo.module_state()
    rows = [run.train_iteration() for _ in range(iterations)]
    after = run.algo.module_state()
    per_learner = [
        r.get()
        for r in group.foreach_learner(
            lambda learner: learner.module["default_policy"].unwrapped().get_state()
        )
    ]
    workers = worker_states(run)
    assert all(row["updated"] for row in rows) and int(after["weights_version"]) > 0
    assert any(not np.array_equal(before[k], after[k]) for k in before if k != "weights_version")
    assert len(per_learner) == learners and len(workers) == 1
    for state in [*per_learner, *workers]:
        assert_states_equal(state, after)
    return after


def test_one_learner_actor_trains_syncs_checkpoints_and_resumes(
    ray4: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from reflectrl.models.adapters import adapter_weights
    from reflectrl.rl.driver import Run
    from reflectrl.rl.ppo import ReflectRLPPO
    from reflectrl.run_dir import latest_checkpoint

    run_dir = tmp_path / "run"
    config = config_with("run.num_learners=1", "run.iterations=2")
    run = Run(config, run_dir, workers=1)
    try:
        run.start()
        after = train_and_check_sync(run, learners=1, iterations=1)
    finally:
        run.close()
    checkpoint = latest_checkpoint(run_dir)
    assert checkpoint is not None and checkpoint.name == "iter_000001"
    saved = adapter_weights(checkpoint / "adapter", "checkpoint")
    assert saved  # written by the driver from the state it read off the learner actor
    for name, tensor in saved.items():
        key = "policy.lm." + name.replace(".weight", ".default.weight")
        np.testing.assert_array_equal(tensor.numpy(), after[key], err_msg=name)

    # A loaded machine, made deterministic: when RLlib syncs the restored weights, the reply to
    # each worker's previous sync has not been seen yet, so RLlib skips the worker...
    restore = ReflectRLPPO.restore_from_path

    def restore_while_replies_are_out(algo: Any, path: Any, *args: Any, **kwargs: Any) -> None:
        manager = algo.env_runner_group._worker_manager
        for actor_id in manager.actor_ids():
            manager._remote_actor_states[actor_id].increment_requests("set_state")
        restore(algo, path, *args, **kwargs)

    monkeypatch.setattr(ReflectRLPPO, "restore_from_path", restore_while_replies_are_out)
    resumed = Run(config, run_dir, workers=1)
    try:
        resumed.start(checkpoint)
        assert_states_equal(resumed.algo.module_state(), after)
        # ...and the worker holds the restored weights anyway (`Run._restore` pushes them).
        assert_states_equal(worker_states(resumed)[0], after)
        row = resumed.train_iteration()
    finally:
        resumed.close()
    assert row["iteration"] == 2 and row["updated"]


def test_two_ddp_learners_a_killed_one_stops_the_run_in_one_line_and_resume_continues(
    ray4: Any, tmp_path: Path
) -> None:
    from reflectrl.rl.driver import Run
    from reflectrl.run_dir import latest_checkpoint

    run_dir = tmp_path / "run"
    # 32 env steps per iteration, 16 for each learner.
    config = config_with("run.num_learners=2", "ppo.minibatch_size=16", "run.iterations=4")
    run = Run(config, run_dir, workers=1)
    try:
        run.start()
        saved = train_and_check_sync(run, learners=2, iterations=1)
        names = [r.get() for r in run.algo.learner_group.foreach_learner(repr)]
        assert sorted(names) == ["learner-0", "learner-1"]  # their repr name on the dashboard
        pid = next(iter(run.algo.learner_group.foreach_learner(lambda _: os.getpid()))).get()
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(LearnerDiedError) as died:
            run.train_iteration()
    finally:
        run.close()  # must not raise over the learner's death
    message = str(died.value)
    assert "\n" not in message and "learner actor died in iteration 2" in message
    assert f"reflectrl launch --resume {run_dir}" in message and "iter_000001" in message

    checkpoint = latest_checkpoint(run_dir)
    assert checkpoint is not None and checkpoint.name == "iter_000001"
    resumed = Run(config, run_dir, workers=1)
    try:
        resumed.start(checkpoint)
        states = [
            r.get()
            for r in resumed.algo.learner_group.foreach_learner(
                lambda learner: learner.module["default_policy"].unwrapped().get_state()
            )
        ]
        row = resumed.train_iteration()
    finally:
        resumed.close()
    assert len(states) == 2
    for state in states:  # both learners restored
        assert_states_equal(state, saved)
    assert row["iteration"] == 2 and row["updated"]


def test_a_checkpoint_that_cannot_be_written_keeps_the_previous_one(
    ray4: Any, tmp_path: Path
) -> None:
    """Writes fail mid-checkpoint (a 1-byte file size limit on this process, as a full disk
    fails them): one line, `latest` still names the previous checkpoint, nothing half-written
    is left, and the next checkpoint succeeds once writes work again."""
    from reflectrl.rl.checkpoints import read_state
    from reflectrl.rl.driver import Run
    from reflectrl.run_dir import latest_checkpoint

    run_dir = tmp_path / "run"
    run = Run(config_with("run.checkpoint_every=100"), run_dir, workers=1)
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a signal
    try:
        run.start()
        run.train_iteration()
        run.save()
        run.train_iteration()
        resource.setrlimit(resource.RLIMIT_FSIZE, (1, limits[1]))
        try:
            with pytest.raises(CheckpointError) as failed:
                run.save()
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        assert latest_checkpoint(run_dir).name == "iter_000001"
        assert read_state(latest_checkpoint(run_dir))["iteration"] == 1
        assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [
            "iter_000001",
            "latest",
        ]
        assert run.save().name == "iter_000002"
    finally:
        signal.signal(signal.SIGXFSZ, old_handler)
        run.close()
    message = str(failed.value)
    assert "\n" not in message and "File too large" in message
    assert "iter_000001 stays the latest" in message and "--resume" in message
    assert latest_checkpoint(run_dir).name == "iter_000002"


def test_rollout_workers_score_in_bfloat16(ray4: Any, tmp_path: Path) -> None:
    """`policy.dtype` casts the workers' copy of the LM; the learner stays float32, and the
    workers' label probabilities stay close to the learner's."""
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.core.columns import Columns

    from reflectrl.data.scratch import resolve_or_build
    from reflectrl.models.loading import load_tokenizer
    from reflectrl.rl.driver import Run
    from reflectrl.rollout.vector_env import ReflectRLVectorEnv

    config = config_with("policy.dtype=bfloat16")
    tokenizer = load_tokenizer(resolve_or_build("tiny"))
    env = ReflectRLVectorEnv(config, tokenizer, None, num_envs=2)
    obs, _ = env.reset(seed=0)
    batch = {Columns.OBS: {k: torch.as_tensor(v) for k, v in obs.items()}}

    def probabilities(runner: Any) -> tuple[str, np.ndarray]:
        module = runner.module
        logits = module.forward_inference(batch)[Columns.ACTION_DIST_INPUTS]
        return str(next(module.parameters()).dtype), torch.softmax(logits, -1).numpy()

    run = Run(config, tmp_path / "run", workers=1)
    try:
        run.start()
        row = run.train_iteration()
        ((dtype, worker_probs),) = run.algo.env_runner_group.foreach_env_runner(
            probabilities, local_env_runner=False
        )
        (learner_probs,) = [
            r.get()
            for r in run.algo.learner_group.foreach_learner(
                lambda learner: (
                    str(next(learner.module[DEFAULT_MODULE_ID].parameters()).dtype),
                    torch.softmax(
                        learner.module[DEFAULT_MODULE_ID].forward_inference(batch)[
                            Columns.ACTION_DIST_INPUTS
                        ],
                        -1,
                    ).numpy(),
                )
            )
        ]
    finally:
        run.close()
    assert row["updated"] and dtype == "torch.bfloat16" and learner_probs[0] == "torch.float32"
    np.testing.assert_allclose(worker_probs, learner_probs[1], atol=0.02)
    assert np.isfinite(worker_probs).all()


def test_heartbeat_shows_the_learning_phase(ray4: Any) -> None:
    """What workers and learners report reaches the heartbeat's lines (the ProgressBoard
    actor is real; the reports are sent as the learner and the env send them)."""
    import io

    from reflectrl.rl.heartbeat import Heartbeat
    from reflectrl.rollout.progress_board import board_reporter, start_progress_board

    board = start_progress_board("test-progress-board")
    out = io.StringIO()
    heartbeat = Heartbeat(board, total_iterations=5, steps_per_iteration=64, every_s=0.2, out=out)
    report = board_reporter("test-progress-board")
    assert report is not None
    heartbeat.start(3)
    for _ in range(16):
        report("env_steps", 4)
    report("learning", 4)
    report("minibatch", 1)
    report("minibatch", 1)
    deadline = time.monotonic() + 10
    while "minibatch 2/4" not in out.getvalue() and time.monotonic() < deadline:
        time.sleep(0.1)
    heartbeat.stop()
    lines = out.getvalue().splitlines()
    assert lines and all(line.startswith("  [iter 3/5 ") for line in lines)
    assert lines[-1].endswith("] learning: minibatch 2/4, env steps 64/64"), lines[-1]
    heartbeat.start(4)  # a new iteration starts from zero
    time.sleep(0.5)
    heartbeat.stop()
    assert out.getvalue().splitlines()[-1].endswith("] sampling: env steps 0/64")
