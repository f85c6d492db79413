"""Resets off the critical path: an env whose episode just ended starts its next reset on a
background thread while the worker waits on the reflection server and the policy.

ALFWorld's engine takes ~1 s to reset and ~0.1 s to step (benchmarks/results/alfworld.json),
so a worker that resets in line stalls its whole batch of envs on every finished episode.

A prefetched reset must be invisible: the vector env gives the same observations, records and
random states with or without it. So each prefetch keeps what it changed (the env's random
streams before the draw, the worker's seeded flag and the listed start it took), and `cancel`
puts them back when something decides the next episode differently first (a stage switch,
listed starts, a restored checkpoint).

The main thread never steps an env while a reset runs: every vector-env entry point `settle`s
first, and between them it only renders prompts from text the envs keep (`shorter_observation`
must not call an engine). ALFWorld's engine is not thread-safe: a game loading beside another
env's step fails inside the planner's translator (IndexError: pop from empty list).
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from reflectrl.envs.base import TextEnv, TextObservation


@dataclass
class PendingReset:
    """A reset started in the background, and what it changed."""

    future: Future[tuple[TextObservation, dict[str, Any]]]
    streams_before: list[dict[str, Any] | None]  # the env's random streams before the draw
    seeded_before: bool  # the vector env's seeded flag before (the first reset takes a seed)
    start: str  # the listed start it plays ("" for a drawn one)


class ResetPrefetcher:
    """One background thread per worker: resets run one at a time, in the order started, so
    a run stays deterministic."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self.pending: dict[int, PendingReset] = {}

    def start(
        self,
        index: int,
        env: TextEnv,
        seed: int | None,
        options: dict[str, Any] | None,
        seeded_before: bool,
        start: str,
    ) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="env-reset")
        streams = env.random_state()  # read before the reset draws from them
        future = self._pool.submit(env.reset, seed=seed, options=options)
        self.pending[index] = PendingReset(future, streams, seeded_before, start)

    def settle(self) -> None:
        """Wait until no reset runs (an env may then be read or changed)."""
        wait([p.future for p in self.pending.values()])

    def take(self, index: int) -> TextObservation | None:
        """The prefetched first observation of env `index`'s next episode, if there is one; a
        reset that failed raises here, where the worker reports it."""
        pending = self.pending.pop(index, None)
        return None if pending is None else pending.future.result()[0]

    def cancel(self, index: int, env: TextEnv) -> PendingReset | None:
        """Undo env `index`'s prefetched reset: its streams are put back, so the reset that
        replaces it draws what the prefetch drew. The caller restores the rest."""
        pending = self.pending.pop(index, None)
        if pending is not None:
            pending.future.result()
            env.set_random_state(pending.streams_before)
        return pending

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self.pending = {}
