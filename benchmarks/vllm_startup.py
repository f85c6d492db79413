"""vLLM start-up on CPU, three ways of running the reflection server's command:

- `stock`: vLLM's CPU defaults: the engine core spawned, and a worker process of its own for
  the model (V1 multiprocessing on);
- `uniproc`: the model inside the engine core (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), the engine
  core still spawned;
- `fork`: that, with the engine core forked (`python -m reflectrl.reflection.vllm_cpu`): what
  the reflection server runs on CPU.

Each repeat starts the variants in turn (same model, same arguments otherwise), times start-up
to a served `/v1/models`, then 20 completions of 32 tokens (greedy and seeded sampling,
alternating), and stops it. Ratios are over `stock` within the same run; `same_completions`
says whether every variant gave the same texts in every repeat.

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
SPAWNED = vllm_server.SERVER_MODULE
FORKED = "reflectrl.reflection.vllm_cpu"
MULTIPROCESSING = "VLLM_ENABLE_V1_MULTIPROCESSING"
VARIANTS = {"stock": (SPAWNED, "1"), "uniproc": (SPAWNED, "0"), "fork": (FORKED, "0")}


class ServerWithModule(vllm_server.VLLMServer):
    """The reflection server's CPU command with another server module and multiprocessing."""

    def __init__(self, model_dir: Path, log: Path, module: str, multiprocessing: str) -> None:
        super().__init__(model_dir, log, env={MULTIPROCESSING: multiprocessing})
        self.module = module

    def command(self) -> list[str]:
        args = super().command()
        args[args.index("-m") + 1] = self.module
        return args


def start_and_serve(
    model_dir: Path, log: Path, module: str, multiprocessing: str
) -> tuple[float, float, list[str]]:
    """(start-up seconds, seconds for REQUESTS sequential completions, their texts)."""
    server = ServerWithModule(model_dir, log, module, multiprocessing)
    texts = []
    with server, httpx.Client(timeout=120) as http:
        started = time.perf_counter()
        for i in range(REQUESTS):
            body = {"model": "reflection", "prompt": PROMPT, "max_tokens": 32, "seed": i,
                    "temperature": 1.0 if i % 2 else 0.0}  # fmt: skip
            answer = http.post(f"{server.url}/completions", json=body)
            texts.append(answer.raise_for_status().json()["choices"][0]["text"])
        return server.startup_s or 0.0, time.perf_counter() - started, texts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="tiny, smollm2 or a model directory")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    model_dir = resolve_or_build(args.model)
    if vllm_server.SERVER_MODULES["cpu"] != FORKED or vllm_server.CPU_ENV[MULTIPROCESSING] != "0":
        parser.error("the reflection server's CPU setup is no longer the `fork` variant")
    logs = Path(tempfile.mkdtemp(prefix="reflectrl-vllm-startup-"))
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in VARIANTS}
    same = True
    for repeat in range(args.repeats):
        texts = {}
        for name, (module, multiprocessing) in VARIANTS.items():
            log = logs / f"{name}{repeat}.log"
            startup, serve, texts[name] = start_and_serve(model_dir, log, module, multiprocessing)
            times[name].append((startup, serve))
            print(f"repeat {repeat} {name:<7} start-up {startup:5.1f} s, serve {serve:5.2f} s")
        same = same and all(t == texts["stock"] for t in texts.values())
    rows = []
    for name, pairs in times.items():
        startup = statistics.median(s for s, _ in pairs)
        serve = statistics.median(s for _, s in pairs)
        rows.append({"variant": name, "startup_s": round(startup, 1), "serve_s": round(serve, 2)})
    by = {row["variant"]: row for row in rows}
    ratios = {
        f"{measure}_{name}_over_stock": round(
            by[name][f"{measure}_s"] / by["stock"][f"{measure}_s"], 2
        )
        for name in ("uniproc", "fork")
        for measure in ("startup", "serve")
    }
    print_table(rows, ["variant", "startup_s", "serve_s"])
    print(", ".join(f"{k} {v:.2f}" for k, v in ratios.items()), f"same completions: {same}")
    payload = {"model": args.model, "repeats": args.repeats, "requests": REQUESTS}
    payload["same_completions"] = same
    path = write_results("vllm_startup", {**payload, "results": rows, "ratios": ratios})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
