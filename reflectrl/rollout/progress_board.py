"""The run's progress board: a small named Ray actor that counts, within one iteration, the
env steps of every rollout worker and the minibatches of every learner, for the driver's
heartbeat (rl/heartbeat.py). Reports are sent without waiting."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import ray


class ProgressBoard:
    def __init__(self) -> None:
        self.iteration_env_steps = 0
        self.minibatches_done = 0
        self.minibatches_total = 0
        self.phase = "sampling"
        self.started_at = time.monotonic()
        self.sampling_s: float | None = None  # from the iteration's start to its first update
        self.learners = 0  # learner names handed out

    def add_env_steps(self, steps: int) -> None:
        self.iteration_env_steps += steps

    def learning(self, minibatches_total: int) -> None:
        if self.sampling_s is None:
            self.sampling_s = time.monotonic() - self.started_at
        self.phase = "learning"
        self.minibatches_total += minibatches_total  # summed over learner actors

    def minibatch_done(self) -> None:
        self.minibatches_done += 1

    def new_iteration(self) -> None:
        learners = self.learners
        self.__init__()  # type: ignore[misc]
        self.learners = learners

    def next_learner_name(self) -> str:
        self.learners += 1
        return f"learner-{self.learners - 1}"

    def snapshot(self) -> dict[str, Any]:
        return dict(self.__dict__)


def start_progress_board(name: str) -> ray.actor.ActorHandle:
    return ray.remote(num_cpus=0)(ProgressBoard).options(name=name).remote()


def board_reporter(name: str | None) -> Callable[[str, int], None] | None:
    """In a worker or learner: `report(kind, n)` (kind: env_steps, learning, minibatch), sent
    without waiting (one small message per vector-env step: nothing next to an LM forward).
    None without Ray or without a board (e.g. an env built in a test)."""
    if name is None or not ray.is_initialized():
        return None
    board = ray.get_actor(name)

    def report(kind: str, n: int = 1) -> None:
        if kind == "env_steps":
            board.add_env_steps.remote(n)
        elif kind == "learning":
            board.learning.remote(n)
        else:
            board.minibatch_done.remote()

    return report


def take_learner_name(board_name: str | None) -> str:
    """`learner-<n>` from the run's board (in a run on Ray), else `learner`."""
    if board_name is None or not ray.is_initialized():
        return "learner"
    return str(ray.get(ray.get_actor(board_name).next_learner_name.remote(), timeout=30))
