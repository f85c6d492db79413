"""vLLM start-up on CPU: the engine core in its own process (vLLM's default, `mp`) vs inside
the API server's process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, what CPU_ENV now sets).

Each repeat starts both variants in turn (same model, same CPU arguments otherwise), times
start-up to a served `/v1/models`, then 20 greedy completions of 32 tokens, and stops it.
Ratios are inproc over mp within the same run.

    python -m benchmarks.vllm_startup                 # tiny model, 3 repeats (the results file)
    python -m benchmarks.vllm_startup --model smollm2 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.common import print_table, write_results
from reflectrl.data.scratch import resolve_or_build
from reflectrl.reflection import server as vllm_server

PROMPT = "The taxi is at row 2, column 3; the passenger waits at R. " * 8
REQUESTS = 20
MULTIPROCESSING = "VLLM_ENABLE_V1_MULTIPROCESSING"


def start_and_serve(model_dir: Path, log: Path, multiprocessing: str) -> tuple[float, float]:
    """(start-up seconds, seconds for REQUESTS sequential completions)."""
    env = {MULTIPROCESSING: multiprocessing}  # the server's own env overrides CPU_ENV
    server = vllm_server.VLLMServer(model_dir, log, env=env)
    with server, httpx.Client(timeout=120) as http:
        started = time.perf_counter()
        for _ in range(REQUESTS):
            body = {"model": "reflection", "prompt": PROMPT, "max_tokens": 32, "temperature": 0}
            http.post(f"{server.url}/completions", json=body).raise_for_status()
        return server.startup_s or 0.0, time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="tiny, smollm2 or a model directory")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    model_dir = resolve_or_build(args.model)
    if vllm_server.CPU_ENV.get(MULTIPROCESSING) != "0":
        parser.error(f"CPU_ENV no longer sets {MULTIPROCESSING}=0")
    variants = {"mp": "1", "inproc": "0"}
    logs = Path(tempfile.mkdtemp(prefix="reflectrl-vllm-startup-"))
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    for repeat in range(args.repeats):
        for name, multiprocessing in variants.items():
            startup, serve = start_and_serve(
                model_dir, logs / f"{name}{repeat}.log", multiprocessing
            )
            times[name].append((startup, serve))
            print(f"repeat {repeat} {name:<6} start-up {startup:5.1f} s, serve {serve:5.2f} s")
    rows = []
    for name, pairs in times.items():
        startup = statistics.median(s for s, _ in pairs)
        serve = statistics.median(s for _, s in pairs)
        rows.append({"variant": name, "startup_s": round(startup, 1), "serve_s": round(serve, 2)})
    by = {row["variant"]: row for row in rows}
    ratios = {
        "startup_inproc_over_mp": round(by["inproc"]["startup_s"] / by["mp"]["startup_s"], 2),
        "serve_inproc_over_mp": round(by["inproc"]["serve_s"] / by["mp"]["serve_s"], 2),
    }
    print_table(rows, ["variant", "startup_s", "serve_s"])
    print(", ".join(f"{k} {v:.2f}" for k, v in ratios.items()))
    payload = {"model": args.model, "repeats": args.repeats, "requests": REQUESTS}
    path = write_results("vllm_startup", {**payload, "results": rows, "ratios": ratios})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
