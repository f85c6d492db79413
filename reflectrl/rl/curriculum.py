"""The curriculum: the success rate over the last window of finished episodes (from every
rollout worker) decides when all workers move to the next stage. Pure Python; the RLlib hook
that feeds it is `rl/coordinator.py`."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

from reflectrl.config import CurriculumConfig
from reflectrl.rollout.seams import EpisodeRecord


class Curriculum:
    def __init__(self, config: CurriculumConfig, env_stages: Sequence[str]) -> None:
        self.enabled = config.enabled
        stages = config.stages_of(env_stages)
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

    def observe(self, episodes: list[EpisodeRecord]) -> None:
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
