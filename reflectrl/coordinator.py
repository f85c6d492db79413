"""The coordinator: aggregate episode outcomes across all rollout workers and move every worker
to the next curriculum stage when the success rate over the last window passes its bar.

`Curriculum` is the decision (pure Python, tested alone); `CoordinatorCallback` is the thin
RLlib hook that feeds it each iteration, pushes the stage to every EnvRunner, and re-applies it
to EnvRunners that RLlib restarted (they come back with the original env config).

Workers report per-iteration counts (env steps, reflections, ...) and the coordinator keeps the
run's totals, so a restarted worker (its counts back at 0) never makes a total go backwards.
It also keeps each worker's latest env random state: checkpoints save it, and a restarted or
resumed worker continues its streams instead of replaying its first start states.
"""

from __future__ import annotations

import functools
import logging
from collections import deque
from collections.abc import Sequence
from typing import Any

from ray.rllib.callbacks.callbacks import RLlibCallback

from reflectrl.config import CurriculumConfig, StageConfig
from reflectrl.errors import ConfigError
from reflectrl.metrics import WORKER_COUNTERS as COUNTERS

logger = logging.getLogger(__name__)


class Curriculum:
    def __init__(self, config: CurriculumConfig, env_stages: Sequence[str]) -> None:
        self.enabled = config.enabled
        stages = config.stages or [StageConfig(name=s) for s in env_stages]
        unknown = [s.name for s in stages if s.name not in env_stages]
        if unknown:
            raise ConfigError(
                f"curriculum.stages: unknown stage {unknown[0]!r}; valid: {', '.join(env_stages)}"
            )
        # Without a curriculum the agent trains on the last (full) stage only.
        self.stages = stages if self.enabled else [stages[-1]]
        self.window = config.window
        self.review_share = config.review
        self.min_episodes = config.min_episodes
        self.index = 0
        self.iterations_in_stage = 0
        self.recent: deque[bool] = deque(maxlen=self.window)
        self.episodes_in_stage = 0

    @property
    def stage(self) -> str:
        return self.stages[self.index].name

    @property
    def review_stages(self) -> tuple[str, ...]:
        """The stages already passed, which `review_share` of the episodes replay."""
        return tuple(s.name for s in self.stages[: self.index])

    @property
    def success_rate(self) -> float:
        return sum(self.recent) / len(self.recent) if self.recent else 0.0

    def observe(self, episodes: list[dict[str, Any]]) -> None:
        """Finished episodes from any worker; only those played in the current stage count."""
        for episode in episodes:
            if episode["stage"] == self.stage:
                self.recent.append(bool(episode["success"]))
                self.episodes_in_stage += 1

    def end_iteration(self) -> str | None:
        """Advance if the bar is passed (or the stage's iteration cap is hit); new stage or None."""
        self.iterations_in_stage += 1
        if self.index + 1 >= len(self.stages):
            return None
        spec = self.stages[self.index]
        passed = (
            self.episodes_in_stage >= self.min_episodes
            and len(self.recent) >= min(self.window, self.min_episodes)
            and self.success_rate >= spec.success_threshold
        )
        capped = spec.max_iterations is not None and self.iterations_in_stage >= spec.max_iterations
        if not (passed or capped):
            return None
        self.index += 1
        self.iterations_in_stage = 0
        self.episodes_in_stage = 0
        self.recent.clear()
        return self.stage

    def state_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "stage": self.stage,
            "iterations_in_stage": self.iterations_in_stage,
            "episodes_in_stage": self.episodes_in_stage,
            "recent": list(self.recent),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        names = [s.name for s in self.stages]
        if state["stage"] not in names:
            raise ValueError(f"checkpointed stage {state['stage']!r} is not in {names}")
        self.index = names.index(state["stage"])
        self.iterations_in_stage = int(state["iterations_in_stage"])
        self.episodes_in_stage = int(state["episodes_in_stage"])
        self.recent = deque((bool(x) for x in state["recent"]), maxlen=self.window)


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


def _pop_stats(runner: Any) -> dict[str, Any]:
    return runner.env.unwrapped.pop_stats()


class CoordinatorCallback(RLlibCallback):
    """The coordinator lives in the driver (`curriculum` is attached by the launcher before
    training starts); in rollout workers the same class only seeds each new vector env."""

    def __init__(self) -> None:
        super().__init__()
        self.curriculum: Curriculum | None = None
        self.restarted_workers = 0
        self.totals = dict.fromkeys(COUNTERS, 0)
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
        iteration = {key: sum(int(stats[key]) for stats in per_worker) for key in COUNTERS}
        for key, value in iteration.items():
            self.totals[key] += value
        stage_played = self.curriculum.stage
        passed = self.curriculum.review_stages
        self.curriculum.observe(episodes)
        success_rate = self.curriculum.success_rate
        new_stage = self.curriculum.end_iteration()
        if new_stage is not None:
            logger.info("curriculum: %s -> %s", stage_played, new_stage)
            self.push_stage(algorithm.env_runner_group)
        result["reflectrl"] = {
            "episodes": len(episodes),
            # Played in a stage already passed: `curriculum.review`, or begun before a switch.
            "earlier_stage_episodes": sum(e["stage"] in passed for e in episodes),
            "iteration_counts": iteration,
            "totals": dict(self.totals),
            "success_rate": success_rate,
            "episode_return_mean": (
                sum(e["episode_return"] for e in episodes) / len(episodes) if episodes else None
            ),
            "episode_len_mean": (
                sum(e["length"] for e in episodes) / len(episodes) if episodes else None
            ),
            "stage": stage_played,
            "next_stage": self.curriculum.stage,
            "worker_stages": [stats["stage"] for stats in per_worker],
            "restarted_workers": self.restarted_workers,
        }

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
        self.totals = {key: int(state.get("totals", {}).get(key, 0)) for key in COUNTERS}
        self.restarted_workers = int(state.get("restarted_workers", 0))
        self.random_states = {int(k): v for k, v in state.get("random_states", {}).items()}
