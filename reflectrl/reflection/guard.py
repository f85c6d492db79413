"""`python -m reflectrl.reflection.guard -- COMMAND...`: run COMMAND and take its whole process
group down when the process that started the guard dies.

vLLM forks an engine-core process that outlives a SIGKILLed API server, and nothing outlives
a SIGKILLed Ray actor more stubbornly than the GBs of a model server it started. The guard
leads a fresh process group (the caller starts it with `start_new_session=True`), polls its
parent, and SIGKILLs the group once the parent is gone (a killed reflection actor, a killed
driver). It exits with COMMAND's exit code otherwise, so callers see the server's own code.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

POLL_S = 0.2


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "--" or len(argv) < 2:
        print("usage: python -m reflectrl.reflection.guard -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    parent = os.getppid()
    child = subprocess.Popen(argv[1:])  # same process group: the guard leads it
    # A SIGTERM to the group reaches the server itself, which shuts down in its own time;
    # the guard stays until it has (a handler, not SIG_IGN: the child must not inherit it).
    signal.signal(signal.SIGTERM, lambda *_: None)
    while True:
        code = child.poll()
        if code is not None:
            return code if code >= 0 else 128 - code
        if os.getppid() != parent:  # orphaned: whoever started us is dead
            os.killpg(os.getpgrp(), signal.SIGKILL)
        time.sleep(POLL_S)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
