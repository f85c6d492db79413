"""The terminal shows reflectrl's own lines; what the libraries under it print goes to the run's
log.

A launch starts Ray, RLlib, transformers and torch in this process. They write to standard
error through every channel there is: Python's logging handlers and `warnings`, tqdm bars, and
C++ cores (Ray's `core_worker.cc`) that write to file descriptor 2 directly. Rebinding
`sys.stderr` would miss the last kind, so `LibraryOutput` moves descriptor 2 itself into a
file, and keeps a copy of the terminal's standard error for `say` (progress lines) and for the
error line the CLI prints when a launch fails. Standard output is left alone: it carries the
stage lines and the result table.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
from types import TracebackType
from typing import TextIO

from reflectrl.errors import ReflectRLError

_terminal: TextIO | None = None  # the terminal's stderr while LibraryOutput is open


def say(line: str) -> None:
    """A progress line of ours, on the terminal's standard error."""
    print(line, file=_terminal or sys.stderr, flush=True)


class LibraryOutput:
    """While open, file descriptor 2 goes to a spool file until `into(path)` names the log (the
    run directory does not exist yet when Ray and the preflight checks start). Closing puts the
    terminal back; nothing written before `into` is lost: it is copied to the top of the log."""

    def __init__(self) -> None:
        global _terminal
        sys.stderr.flush()
        self._saved_fd = os.dup(2)
        self._spool = tempfile.TemporaryFile()  # noqa: SIM115 (closed by into or close)
        self.path: Path | None = None
        os.dup2(self._spool.fileno(), 2)
        _terminal = os.fdopen(os.dup(self._saved_fd), "w", buffering=1)

    def into(self, path: Path) -> None:
        """From now on (and what was spooled before), descriptor 2 appends to `path`."""
        sys.stderr.flush()
        with open(path, "ab") as log:
            self._spool.seek(0)
            shutil.copyfileobj(self._spool, log)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(fd, 2)
        os.close(fd)
        self._spool.close()
        self.path = path

    def close(self) -> None:
        global _terminal
        sys.stderr.flush()
        os.dup2(self._saved_fd, 2)
        os.close(self._saved_fd)
        if not self._spool.closed:
            self._spool.close()
        if _terminal is not None:
            _terminal.close()
            _terminal = None

    def __enter__(self) -> LibraryOutput:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        # A failure that is not ours (no one-line ReflectRLError) before the log existed: what
        # the libraries said may explain it, so it reaches the terminal after all.
        if error is not None and not isinstance(error, ReflectRLError) and self.path is None:
            sys.stderr.flush()
            self._spool.seek(0)
            assert _terminal is not None
            _terminal.write(self._spool.read().decode(errors="replace"))
        self.close()
