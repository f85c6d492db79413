"""Per env, what the SFT data writer needs from an expert that reads the true state.

- `expert(env)`: the expert's action (index into the current menu);
- `mistake(env, rng)`: a wrong but valid action that does not end the episode (a negative
  example; the expert recovers from the state it leads to), or None;
- `snapshot(env)` before an action and `describe(before, action, env)` after it: what the
  action did, in a few words, from the true state (a fact for the reflection writer);
- `situation(env)`: the task as it stands at the first step;
- `task_id(env)`: what identifies the episode's task (a start state, a file, a game), so tests
  can check that nothing held out is in the data.
Demonstrators read envs; they know nothing of models, prompts or Ray.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from reflectrl.errors import ConfigError


class Demonstrator(ABC):
    train_split: str = "train"  # the env's split SFT data is drawn from (held-out ones never)

    @abstractmethod
    def expert(self, env: Any) -> int: ...

    @abstractmethod
    def mistake(self, env: Any, rng: np.random.Generator) -> int | None: ...

    @abstractmethod
    def describe(self, before: Any, action: str, env: Any) -> str: ...

    @abstractmethod
    def situation(self, env: Any) -> str: ...

    @abstractmethod
    def task_id(self, env: Any) -> str: ...

    def snapshot(self, env: Any) -> Any:
        return None


_MODULES = {
    "dangerous_taxi": "reflectrl.data.taxi",
    "auto_explore": "reflectrl.data.auto_explore",
    "alfworld": "reflectrl.data.alfworld",
}


def demonstrator_for(env_name: str, expert: str = "observable") -> Demonstrator:
    """The env's `data.expert`: `observable` decides from what the agent sees (plus statistics
    of the training split); `oracle` reads hidden state (a named variant)."""
    if env_name not in _MODULES:
        raise ConfigError(
            f"env.name {env_name!r} has no expert for SFT data; envs with one: "
            + ", ".join(_MODULES)
        )
    experts: dict[str, Demonstrator] = importlib.import_module(_MODULES[env_name]).DEMONSTRATORS
    if expert not in experts:
        raise ConfigError(
            f"data.expert={expert!r}: env {env_name!r} has no such expert; it has "
            + ", ".join(sorted(experts))
            + " (set data.expert to one of them)"
        )
    return experts[expert]


def mistake_among(candidates: list[int], rng: np.random.Generator) -> int | None:
    return candidates[int(rng.integers(len(candidates)))] if candidates else None
