"""Reflections per second from one vLLM server: one batched request vs sequential vs concurrent.

A rollout worker needs one reflection per env per step; this measures what sending them as
one list-prompt request buys over one request at a time (sequential) and over one request
per prompt in parallel (concurrent). Prompts share a task header, as real reflection prompts
do, and differ per repeat so the prefix cache cannot serve whole prompts.

    python benchmarks/reflection_batching.py                 # tiny model, N = 8 and 16
    python benchmarks/reflection_batching.py --model smollm2 --n 8
    python benchmarks/reflection_batching.py --url http://host:8000/v1 --served-name reflection
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from reflectrl.data.scratch import resolve_or_build
from reflectrl.reflection.client import ReflectionClient
from reflectrl.reflection.server import VLLMServer

RESULTS = Path(__file__).parent / "results" / "reflection_batching.json"
HEADER = (
    "You are driving a taxi in a 5x5 grid. Pick up the passenger (P) and drop them at the "
    "destination (D). Walls (|) block moves; a move into a wall or an illegal pickup or "
    "drop-off ends the episode with a penalty. Think about the last action and what to do next."
)


def make_prompts(n: int, repeat: int) -> list[str]:
    prompts = []
    for i in range(n):
        row, col = (i + repeat) % 5, (3 * i + repeat) % 5
        prompts.append(
            f"{HEADER}\nStep {repeat * 100 + i}. The taxi (T) is at row {row}, column {col}. "
            f"The passenger is at R, the destination is at B. Last action: move "
            f"{['north', 'south', 'east', 'west'][i % 4]}; it changed the state. # Analyze:\n"
        )
    return prompts


def run_mode(client: ReflectionClient, mode: str, prompts: list[str]) -> float:
    started = time.perf_counter()
    if mode == "sequential":
        for prompt in prompts:
            client.reflect([prompt])
    else:  # "batch" or "concurrent": the client's own modes
        client.reflect(prompts)
    return time.perf_counter() - started


def measure(url: str, served: str, sizes: list[int], args: argparse.Namespace) -> list[dict]:
    rows = []
    for n in sizes:
        for mode in ("batch", "sequential", "concurrent"):
            client = ReflectionClient(
                url,
                served,
                max_tokens=args.max_tokens,
                timeout_s=600,
                mode="concurrent" if mode == "concurrent" else "batch",
                max_concurrency=n,
                # No stop strings by default: every reflection is max_tokens long, so all modes
                # do the same work (a random tiny model would stop after ~2 tokens).
                stop=(" # Action", "\n\n") if args.stop else (),
            )
            run_mode(client, mode, make_prompts(n, repeat=999))  # warm-up
            client.calls = client.requests = client.completion_tokens = 0
            seconds = [run_mode(client, mode, make_prompts(n, r)) for r in range(args.repeats)]
            median = statistics.median(seconds)
            tokens = client.completion_tokens / args.repeats
            rows.append(
                {
                    "n": n,
                    "mode": mode,
                    "seconds_median": round(median, 4),
                    "seconds_all": [round(s, 4) for s in seconds],
                    "reflections_per_s": round(n / median, 3),
                    "completion_tokens": tokens,
                    "tokens_per_s": round(tokens / median, 2),
                    "requests_per_repeat": client.requests / args.repeats,
                }
            )
            print(f"  n={n:<3} {mode:<10} {median:7.3f} s  {n / median:7.2f} refl/s", flush=True)
    return rows


def ratios(rows: list[dict]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for n in sorted({r["n"] for r in rows}):
        rate = {r["mode"]: r["reflections_per_s"] for r in rows if r["n"] == n}
        out[str(n)] = {
            "batch_over_sequential": round(rate["batch"] / rate["sequential"], 2),
            "batch_over_concurrent": round(rate["batch"] / rate["concurrent"], 2),
            "concurrent_over_sequential": round(rate["concurrent"] / rate["sequential"], 2),
        }
    return out


def print_table(rows: list[dict], ratio: dict[str, dict[str, float]]) -> None:
    print(f"\n{'n':>4} {'mode':<11} {'s':>8} {'refl/s':>8} {'tok/s':>8} {'requests':>8}")
    for r in rows:
        print(
            f"{r['n']:>4} {r['mode']:<11} {r['seconds_median']:>8.3f} "
            f"{r['reflections_per_s']:>8.2f} {r['tokens_per_s']:>8.1f} "
            f"{r['requests_per_repeat']:>8.0f}"
        )
    for n, values in ratio.items():
        pairs = ", ".join(f"{k} {v:.2f}x" for k, v in values.items())
        print(f"n={n}: {pairs}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="tiny, smollm2 or a model directory")
    parser.add_argument("--n", type=int, nargs="+", default=[8, 16], help="prompts per step")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--stop", action="store_true", help="use the reflection stop strings")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--url", help="use a running OpenAI-compatible server instead")
    parser.add_argument("--served-name", default="reflection")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    info: dict[str, Any] = {
        "model": args.model,
        "device": args.device,
        "max_tokens": args.max_tokens,
        "stop_strings": args.stop,
        "repeats": args.repeats,
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
    }
    if args.url:
        rows = measure(args.url, args.served_name, args.n, args)
    else:
        model_dir = resolve_or_build(args.model)
        log = Path(tempfile.mkdtemp(prefix="reflectrl-bench-")) / "vllm.log"
        print(f"starting vLLM for {model_dir} (log {log})", flush=True)
        server = VLLMServer(model_dir, log, served_model_name=args.served_name, device=args.device)
        with server:
            info["server_startup_s"] = round(server.startup_s or 0.0, 1)
            print(f"ready in {server.startup_s:.1f} s", flush=True)
            rows = measure(server.url, args.served_name, args.n, args)
    ratio = ratios(rows)
    print_table(rows, ratio)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({**info, "results": rows, "ratios": ratio}, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
