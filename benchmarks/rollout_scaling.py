"""Rollout scaling: env steps/s of the smoke config with 1, 2, 4 rollout workers.

Each variant is a real run (Ray, RLlib, the tiny models; the reflection server on or off)
with the same env steps per worker per iteration; after a warm-up iteration, the sampling
throughput of the next iterations is the env steps they sampled over their wall time minus
the learner's update time. Variants run in the same process, one after another, so their
ratios compare like with like on a noisy machine.

python -m benchmarks.rollout_scaling [--workers 1,2,4] [--iterations 3] [--reflection]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import print_table, write_results
from reflectrl.config import load_config

SMOKE = Path(__file__).resolve().parents[1] / "configs" / "smoke.yaml"


def measure(workers: int, iterations: int, reflection: bool) -> dict[str, Any]:
    import ray

    from reflectrl.rl.driver import Run

    config = load_config(
        SMOKE,
        [
            f"reflection.enabled={str(reflection).lower()}",
            "curriculum.enabled=false",
            "run.checkpoint_every=1000",
        ],
    )
    ray.init(
        address="local", num_cpus=max(os.cpu_count() or 1, workers + 1), include_dashboard=False
    )
    try:
        with tempfile.TemporaryDirectory() as tmp:
            run = Run(config, Path(tmp) / "run", workers=workers)
            try:
                run.start()
                warm_up = run.train_iteration()  # model loads, first resets
                started = time.perf_counter()
                rows = [run.train_iteration() for _ in range(iterations)]
                wall = time.perf_counter() - started
            finally:
                run.close()
    finally:
        ray.shutdown()
    steps = rows[-1]["env_steps"] - warm_up["env_steps"]
    sampling = sum(r["sample_s"] for r in rows)
    update = sum(r["update_s"] for r in rows)
    return {
        "workers": workers,
        "env_steps": steps,
        "seconds": round(wall, 2),
        "sample_s": round(sampling, 2),
        "update_s": round(update, 2),
        "env_steps_per_s": round(steps / sampling, 2),  # while sampling
        "end_to_end_steps_per_s": round(steps / wall, 2),  # sampling + update
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,2,4", help="comma-separated worker counts")
    parser.add_argument("--iterations", type=int, default=3, help="measured, after a warm-up")
    parser.add_argument("--reflection", action="store_true", help="with the vLLM server")
    args = parser.parse_args(argv)
    rows = [measure(int(n), args.iterations, args.reflection) for n in args.workers.split(",")]
    base = rows[0]["env_steps_per_s"] / rows[0]["workers"]
    for row in rows:
        row["speedup"] = round(row["env_steps_per_s"] / rows[0]["env_steps_per_s"], 2)
        row["per_worker_efficiency"] = round(row["env_steps_per_s"] / row["workers"] / base, 2)
    print_table(
        rows,
        [
            "workers",
            "env_steps",
            "sample_s",
            "update_s",
            "env_steps_per_s",
            "end_to_end_steps_per_s",
            "speedup",
            "per_worker_efficiency",
        ],
    )
    name = "rollout_scaling" + ("_reflection" if args.reflection else "")
    path = write_results(
        name,
        {
            "config": "configs/smoke.yaml (curriculum off)",
            "reflection": args.reflection,
            "iterations_measured": args.iterations,
            "note": "each iteration samples rollout_fragment_length x envs_per_worker env "
            "steps per worker, then runs the PPO update in the driver; env_steps_per_s is over "
            "the sampling phase only, end_to_end_steps_per_s over whole iterations",
            "rows": rows,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
