"""`python -m reflectrl.reflection.vllm_cpu ARGS...`: vLLM's OpenAI server
(`python -m vllm.entrypoints.openai.api_server ARGS...`) with its engine core forked.

vLLM's CPU platform sets `VLLM_WORKER_MULTIPROC_METHOD=spawn` when it checks the config, so
the engine-core process starts a fresh interpreter and imports vLLM and torch again. Forked
instead, the tiny model's server is ready in 15.6 s, not 25.1, on 2 cores, and it serves the
same completions (greedy and seeded sampling) in 3.16 s, not 2.92, for 20 requests (the
repeats' spreads overlap; benchmarks/vllm_startup.py).
Nothing of this module runs on a GPU server: there the engine is left as vLLM starts it.
"""

from __future__ import annotations

import os
import runpy
import sys
from typing import Any

# vLLM's own OpenAI server (what the reflection server runs on a GPU).
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
# Written to the server's log by every process forked from the API server (the engine core
# among them), so a log says how its engine core was started.
FORKED = "reflectrl: forked from the vLLM API server, pid"


def fork_engine_core() -> None:
    """Keep vLLM's CPU config checks but start the engine core by fork (vLLM's own default
    method everywhere but on CPU)."""
    from vllm.platforms.cpu import CpuPlatform

    check_config = CpuPlatform.check_and_update_config.__func__  # type: ignore[attr-defined]

    def check_config_then_fork(cls: Any, vllm_config: Any) -> None:
        check_config(cls, vllm_config)
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"

    CpuPlatform.check_and_update_config = classmethod(check_config_then_fork)  # type: ignore[method-assign]


def say_forked() -> None:
    # os.write, not print: a fork may copy a lock that another thread of the parent held.
    os.write(sys.stdout.fileno(), f"{FORKED} {os.getpid()}\n".encode())


def main() -> None:
    fork_engine_core()
    os.register_at_fork(after_in_child=say_forked)
    sys.argv[0] = SERVER_MODULE
    runpy.run_module(SERVER_MODULE, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
