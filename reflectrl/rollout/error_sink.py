"""Where a rollout worker reports the error that is about to end it.

When an env raises inside an RLlib EnvRunner, RLlib 2.60 logs the exception in the worker's
own log, waits `delay_between_env_runner_restarts_s` and exits the process; the driver only
sees "UnexpectedSystemExit: Worker exits with an exit code 1". So the vector env reports the
error here (a small named Ray actor of the run) before it propagates, and the run's failure
watch names it when it stops the run.
"""

from __future__ import annotations

from collections.abc import Callable

import ray


class ErrorSink:
    def __init__(self) -> None:
        self.reports: list[str] = []

    def report(self, message: str) -> None:
        self.reports.append(message)

    def pop(self) -> list[str]:
        reports, self.reports = self.reports, []
        return reports


def start_error_sink(name: str) -> ray.actor.ActorHandle:
    return ray.remote(num_cpus=0)(ErrorSink).options(name=name).remote()


def error_reporter(name: str | None) -> Callable[[str], None] | None:
    """In a rollout worker: a function that sends a message to the run's sink (None without
    Ray or without a sink, e.g. an env built in a test)."""
    if name is None or not ray.is_initialized():
        return None
    sink = ray.get_actor(name)

    def report(message: str) -> None:
        # Waited for: the worker process may end right after the error propagates.
        ray.get(sink.report.remote(message), timeout=10)

    return report
