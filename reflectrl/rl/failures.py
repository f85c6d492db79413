"""Rollout-worker failures made visible: RLlib restarts a crashed EnvRunner and only logs why.

`WorkerFailureWatch` listens to the line RLlib's actor manager logs when a worker's remote call
fails, takes the error the worker reported before it died (rollout/error_sink.py; RLlib
itself only says "exit code 1"), and counts iterations that had a failure. A cause that comes
back on every restart (a reflection server that answers health checks but rejects every
request, a bad env option) stops the run after `run.max_failed_iterations` failing iterations
with no clean one in between, with one line naming the error, instead of restarting workers
forever.
"""

from __future__ import annotations

import logging
import re

from reflectrl.errors import ReflectRLError

# RLlib's FaultTolerantActorManager logs "Ray error (<remote traceback>), taking actor N out of
# service." at ERROR level on this logger when a remote call on an EnvRunner raised.
RLLIB_ACTOR_LOGGER = "ray.rllib.utils.actor_manager"
_ERROR_LINE = re.compile(r"^\s*(?:[\w.]+\.)?(\w+(?:Error|Exception)): (\S.*)$", re.MULTILINE)


class WorkerFailureError(ReflectRLError):
    """Rollout workers kept failing; the run stops (its last checkpoint is kept)."""


class WorkerFailureWatch(logging.Handler):
    def __init__(self, max_failed_iterations: int) -> None:
        super().__init__(level=logging.ERROR)
        self.max_failed_iterations = max_failed_iterations
        self.failed_in_a_row = 0
        self.errors: list[str] = []  # since the last `end_iteration`
        self.last_error = ""

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "out of service" in message:
            self.errors.append(error_summary(message))

    def __enter__(self) -> WorkerFailureWatch:
        logging.getLogger(RLLIB_ACTOR_LOGGER).addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        logging.getLogger(RLLIB_ACTOR_LOGGER).removeHandler(self)

    def end_iteration(self, healthy_workers: int, workers: int, reports: list[str]) -> None:
        """Count this iteration; raise WorkerFailureError once the limit is reached.

        An iteration with a worker error counts; a clean one (no error, every worker healthy)
        resets the count; one where a worker is still restarting does neither, so a crash that
        comes back after every restart is stopped, and a single crash is not.
        """
        if self.errors or reports:
            self.last_error = (reports or self.errors)[-1]
            self.failed_in_a_row += 1
        elif healthy_workers >= workers:
            self.failed_in_a_row = 0
        self.errors = []
        if self.failed_in_a_row >= self.max_failed_iterations:
            raise WorkerFailureError(
                f"rollout workers failed in {self.failed_in_a_row} iterations without a clean "
                f"one in between (run.max_failed_iterations); last error: {self.last_error}"
            )


def error_summary(message: str, limit: int = 400) -> str:
    """The most specific "SomeError: message" line of a logged remote traceback, on one line."""
    matches = _ERROR_LINE.findall(message)
    if not matches:
        text = " ".join(message.split())
    else:
        name, text = matches[0]  # the root cause comes first; wrappers (RuntimeError) follow
        text = f"{name}: {' '.join(text.split())}"
    return text if len(text) <= limit else text[: limit - 3] + "..."
