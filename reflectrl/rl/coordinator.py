"""The coordinator: aggregate episode outcomes across all rollout workers and move every worker
to the next curriculum stage when the success rate over the last window passes its bar.

`Curriculum` (rl/curriculum.py) is the decision; `CoordinatorCallback` is the thin RLlib hook
that feeds it each iteration, pushes the stage to every EnvRunner, and re-applies it
to EnvRunners that RLlib restarted (they come back with the original env config).

Workers report per-iteration counts (env steps, reflections, ...) and the coordinator keeps the
run's totals, so a restarted worker (its counts back at 0) never makes a total go backwards.
It also keeps each worker's latest env random state: checkpoints save it, and a restarted or
resumed worker continues its streams instead of replaying its first start states.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypedDict

from ray.rllib.callbacks.callbacks import RLlibCallback

from reflectrl.rl.curriculum import Curriculum
from reflectrl.rollout.seams import WORKER_COUNTERS as COUNTERS
from reflectrl.rollout.seams import EpisodeRecord, WorkerCounts, WorkerStats, zero_counts

logger = logging.getLogger(__name__)


class CoordinatorReport(TypedDict):
    """What the coordinator adds to RLlib's result of an iteration, as `result["reflectrl"]`."""

    episodes: int  # finished in this iteration, on every worker
    # Played in a stage already passed: `curriculum.review`, or begun before a switch.
    earlier_stage_episodes: int
    iteration_counts: WorkerCounts  # summed over workers
    totals: WorkerCounts  # the run's
    success_rate: float  # over the curriculum's window
    episode_return_mean: float | None
    episode_len_mean: float | None
    # How this iteration's episodes ended besides success: failure (terminated without
    # success; Taxi: a dangerous no-op, the reward's "end at once" exit) and the step limit.
    failure_share: float | None
    step_limit_share: float | None
    stage: str  # played in this iteration
    next_stage: str
    worker_stages: list[str]
    restarted_workers: int  # the run's


def _set_stage(
    runner: Any,
    stage: str,
    review: tuple[str, ...],
    review_share: float,
    random_state: dict[str, Any] | None,
) -> str:
    env = runner.env.unwrapped
    env.set_stage(stage, review, review_share)
    if random_state is not None:
        env.set_random_state(random_state)
    return env.stage


def _pop_stats(runner: Any) -> WorkerStats:
    return runner.env.unwrapped.pop_stats()


