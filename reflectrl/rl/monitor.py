"""What the driver watches while an iteration runs: the heartbeat line (fed by the run's
progress board) and the rollout workers' failures (the run's error sink and RLlib's log)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import ray

from reflectrl.config import ReflectRLConfig
from reflectrl.rl.failures import WorkerFailureWatch
from reflectrl.rl.heartbeat import Heartbeat
from reflectrl.rollout.error_sink import start_error_sink
from reflectrl.rollout.progress_board import start_progress_board


class IterationMonitor:
    def __init__(self, config: ReflectRLConfig, workers: int) -> None:
        run_id = uuid.uuid4().hex[:12]
        # Named actors: the rollout workers and learners find them by these names.
        self.error_sink_name = f"reflectrl-errors-{run_id}"
        self.progress_board_name = f"reflectrl-progress-{run_id}"
        self.error_sink = start_error_sink(self.error_sink_name)
        self.progress_board = start_progress_board(self.progress_board_name)
        self.heartbeat = Heartbeat(
            self.progress_board,
            config.run.iterations,
            config.ppo.batch_size(workers, config.env.envs_per_worker),
            every_s=config.run.heartbeat_s,
        )
        self.failures = WorkerFailureWatch(config.run.max_failed_iterations)
        self.workers = workers

    @contextmanager
    def iteration(self, number: int) -> Iterator[None]:
        self.heartbeat.start(number)
        try:
            with self.failures:
                yield
        finally:
            self.heartbeat.stop()

    def sampling_s(self, iteration_s: float) -> float:
        """Seconds from the iteration's start to its first update (all of it without one)."""
        board = ray.get(self.progress_board.snapshot.remote())
        return iteration_s if board["sampling_s"] is None else min(board["sampling_s"], iteration_s)

    def end_iteration(self, healthy_workers: int) -> None:
        """Count the iteration's worker failures; raises once they keep coming back."""
        reports = ray.get(self.error_sink.pop.remote())
        self.failures.end_iteration(healthy_workers, self.workers, reports)

    def close(self) -> None:
        for actor in (self.error_sink, self.progress_board):
            ray.kill(actor)
