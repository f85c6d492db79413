"""What crosses a rollout worker's vector env: the stats and episodes it reports (to the
coordinator in RL, to the eval report in eval), and the reflections it asks for."""

from __future__ import annotations

from typing import Any, NamedTuple, TypedDict


class EpisodeRecord(TypedDict):
    """One finished episode, as the coordinator and the eval report aggregate them."""

    stage: str  # the stage the episode was played in (not the env's stage when it ended)
    success: bool
    # Ended at the step limit (truncated); an episode neither this nor a success ended in
    # failure (Taxi: a dangerous no-op).
    step_limit: bool
    episode_return: float
    length: int
    env_index: int  # which of the worker's envs played it
    kind: str  # the env's `episode_kind` (ALFWorld: the task type); "" where it has none
    start: str  # the listed start it played (`set_starts`); "" for a drawn one
    # Digests of the observations it acted on (`record_observations`; held-out eval only).
    observed: tuple[str, ...]


class StepView(NamedTuple):
    """What one env slot shows its policy at a step, as text (`ReflectRLVectorEnv.last_views`;
    `reflectrl play` prints it)."""

    instruction: str  # the task header
    observation: str  # the state, as the prompt shows it
    reflection: str | None  # None: the no-reflection layout; "" where none was asked for
    menu: tuple[str, ...]  # the actions in the order the menu shows them (label i: menu[i])


class WorkerCounts(TypedDict):
    """What a rollout worker counts per iteration; the coordinator sums them into run totals."""

    env_steps: int
    reflection_calls: int
    reflection_cache_hits: int
    truncated_prompts: int
    clipped_reflection_prompts: int
    # Where a worker's sampling time goes (ms): stepping the text envs and rendering/tokenizing
    # prompts; waiting for reflections; the rest of the EnvRunner between two env steps (the
    # policy's forward pass and RLlib's bookkeeping).
    env_ms: int
    reflection_ms: int
    policy_ms: int


WORKER_COUNTERS: tuple[str, ...] = tuple(WorkerCounts.__annotations__)


def zero_counts() -> WorkerCounts:
    return WorkerCounts(**dict.fromkeys(WORKER_COUNTERS, 0))


class WorkerStats(WorkerCounts):
    """A worker's report since its last one (`ReflectRLVectorEnv.pop_stats`)."""

    worker_index: int
    stage: str
    episodes: list[EpisodeRecord]
    # Every random stream of the worker's envs (JSON; checkpointed, restored on a restart).
    random_state: dict[str, Any]


class Reflector:
    """What the vector env needs from a reflection source: many prompts in, as many texts out.
    `seed` (for sampled reflections) is set per rollout worker by the vector env."""

    seed: int | None

    def reflect(
        self, prompts: list[str], quotable: list[list[str]] | None = None
    ) -> list[str]:  # pragma: no cover - protocol
        """`quotable` (reflection.quote_valid_actions only): the commands each reflection may
        quote."""
        raise NotImplementedError
