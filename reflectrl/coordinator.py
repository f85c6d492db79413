"""The coordinator: aggregate episode outcomes across all rollout workers and move every worker
to the next curriculum stage when the success rate over the last window passes its bar.

`Curriculum` is the decision (pure Python, tested alone); `CoordinatorCallback` is the thin
RLlib hook that feeds it each iteration, pushes the stage to every EnvRunner, and re-applies it
to EnvRunners that RLlib restarted (they come back with the original env config).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from typing import Any

from ray.rllib.callbacks.callbacks import RLlibCallback

from reflectrl.config import CurriculumConfig, StageConfig
from reflectrl.errors import ConfigError

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
        self.min_episodes = config.min_episodes
        self.index = 0
        self.iterations_in_stage = 0
        self.recent: deque[bool] = deque(maxlen=self.window)
        self.episodes_in_stage = 0

    @property
    def stage(self) -> str:
        return self.stages[self.index].name

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


def _set_stage(runner: Any, stage: str) -> str:
    runner.env.unwrapped.set_stage(stage)
    return runner.env.unwrapped.stage


def _pop_stats(runner: Any) -> dict[str, Any]:
    return runner.env.unwrapped.pop_stats()


class CoordinatorCallback(RLlibCallback):
    """Lives in the driver. `curriculum` is attached by the launcher before training starts."""

    def __init__(self) -> None:
        super().__init__()
        self.curriculum: Curriculum | None = None
        self.restarted_workers = 0
        self.reflection_calls: dict[int, int] = {}

    def push_stage(self, env_runner_group: Any, worker_ids: list[int] | None = None) -> list[str]:
        assert self.curriculum is not None
        stage = self.curriculum.stage
        return env_runner_group.foreach_env_runner(
            lambda runner: _set_stage(runner, stage),
            local_env_runner=False,
            remote_worker_ids=worker_ids,
        )

    def on_train_result(self, *, algorithm: Any, result: dict, **kwargs: Any) -> None:
        if self.curriculum is None:
            return
        per_worker = algorithm.env_runner_group.foreach_env_runner(
            _pop_stats, local_env_runner=False
        )
        episodes = [e for stats in per_worker for e in stats["episodes"]]
        stage_played = self.curriculum.stage
        self.curriculum.observe(episodes)
        success_rate = self.curriculum.success_rate
        new_stage = self.curriculum.end_iteration()
        if new_stage is not None:
            logger.info("curriculum: %s -> %s", stage_played, new_stage)
            self.push_stage(algorithm.env_runner_group)
        result["reflectrl"] = {
            "episodes": len(episodes),
            "env_steps": sum(stats["env_steps"] for stats in per_worker),
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
            "reflection_calls": sum(stats["reflection_calls"] for stats in per_worker),
            "truncated_prompts": sum(stats["truncated_prompts"] for stats in per_worker),
            "restarted_workers": self.restarted_workers,
        }

    def on_env_runners_recreated(
        self, *, algorithm: Any, env_runner_group: Any, env_runner_indices: list[int], **kw: Any
    ) -> None:
        # A restart hides a crash: count it so the progress line and metrics show it.
        self.restarted_workers += len(env_runner_indices)
        logger.warning("rollout workers %s were restarted after a failure", env_runner_indices)
        if self.curriculum is not None and not kw.get("is_evaluation", False):
            self.push_stage(env_runner_group, env_runner_indices)