class CoordinatorCallback(RLlibCallback):
    """The coordinator lives in the driver (`curriculum` is attached by the launcher before
    training starts); in rollout workers the same class only seeds each new vector env."""

    def __init__(self) -> None:
        super().__init__()
        self.curriculum: Curriculum | None = None
        self.restarted_workers = 0
        self.totals = zero_counts()
        self.random_states: dict[int, dict[str, Any]] = {}  # worker index -> env random state

    def push_stage(
        self,
        env_runner_group: Any,
        worker_ids: list[int] | None = None,
        with_random_state: bool = False,
    ) -> list[str]:
        """Send the stage (and, for restored or restarted workers, their last random state)."""
        assert self.curriculum is not None
        stage = self.curriculum.stage
        ids = worker_ids if worker_ids is not None else env_runner_group.healthy_worker_ids()
        if not ids:  # (RLlib reads an empty id list as "every worker")
            return []
        calls = [
            functools.partial(
                _set_stage,
                stage=stage,
                review=self.curriculum.review_stages,
                review_share=self.curriculum.review_share,
                random_state=self.random_states.get(worker_id) if with_random_state else None,
            )
            for worker_id in ids
        ]
        # One call per worker, all in flight at once (RLlib pairs the lists by position).
        return env_runner_group.foreach_env_runner(
            calls, local_env_runner=False, remote_worker_ids=ids
        )

    def on_environment_created(self, *, env_runner: Any, env: Any, **kwargs: Any) -> None:
        # Runs in each rollout worker: RLlib's vector entry point loses the worker index, so
        # the env is told here, before its first reset, to seed its streams for this worker.
        if hasattr(env, "set_worker_index"):
            env.set_worker_index(int(env_runner.worker_index))

    def on_train_result(self, *, algorithm: Any, result: dict, **kwargs: Any) -> None:
        if self.curriculum is None:
            return
        # Overlapped sampling (ppo.max_staleness=1) brings the stats with the batch.
        per_worker = getattr(algorithm, "sampled_stats", None)
        if per_worker is None:
            per_worker = algorithm.env_runner_group.foreach_env_runner(
                _pop_stats, local_env_runner=False
            )
        episodes = [e for stats in per_worker for e in stats["episodes"]]
        for stats in per_worker:
            self.random_states[int(stats["worker_index"])] = stats["random_state"]
        iteration = zero_counts()
        for key in COUNTERS:
            iteration[key] = sum(int(stats[key]) for stats in per_worker)
            self.totals[key] += iteration[key]
        stage_played = self.curriculum.stage
        passed = self.curriculum.review_stages
        new_stage = None
        success_rate = self.curriculum.success_rate
        if iteration["env_steps"]:  # an iteration whose workers all crashed is not the stage's
            self.curriculum.observe(episodes)
            # The stage played: read before a stage switch clears the window.
            success_rate = self.curriculum.success_rate
            new_stage = self.curriculum.end_iteration()
        if new_stage is not None:
            logger.info("curriculum: %s -> %s", stage_played, new_stage)
            self.push_stage(algorithm.env_runner_group)
        result["reflectrl"] = CoordinatorReport(
            episodes=len(episodes),
            earlier_stage_episodes=sum(e["stage"] in passed for e in episodes),
            iteration_counts=iteration,
            totals=WorkerCounts(**self.totals),
            success_rate=success_rate,
            episode_return_mean=(
                sum(e["episode_return"] for e in episodes) / len(episodes) if episodes else None
            ),
            episode_len_mean=(
                sum(e["length"] for e in episodes) / len(episodes) if episodes else None
            ),
            failure_share=_share(episodes, lambda e: not e["success"] and not e["step_limit"]),
            step_limit_share=_share(episodes, lambda e: e["step_limit"]),
            stage=stage_played,
            next_stage=self.curriculum.stage,
            worker_stages=[stats["stage"] for stats in per_worker],
            restarted_workers=self.restarted_workers,
        )

    def on_env_runners_recreated(
        self, *, algorithm: Any, env_runner_group: Any, env_runner_indices: list[int], **kw: Any
    ) -> None:
        # A restart hides a crash: count it so the progress line and metrics show it.
        self.restarted_workers += len(env_runner_indices)
        logger.warning("rollout workers %s were restarted after a failure", env_runner_indices)
        if self.curriculum is not None and not kw.get("is_evaluation", False):
            self.push_stage(env_runner_group, env_runner_indices, with_random_state=True)

    def state_dict(self) -> dict[str, Any]:
        assert self.curriculum is not None
        return {
            "curriculum": self.curriculum.state_dict(),
            "totals": dict(self.totals),
            "restarted_workers": self.restarted_workers,
            "random_states": {str(k): v for k, v in self.random_states.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        assert self.curriculum is not None
        self.curriculum.load_state_dict(state["curriculum"])
        self.totals = zero_counts()
        for key in COUNTERS:
            self.totals[key] = int(state.get("totals", {}).get(key, 0))
        self.restarted_workers = int(state.get("restarted_workers", 0))
        self.random_states = {int(k): v for k, v in state.get("random_states", {}).items()}


def _share(episodes: list[EpisodeRecord], ended: Callable[[EpisodeRecord], bool]) -> float | None:
    return sum(map(ended, episodes)) / len(episodes) if episodes else None


def coordinator_of(callbacks: Any) -> CoordinatorCallback:
    """The coordinator among an algorithm's callbacks (`algo.callbacks`)."""
    for callback in callbacks if isinstance(callbacks, list) else [callbacks]:
        if isinstance(callback, CoordinatorCallback):
            return callback
    raise RuntimeError("the coordinator callback is missing from the algorithm")
