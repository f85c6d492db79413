"""What crosses a rollout worker's vector env: the episodes it reports, the reflections it asks
for."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EpisodeRecord:
    """One finished episode, as the coordinator aggregates them across workers."""

    stage: str  # the stage the episode was played in (not the env's stage when it ended)
    success: bool
    episode_return: float
    length: int
    env_index: int = 0  # which of the worker's envs played it
    kind: str = ""  # the env's `episode_kind` (ALFWorld: the task type)
    start: str = ""  # the listed start it played (`set_starts`); "" for a drawn one
    # Digests of the observations it acted on (`record_observations`; held-out eval only).
    observed: tuple[str, ...] = ()


class Reflector:
    """What the vector env needs from a reflection source: many prompts in, as many texts out.
    `seed` (for sampled reflections) is set per rollout worker by the vector env."""

    seed: int | None

    def reflect(self, prompts: list[str]) -> list[str]:  # pragma: no cover - protocol
        raise NotImplementedError
