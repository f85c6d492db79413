"""Signs of life inside one iteration: which phase it is in (sampling / learning), env steps
so far, minibatches done. An iteration of an LM policy can take many minutes; without this
the console says nothing between two progress lines.

- `ProgressBoard` (rollout/progress_board.py), a small named Ray actor of the run, collects
  the counts; rollout workers add their env steps (`board_reporter`);
- the learner says when an update starts (with its number of minibatches) and each one done;
- `Heartbeat`, a thread of the driver, shows it: a live line on a terminal, else a plain
  line every `every_s` seconds (never more than 30 s apart).
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, TextIO

import ray

from reflectrl.rl.metrics import format_duration


class Heartbeat:
    """While an iteration runs: `  [iter 3/30 1m05s] sampling: env steps 412/1024` (or
    `learning: minibatch 7/32, ...`), live on a TTY, every `every_s` seconds otherwise."""

    def __init__(
        self,
        board: Any,
        total_iterations: int,
        steps_per_iteration: int,
        every_s: float = 20.0,
        out: TextIO = sys.stdout,
    ) -> None:
        self.board, self.total, self.steps = board, total_iterations, steps_per_iteration
        self.every_s = every_s
        self.out = out
        self.live = out.isatty()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lines: list[str] = []  # what was shown (plain mode), for tests

    def start(self, iteration: int) -> None:
        ray.get(self.board.new_iteration.remote())
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, args=(iteration,), daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self.live:
            self.out.write("\r\033[K")
            self.out.flush()

    def _run(self, iteration: int) -> None:
        started = time.monotonic()
        interval = 1.0 if self.live else self.every_s
        while not self._stop.wait(interval):
            try:
                state = ray.get(self.board.snapshot.remote(), timeout=10)
            except ray.exceptions.RayError:
                return  # the run is shutting down
            line = self.format(iteration, state, time.monotonic() - started)
            if self.live:
                self.out.write(f"\r\033[K{line}")
            else:
                self.lines.append(line)
                self.out.write(line + "\n")
            self.out.flush()

    def format(self, iteration: int, state: dict[str, Any], seconds: float) -> str:
        head = f"  [iter {iteration}/{self.total} {format_duration(seconds)}] {state['phase']}:"
        steps = f"env steps {state['iteration_env_steps']}/{self.steps}"
        if state["phase"] == "learning":
            done = state["minibatches_done"]
            total = max(state["minibatches_total"], done)
            return f"{head} minibatch {done}/{total}, {steps}"
        return f"{head} {steps}"
