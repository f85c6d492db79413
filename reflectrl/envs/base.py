"""The text-environment convention shared by every env of the project.

A text env is a gymnasium env whose observation is a `TextObservation` (task instruction,
observation text, and the currently valid actions) and whose action is an index into
`observation.actions`. Everything about models, prompts, tokens and Ray lives elsewhere.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import gymnasium as gym


@dataclass(frozen=True)
class TextObservation:
    """What an agent sees at one step, before any prompt formatting."""

    instruction: str  # the task header; prompts never truncate it away
    observation: str  # the state as text, without the action menu
    actions: tuple[str, ...]  # the valid actions now, in the env's canonical order


@dataclass
class StepInfo:
    """Fields every env puts in `info` (as a dict, via `as_dict`)."""

    success: bool = False
    valid_actions: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"success": self.success, "valid_actions": self.valid_actions, **self.extra}


class TextEnv(gym.Env, ABC):
    """Base class: subclasses define `stages`, `max_actions` and the three methods below.

    `reset` returns `(TextObservation, info)`; `step(index)` returns
    `(TextObservation, reward, terminated, truncated, info)`; `info` always holds
    `success` (bool) and `valid_actions` (the actions of the returned observation).
    """

    stages: ClassVar[tuple[str, ...]] = ("default",)
    max_actions: int  # the largest menu this env can show (K of the policy's action space)

    def __init__(self) -> None:
        self._stage = self.stages[-1]

    @property
    def stage(self) -> str:
        return self._stage

    def set_stage(self, stage: str) -> None:
        """Switch the curriculum stage; takes effect at the next reset."""
        if stage not in self.stages:
            raise ValueError(f"unknown stage {stage!r}; valid: {', '.join(self.stages)}")
        self._stage = stage

    @abstractmethod
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[TextObservation, dict[str, Any]]: ...

    @abstractmethod
    def step(self, action: int) -> tuple[TextObservation, float, bool, bool, dict[str, Any]]: ...
