"""End to end with real Ray, real RLlib and a real vLLM reflection server (tiny models)."""

from __future__ import annotations

import json
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from reflectrl.config import load_config
from tests.fake_openai_server import MODEL as REFLECTOR
from tests.helpers import assert_console_is_ours, cli_env, png_size, run_cli

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
    "staleness",
}

pytestmark = pytest.mark.integration


def reflectrl(*args: str) -> subprocess.CompletedProcess[str]:
    return reflectrl_cli("launch", *args)


def reflectrl_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, timeout=1200)


def read_rows(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_cli_smoke_pipeline_runs_every_stage_and_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """data -> sft -> rl (from the SFT adapters, reflections from the served SFT adapter) ->
    eval, in one run directory, and bitwise again in its twin's; --resume of the finished run
    does nothing and says so.
    (Resuming RL itself: test_resume_restores_...; which stages a resume runs:
    test_pipeline.py.)"""
    run, twin = tmp_path / "run", tmp_path / "twin"
    # Relative, as users type it (RLlib takes a relative checkpoint path for a bad URI).
    out = Path(os.path.relpath(run, REPO))
    args = [
        "--workers", "2", "--config", str(SMOKE), "--iterations", "2",
        "--set", "eval.every=2", "--set", "run.heartbeat_s=1",
        "--set", "run.trackers=[tensorboard, mlflow]",
    ]  # fmt: skip
    # Its twin, the same seeded config, runs beside it (each loads the other's cores).
    twin_process = subprocess.Popen(
        [sys.executable, "-m", "reflectrl.cli", "launch", *args, "--output", str(twin)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=cli_env(),
    )
    result = reflectrl(*args, "--output", str(out))
    _, twin_stderr = twin_process.communicate(timeout=1200)
    assert result.returncode == 0, result.stderr[-3000:]
    assert twin_process.returncode == 0, twin_stderr[-3000:]
    assert_the_twins_are_equal(run, twin)
    assert "Ray dashboard: http://127.0.0.1:" in result.stdout
    assert_console_is_ours(result, run)
    # Within each iteration: heartbeat lines with the phase and env steps so far (learning
    # takes well under a second here; its lines: test_heartbeat_shows_the_learning_phase).
    beats = [line for line in result.stdout.splitlines() if line.startswith("  [iter ")]
    assert any(re.search(r"\] sampling: env steps \d+/64$", b) for b in beats), beats
    for number, stage in enumerate(["data", "sft", "rl", "eval"], 1):
        assert f"[stage {number}/4: {stage}] started" in result.stdout
        assert json.loads((run / "stages" / f"{stage}.json").read_text())["stage"] == stage
    assert (run / "data" / "data.jsonl").is_file() and (run / "data" / "stats.json").is_file()
    for player in ("reflection", "policy"):
        assert (run / "sft" / player / "adapter_config.json").is_file()
        assert f"sft: {player}: 10 steps" in result.stdout
        assert f"sft {player}: step 10/10, loss " in result.stdout  # the SFT task's progress
    # RL starts from the SFT policy adapter and the server serves the SFT reflection adapter
    # (the server is ready only once it lists the adapter's name).
    assert f"(tiny + adapter {out / 'sft' / 'reflection'}; 1 replica)" in result.stdout
    report = json.loads((run / "eval_test.json").read_text())
    assert report["greedy"]["all"]["episodes"] == 2 and report["split"] == "test"
    assert "greedy    all" in result.stdout
    progress = [line for line in result.stdout.splitlines() if line.startswith("iter ")]
    assert len(progress) == 2 and "success" in progress[0] and "steps/s" in progress[0]
    assert " ETA " in progress[0]
    # It ends with a result table (the figures of the run's own files) and its plots.
    table = result.stdout.split(f"results of {out}:")[1]
    greedy = report["greedy"]["all"]["success_rate"]
    assert re.search(rf"held-out success, greedy +{greedy:.3f} \[", table), table
    assert "rl: iterations / env steps" in table
    assert png_size(run / "plots" / "curriculum.png") == (800, 450)
    # 420 px per panel: training success, return and held-out success (eval.every).
    assert png_size(run / "plots" / "learning_curves.png") == (1260, 420)
    for plot in ("learning_curves.png", "curriculum.png"):
        assert str(out / "plots" / plot) in result.stdout

    rows = read_rows(run)
    assert [r["iteration"] for r in rows] == [1, 2]
    assert all(set(r) >= ROW_KEYS for r in rows)
    assert rows[-1]["reflection_calls"] > 0
    # Held-out evaluation every eval.every iterations, on the learner's current weights.
    assert "eval_success_rate" not in rows[0]
    assert 0 <= rows[1]["eval_success_rate"] <= 1 and rows[1]["eval_length_mean"] >= 1
    assert "held-out success" in progress[1]
    assert rows[-1]["env_steps"] >= 2 * 64
    assert 0 < rows[-1]["weight_sync_bytes"] < 1_000_000  # LoRA only, not the whole LM
    assert rows[0]["stage"] == "pickup" and rows[1]["stage"] == "dropoff"  # smoke caps pickup at 1
    overrides = [
        "run.iterations=2", "eval.every=2", "run.heartbeat_s=1",
        "run.trackers=[tensorboard, mlflow]",
    ]  # fmt: skip
    assert load_config(run / "config.yaml") == load_config(SMOKE, overrides)
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    assert (run / "reflection_server.log").stat().st_size > 0
    checkpoint = run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()
    assert (checkpoint / "rllib" / "rllib_checkpoint.json").is_file()
    assert (checkpoint / "adapter" / "adapter_config.json").is_file()
    state = json.loads((checkpoint / "reflectrl_state.json").read_text())
    assert state["iteration"] == 2 and state["curriculum"]["stage"] == "dropoff"
    assert state["adapter_version"] == 2 and all(r["updated"] for r in rows)
    assert state["totals"]["env_steps"] == rows[-1]["env_steps"]
    assert sorted(state["random_states"]) == ["1", "2"]  # each worker's env streams
    with (checkpoint / "rllib" / "learner_group" / "learner" / "state.pkl").open("rb") as f:
        learner_state = pickle.load(f)
    optimizer = learner_state["optimizer"]["default_policy_default_optimizer"]["state"]
    assert optimizer["state"], "the checkpoint must hold the optimizer's moments"

    assert_mlflow_run_holds_the_launch(run, rows, report, result.stdout, monkeypatch)
    assert_play_shows_the_final_players(run)

    # A finished run: --resume does nothing, and says so.
    evaluated_at = (run / "stages" / "eval.json").stat().st_mtime_ns
    result = reflectrl("--workers", "2", "--resume", str(run))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "finished earlier; nothing to do" in result.stdout
    assert "Ray dashboard" not in result.stdout and len(read_rows(run)) == 2
    assert (run / "stages" / "eval.json").stat().st_mtime_ns == evaluated_at
    # (`reflectrl eval --run` on a finished run: test_driver_kill.py.)


def without_timings(row: dict[str, Any]) -> dict[str, Any]:
    """A metrics row less its seconds (`iteration_s`, `env_steps_per_s`, ...)."""
    return {k: v for k, v in row.items() if not k.endswith("_s")}


def assert_the_twins_are_equal(a: Path, b: Path) -> None:
    """A seeded run repeats bitwise on one machine: the data, both SFT adapters, the RL
    adapter and value head, every non-timing metric and the eval JSON. (SFT alone, and what
    does not repeat across machines: tests/test_repeatability.py, docs/repeatability.md.)"""
    same = ["data/data.jsonl", "eval_test.json"]
    same += [f"sft/{player}/adapter_model.safetensors" for player in ("reflection", "policy")]
    checkpoint = Path("checkpoints") / (a / "checkpoints" / "latest").read_text().strip()
    assert (b / "checkpoints" / "latest").read_text().strip() == checkpoint.name
    same += [str(checkpoint / "adapter" / name) for name in ("adapter_model.safetensors",
                                                              "value_head.pt")]  # fmt: skip
    for name in same:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    rows_a, rows_b = read_rows(a), read_rows(b)
    assert [without_timings(r) for r in rows_a] == [without_timings(r) for r in rows_b]
    assert rows_a[-1]["reflection_calls"] > 0  # the reflections were the server's


def assert_play_shows_the_final_players(run: Path) -> None:
    """`reflectrl play` on the finished run: its final policy, reflections from its served SFT
    reflection, every step printed and the page written."""
    page = run / "play.html"
    played = run_cli("play", str(run), "--episodes", "2", "--html", str(page), timeout=600)
    assert played.returncode == 0, played.stderr[-3000:]
    out = played.stdout
    assert out.count("episode ") >= 2 and "episode 2/2: stage full, start " in out
    steps = out.count("\n  step ")
    assert steps >= 2 and out.count("\n    -> ") == out.count("\n    reflection: ") == steps
    assert out.count(", reward ") == steps and "played 2 episodes of stage full" in out
    assert "    | +---------+" in out
    assert (run / "play_reflection_server.log").stat().st_size > 0
    text = page.read_text()
    assert text.startswith("<!DOCTYPE html>") and text.count('"observation": ') == steps


def mlflow_history(run: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, str, Any]:
    """The run's MLflow client (its local store, RUN/mlruns), run id, and a function giving a
    metric's (step, value) points."""
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks for it

    run_id = json.loads((run / "trackers.json").read_text())["mlflow"]["run_id"]
    client = MlflowClient((run / "mlruns").resolve().as_uri())

    def history(key: str) -> list[tuple[int, float]]:
        return [(m.step, m.value) for m in client.get_metric_history(run_id, key)]

    return client, run_id, history


def assert_mlflow_run_holds_the_launch(
    run: Path,
    rows: list[dict[str, Any]],
    report: dict[str, Any],
    stdout: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One MLflow run, read back through MLflow's client, holds the SFT losses, every RL row,
    the final eval and the config."""
    client, run_id, history = mlflow_history(run, monkeypatch)
    tracked = client.get_run(run_id)
    assert tracked.info.status == "FINISHED"
    (only,) = client.search_runs([tracked.info.experiment_id])  # every stage in one run
    assert only.info.run_id == run_id
    for key in ("success_rate", "env_steps", "adapter_version", "reflection_calls"):
        assert sorted(history(f"rl/{key}")) == [(r["iteration"], r[key]) for r in rows], key
    assert history("rl/eval_success_rate") == [(2, rows[1]["eval_success_rate"])]
    for player in ("reflection", "policy"):
        done = json.loads((run / "sft" / player / "sft_result.json").read_text())
        for part in ("train", "eval"):
            assert sorted(history(f"sft/{player}/completion_loss_{part}")) == [
                (0, done["loss_before"][part]),
                (10, done["loss_after"][part]),
            ]
        ((step, loss),) = history(f"sft/{player}/loss")  # TRL's line at logging_steps=10
        assert step == 10 and f"sft {player}: step 10/10, loss {loss:.3f}" in stdout
    greedy, sampled = report["greedy"], report["sampled"]
    assert history("eval/test/greedy/all/success_rate") == [(2, greedy["all"]["success_rate"])]
    assert history("eval/test/sampled/stages/full/return_mean") == [
        (2, sampled["stages"]["full"]["return_mean"])
    ]
    params = tracked.data.params
    assert params["run.trackers"] == '["tensorboard", "mlflow"]' and params["ppo.lr"] == "0.001"
    assert params["env.name"] == "dangerous_taxi" and params["run.iterations"] == "2"
    logged = {a.path for a in client.list_artifacts(run_id)}
    assert logged == {"config.yaml", "eval_test.json"}


@pytest.fixture(scope="module")
def ray_session() -> Any:
    import ray

    ray.init(address="local", num_cpus=3, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_the_sft_task_uses_every_core(ray_session: Any) -> None:
    """Ray gives a num_cpus=1 task one torch thread (OMP_NUM_THREADS=1); the SFT stage's task
    takes the node's cores back."""
    import torch

    from reflectrl.pipeline import use_all_cores

    def threads(take_all: bool) -> int:
        return use_all_cores() if take_all else torch.get_num_threads()

    task = ray_session.remote(num_cpus=1)(threads)
    assert ray_session.get(task.remote(False)) == 1
    assert ray_session.get(task.remote(True)) == (os.cpu_count() or 1)


def test_weights_and_stage_reach_every_worker(
    ray_session: Any, tmp_path: Path, tokenizer: Any
) -> None:
    import torch
    from ray.rllib.core.columns import Columns

    from reflectrl.rl.driver import Run
    from reflectrl.rollout.vector_env import ReflectRLVectorEnv

    # Reflections during RL: the CLI pipeline test and test_reflection_faults.py.
    config = smoke_without_reflection("run.iterations=2")
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

        def learner_logits() -> torch.Tensor:
            (result,) = run.algo.learner_group.foreach_learner(
                lambda learner: learner.module["default_policy"].forward_inference(batch)
            )
            return result.get()[Columns.ACTION_DIST_INPUTS]

        before = learner_logits()
        run.train_iteration()
        learner = learner_logits()
        assert not torch.allclose(before, learner)  # the update changed the policy...
        group = run.algo.env_runner_group
        for worker_logits in group.foreach_env_runner(logits_on_runner, local_env_runner=False):
            np.testing.assert_allclose(worker_logits, learner.numpy(), atol=1e-6)  # ...everywhere

        # The smoke curriculum caps `pickup` at one iteration: every worker now plays dropoff.
        stages = group.foreach_env_runner(
            lambda runner: runner.env.unwrapped.stage, local_env_runner=False
        )
        assert stages == ["dropoff", "dropoff"]

        # A loaded machine, made deterministic: the reply to each worker's last weight sync
        # has not been seen yet. RLlib then drops the next sync to that worker (at most one
        # request in flight per worker and tag)...
        manager = group._worker_manager
        for actor_id in manager.actor_ids():
            manager._remote_actor_states[actor_id].increment_requests("set_state")
        assert manager.foreach_actor_async(lambda runner: None, tag="set_state") == 0
        before = learner
        row = run.train_iteration()
        assert row["stage"] == "dropoff"
        learner = learner_logits()
        assert not torch.allclose(before, learner)
        # ...and the iteration's weights reach every worker anyway (ReflectRLPPO.training_step).
        for worker_logits in group.foreach_env_runner(logits_on_runner, local_env_runner=False):
            np.testing.assert_allclose(worker_logits, learner.numpy(), atol=1e-6)
    finally:
        run.close()


def smoke_without_reflection(*overrides: str) -> Any:
    return load_config(SMOKE, ["reflection.enabled=false", *overrides])


def test_two_workers_sample_from_different_random_streams(ray_session: Any, tmp_path: Path) -> None:
    # RLlib seeds each worker's torch stream (seed + worker index) before building the module;
    # the module must not reseed it, or every worker's env i takes the same actions.
    from reflectrl.rl.driver import Run

    config = smoke_without_reflection("env.options.fixed_start_seed=7")  # same observations
    run = Run(config, tmp_path / "run", workers=2)
    try:
        run.start()

        def actions(runner: Any) -> list[list[int]]:
            episodes = runner.sample(num_timesteps=32, explore=True)
            return [e.get_actions().tolist() for e in episodes]

        first, second = run.algo.env_runner_group.foreach_env_runner(
            actions, local_env_runner=False
        )
    finally:
        run.close()
    assert first != second


def kill_once_sampling(run: Any, pid: int) -> None:
    """SIGKILL the rollout worker `pid` once the run's iteration has sampled its first steps."""
    import signal
    import time

    import ray

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        board = ray.get(run.monitor.progress_board.snapshot.remote())
        if board["phase"] == "sampling" and board["iteration_env_steps"] > 0:
            os.kill(pid, signal.SIGKILL)
            return
        time.sleep(0.02)


def test_a_worker_killed_mid_sampling_comes_back_with_the_stage_and_adapter(
    ray_session: Any, tmp_path: Path
) -> None:
    """SIGKILL a rollout worker while it samples: the iteration completes with the other
    worker's samples (at most the killed worker's share of one iteration is lost), RLlib
    restarts it, the row counts the restart, and the new worker plays the current stage with
    the learner's current weights."""
    import threading

    from reflectrl.rl.driver import Run

    # A restarted worker comes back with the env's default stage (`full`): `dropoff` must be
    # pushed to it again.
    stages = (
        "[{name: pickup, max_iterations: 1}, {name: dropoff, max_iterations: 50}, {name: full}]"
    )
    run = Run(smoke_without_reflection(f"curriculum.stages={stages}"), tmp_path / "run", workers=2)
    try:
        run.start()
        run.train_iteration()  # `pickup` is capped at 1 iteration
        group = run.algo.env_runner_group
        (pid,) = group.foreach_env_runner(
            lambda runner: os.getpid(), local_env_runner=False, remote_worker_ids=[1]
        )

        killer = threading.Thread(target=kill_once_sampling, args=(run, pid))
        killer.start()
        rows = [run.train_iteration()]
        killer.join()
        while rows[-1]["restarted_workers"] == 0 and len(rows) < 10:  # Ray restarts it meanwhile
            rows.append(run.train_iteration())
        rows.append(run.train_iteration())  # a whole iteration with the restarted worker
        stages = group.foreach_env_runner(
            lambda runner: runner.env.unwrapped.stage, local_env_runner=False
        )
        pids = group.foreach_env_runner(lambda runner: os.getpid(), local_env_runner=False)
        weights = group.foreach_env_runner(
            lambda runner: runner.module.get_state(), local_env_runner=False
        )
        learner = run.algo.module_state()
    finally:
        run.close()
    assert rows[0]["env_steps"] - 64 >= 32  # the other worker's samples of that iteration
    assert rows[-2]["restarted_workers"] >= 1 and pid not in pids and len(pids) == 2
    assert stages == ["dropoff", "dropoff"]  # re-applied to the restarted worker
    # Both workers sample again: 2 x 32 env steps. RLlib's EnvRunner.sample(num_timesteps=32)
    # stops at the first vector step that reaches 32 live steps, so an env that autoresets at
    # an odd count adds one more (single_agent_env_runner.py: between num_timesteps and
    # num_timesteps + num_envs_per_env_runner - 1); after a kill, episodes end when they may.
    assert 64 <= rows[-1]["env_steps"] - rows[-2]["env_steps"] <= 64 + 2 * (2 - 1)
    for state in weights:  # the restarted worker got the learner's current adapter
        assert state.keys() == learner.keys()
        for key in learner:
            np.testing.assert_array_equal(state[key], learner[key], err_msg=key)


def test_when_the_only_worker_dies_the_run_waits_for_it_instead_of_sampling_nothing(
    ray_session: Any, tmp_path: Path
) -> None:
    """SIGKILL the only rollout worker while it samples: that iteration samples nothing and is
    not counted toward the stage's cap; the next one waits for Ray's restart and samples a
    whole batch. (Before, every iteration until the restart sampled nothing and counted toward
    the stage's cap: on a loaded machine a run of 20 iterations ended "done" with 0 env steps.)
    """
    import threading

    from reflectrl.rl.driver import Run

    stages = "[{name: pickup, max_iterations: 1}, {name: dropoff, max_iterations: 2}, {name: full}]"
    run = Run(smoke_without_reflection(f"curriculum.stages={stages}"), tmp_path / "run", workers=1)
    try:
        run.start()
        first = run.train_iteration()  # `pickup` is capped at 1 iteration
        group = run.algo.env_runner_group
        (pid,) = group.foreach_env_runner(lambda runner: os.getpid(), local_env_runner=False)

        killer = threading.Thread(target=kill_once_sampling, args=(run, pid))
        killer.start()
        killed = run.train_iteration()
        killer.join()
        after = run.train_iteration()
        pids = group.foreach_env_runner(lambda runner: os.getpid(), local_env_runner=False)
    finally:
        run.close()
    assert killed["env_steps"] == first["env_steps"] and not killed["updated"]
    assert killed["stage"] == killed["next_stage"] == "dropoff"
    assert after["env_steps"] - killed["env_steps"] >= 32 and after["updated"]
    assert after["restarted_workers"] == 1 and pid not in pids
    # The empty iteration did not count: `dropoff` has played 1 of its 2 iterations.
    assert after["stage"] == after["next_stage"] == "dropoff"


def test_resume_restores_optimizer_env_streams_and_metrics(
    ray_session: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crash after iteration 2 whose checkpoint is iteration 1: the resumed run continues from
    iteration 1 with the optimizer's moments in the live learner, every worker's env random
    streams as checkpointed (no replay of iteration 1's start states), and metrics.jsonl cut
    back to iteration 1 (no duplicate rows)."""
    from reflectrl.rl.driver import Run
    from reflectrl.run_dir import LaunchOptions, resolve_run

    run_dir = tmp_path / "run"
    config = smoke_without_reflection(
        "run.checkpoint_every=1", "run.iterations=3", "run.trackers=[mlflow]"
    )
    run = Run(config, run_dir, workers=2)
    try:
        run.start()
        run.train_iteration()
        run.train_iteration()
    finally:
        run.close()
    (run_dir / "checkpoints" / "latest").write_text("iter_000001")  # iteration 2 "was lost"
    checkpoint = run_dir / "checkpoints" / "iter_000001"
    saved = json.loads((checkpoint / "reflectrl_state.json").read_text())
    with (checkpoint / "rllib" / "learner_group" / "learner" / "state.pkl").open("rb") as f:
        saved_optimizer = pickle.load(f)["optimizer"]
    assert [r["iteration"] for r in read_rows(run_dir)] == [1, 2]
    first_run_id = json.loads((run_dir / "trackers.json").read_text())["mlflow"]["run_id"]

    config, _, resume_from = resolve_run(LaunchOptions(workers=2, resume=str(run_dir)))
    resumed = Run(config, run_dir, workers=2)
    try:
        resumed.start(resume_from)
        assert resumed.iteration == 1 and resumed.env_steps == saved["totals"]["env_steps"]
        assert [r["iteration"] for r in read_rows(run_dir)] == [1]
        live = resumed.algo.learner_group.get_state(components="learner/optimizer")
        live_optimizer = live["learner"]["optimizer"]
        name = "default_policy_default_optimizer"
        moments = saved_optimizer[name]["state"]["state"]
        assert moments and live_optimizer[name]["state"]["state"].keys() == moments.keys()
        for key, tensors in moments.items():
            for part in ("exp_avg", "exp_avg_sq"):
                np.testing.assert_array_equal(
                    np.asarray(live_optimizer[name]["state"]["state"][key][part]),
                    np.asarray(tensors[part]),
                )
        states = resumed.algo.env_runner_group.foreach_env_runner(
            lambda runner: runner.env.unwrapped.random_state(), local_env_runner=False
        )
        assert [s["worker_index"] for s in states] == [1, 2]
        for state in states:
            assert state == saved["random_states"][str(state["worker_index"])]
        row = resumed.train_iteration()
    finally:
        resumed.close()
    assert row["iteration"] == 2 and row["env_steps"] > saved["totals"]["env_steps"]
    assert [r["iteration"] for r in read_rows(run_dir)] == [1, 2]
    # The resumed run continues the same MLflow run, which keeps the repeated iteration's first
    # figures too (MLflow cannot drop points); no TensorBoard: run.trackers does not name it.
    client, run_id, history = mlflow_history(run_dir, monkeypatch)
    assert run_id == first_run_id
    assert len(client.search_runs([client.get_run(run_id).info.experiment_id])) == 1
    steps = history("rl/env_steps")
    assert [step for step, _ in steps] == [1, 2, 2] and steps[-1] == (2, row["env_steps"])
    assert not (run_dir / "tensorboard").exists()


def test_close_does_not_mask_the_error_when_the_reflection_actor_is_dead(
    ray_session: Any, tmp_path: Path
) -> None:
    import ray

    from reflectrl.rl.driver import Run

    @ray.remote
    class Stoppable:
        def stop(self) -> None:
            return None

    run = Run(smoke_without_reflection(), tmp_path / "run", workers=1)
    run.servers.actors = [Stoppable.remote()]
    ray.kill(run.servers.actors[0])
    run.close()  # no RayActorError: the run's own error (if any) stays the one reported
    assert run.servers.actors == []


def test_a_server_that_fails_every_request_stops_the_run_with_one_line(
    server: Any, tmp_path: Path
) -> None:
    # It answers health checks (GET /models) but every completion is an HTTP 500: each
    # restarted worker fails again; the run must stop, not restart workers forever.
    server.plan = [500] * 10_000
    run = tmp_path / "run"
    result = reflectrl(
        "--workers", "1", "--config", str(SMOKE), "--iterations", "20", "--output", str(run),
        "--set", "reflection.server=url", "--set", f"reflection.url={server.url}",
        "--set", f"reflection.served_model_name={REFLECTOR}", "--set", "reflection.max_retries=0",
        "--set", "run.max_failed_iterations=2", "--set", "run.worker_restart_delay_s=1",
        "--set", "sft.enabled=false", "--set", "eval.enabled=false",  # straight to RL
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("reflectrl: error")]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "failed in 2 iterations" in errors[0] and "HTTP 500" in errors[0], errors[0]
    assert "ReflectionServerError" in errors[0]  # the worker's own error, not "exit code 1"
    assert len(server.completions) <= 10  # bounded: a few iterations, not an endless loop
