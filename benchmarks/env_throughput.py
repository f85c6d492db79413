"""Env steps/s of the whole loop (sample + reflect + PPO update) with 1 and 2 rollout workers.

Both variants run in one process against the same vLLM reflection server (started once), so the
ratio compares like with like on a noisy machine.

    python benchmarks/env_throughput.py [--config configs/smoke.yaml] [--iterations 4]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.common import print_table, write_results
from reflectrl.config import ReflectRLConfig, load_config
from reflectrl.data.scratch import resolve_or_build
from reflectrl.reflection.server import VLLMServer

TIME_SPLIT = ("env_worker_s", "reflection_worker_s", "policy_worker_s")


def measure(config_path: str, overrides: list[str], workers: int, iterations: int) -> dict:
    import ray

    from reflectrl.rl.driver import Run

    config = load_config(config_path, [*overrides, f"run.iterations={iterations}"])
    ray.init(address="local", num_cpus=workers + 1, include_dashboard=False, log_to_driver=False)
    run = Run(config, Path(tempfile.mkdtemp()) / "run", workers=workers)
    try:
        run.start()
        rows = [run.train_iteration() for _ in range(iterations)]
    finally:
        run.close()
        ray.shutdown()
    timed = rows[1:]  # the first iteration includes warm-up
    steps = rows[-1]["env_steps"] - rows[0]["env_steps"]
    seconds = sum(r["iteration_s"] for r in timed)
    # Where the workers' sampling time went (summed over workers and the timed iterations).
    spent = {key: sum(r[key] for r in timed) for key in TIME_SPLIT}
    sampled = sum(spent.values()) or 1.0
    return {
        "workers": workers,
        "env_steps_per_s": steps / seconds,
        "env_steps_per_s_per_worker": steps / seconds / workers,
        "iteration_s_median": float(np.median([r["iteration_s"] for r in timed])),
        "reflection_calls": rows[-1]["reflection_calls"],
        **{f"{key.removesuffix('_worker_s')}_share": spent[key] / sampled for key in TIME_SPLIT},
    }


def reflection_server(config: ReflectRLConfig) -> VLLMServer:
    """The config's reflection model served by vLLM (use as a context manager), shared by every
    variant of a benchmark so they compare against the same server."""
    return VLLMServer(
        resolve_or_build(config.reflection.model),
        Path(tempfile.mkdtemp()) / "vllm.log",
        served_model_name=config.reflection.request_model,
        max_model_len=config.reflection.max_model_len,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default="configs/smoke.yaml")
    parser.add_argument("--iterations", type=int, default=4)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    with reflection_server(load_config(args.config)) as server:
        overrides = ["reflection.server=url", f"reflection.url={server.url}"]
        rows = [measure(args.config, overrides, w, args.iterations) for w in (1, 2)]
    rows[1]["speedup_vs_1"] = rows[1]["env_steps_per_s"] / rows[0]["env_steps_per_s"]
    print_table(rows, ["workers", "env_steps_per_s", "iteration_s_median", "speedup_vs_1"])
    path = write_results(
        "env_throughput", {"config": args.config, "iterations": args.iterations, "results": rows}
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
