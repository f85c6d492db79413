"""The text-environment convention shared by every env of the project.

A text env is a gymnasium env whose observation is a `TextObservation` (task instruction,
observation text, and the currently valid actions) and whose action is an index into
`observation.actions`. Everything about models, prompts, tokens and Ray lives elsewhere.

Ends of episodes (they decide what GAE does with the last state):
- `terminated`: the episode is over in the MDP the agent sees; the value after it is 0.
  Use it for goals, failures, and step limits the observation shows (steps left).
- `truncated`: the episode was cut for a reason the observation does not show (a hidden
  time limit); GAE bootstraps from the value of the last observation.
Each env's docstring says which it uses where, and why.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np


@dataclass(frozen=True)
class TextObservation:
    """What an agent sees at one step, before any prompt formatting."""

    instruction: str  # the task header; prompts never truncate it away
    observation: str  # the state as text, without the action menu
    actions: tuple[str, ...]  # the valid actions now, in the env's canonical order

    def digest(self) -> str:
        """A short fingerprint of the observation text: equal texts, equal digests (SFT data
        rows and eval episodes carry it, to tell states the SFT data showed from new ones)."""
        return hashlib.blake2b(self.observation.encode(), digest_size=8).hexdigest()


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
    `reset` must call `self._begin_episode()` so `episode_stage` names the stage the episode
    is played in, whatever `set_stage` does while it runs.
    """

    stages: ClassVar[tuple[str, ...]] = ("default",)
    # The value of the env's `split` option that evaluation holds out (never in SFT data or RL).
    held_out_split: ClassVar[str] = "test"
    # Options evaluation plays with whatever training set (e.g. AutoExplore shows every entry:
    # its training view hides off-path ones, which only the task's answer can tell).
    held_out_options: ClassVar[dict[str, Any]] = {}
    max_actions: int  # the largest menu this env can show (K of the policy's action space)

    def __init__(self) -> None:
        self._stage = self.stages[-1]
        self._episode_stage = self._stage
        self._review: tuple[str, ...] = ()
        self._review_share = 0.0

    @property
    def stage(self) -> str:
        """The stage the next episode will be played in."""
        return self._stage

    @property
    def episode_stage(self) -> str:
        """The stage of the running (or last) episode; `set_stage` applies from the next reset."""
        return self._episode_stage

    @property
    def episode_kind(self) -> str:
        """The kind of task the running episode plays, for per-kind results (ALFWorld: its task
        type; AutoExplore: the target's depth); "" where an env has one kind."""
        return ""

    def set_stage(self, stage: str, review: Sequence[str] = (), review_share: float = 0.0) -> None:
        """Switch the curriculum stage; takes effect at the next reset. With `review`, that
        share of the episodes replays one of those (earlier) stages, drawn uniformly, so what
        they taught is not forgotten."""
        unknown = [s for s in (stage, *review) if s not in self.stages]
        if unknown:
            raise ValueError(f"unknown stage {unknown[0]!r}; valid: {', '.join(self.stages)}")
        if not 0.0 <= review_share < 1.0:
            raise ValueError(f"review_share {review_share} is not in [0, 1)")
        self._stage = stage
        self._review = tuple(review) if review_share > 0 else ()
        self._review_share = review_share

    def _begin_episode(self) -> None:
        self._episode_stage = self._stage
        # Drawn only when reviewing: without it the env's random stream is what it always was.
        rng = self._episode_random()
        if self._review and rng.random() < self._review_share:
            self._episode_stage = self._review[int(rng.integers(len(self._review)))]

    def _episode_random(self) -> np.random.Generator:
        """The seeded stream that episode choices (start, stage) are drawn from."""
        return self.np_random

    @abstractmethod
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[TextObservation, dict[str, Any]]: ...

    @abstractmethod
    def step(self, action: int) -> tuple[TextObservation, float, bool, bool, dict[str, Any]]: ...

    def start_ids(self, stage: str) -> list[str] | None:
        """Every distinct start of this env's split in `stage`, as ids that
        `reset(options={"start": id})` plays; None where the starts cannot be listed (held-out
        evaluation then draws them). Evaluation plays each listed start exactly once."""
        return None

    def shorter_observation(self, level: int) -> TextObservation | None:
        """The current observation with its history and outputs trimmed `level` (>= 1) steps;
        None when it cannot get shorter.

        Prompts must fit a token budget; the env knows which parts of its text are old
        (command history, long outputs) and which are the current state, which is never
        trimmed. Envs whose observations are always short keep this default.
        """
        return None

    # --- random streams: checkpointed with the run so a resume does not replay starts ------

    def _random_owners(self) -> list[gym.Env]:
        """Every gymnasium env object whose `np_random` this env draws from."""
        return [self]

    def random_state(self) -> list[dict[str, Any] | None]:
        """The state of each random stream (JSON-serialisable); None for an unused stream."""
        states: list[dict[str, Any] | None] = []
        for owner in self._random_owners():
            generator = owner._np_random  # None until the first seeded reset
            states.append(None if generator is None else dict(generator.bit_generator.state))
        return states

    def set_random_state(self, states: list[dict[str, Any] | None]) -> None:
        owners = self._random_owners()
        if len(states) != len(owners):
            raise ValueError(f"random state has {len(states)} streams, env has {len(owners)}")
        for owner, state in zip(owners, states, strict=True):
            if state is None:
                continue
            bit_generator = getattr(np.random, state["bit_generator"])()
            bit_generator.state = state
            owner.np_random = np.random.Generator(bit_generator)
