"""Question: does a short SFT of SmolLM2 on this machine give a policy that solves held-out
DangerousTaxi, with or without the SFT reflection adapter?
Answer (see docs/getting-started.md): no: 150 episodes and 60 steps per player (22 minutes on 2
cores) lower the policy's held-out completion loss from 8.4 to 0.9, but it solves none of 16
held-out `full` episodes either way.
Results: diagnostics/results/sft_heldout.json.

Held-out success of the SFT-only SmolLM2 policy on DangerousTaxi, with and without the SFT
reflection adapter, after a short SFT on this machine (and the time it took).

Runs `reflectrl launch` with `rl.enabled=false eval.enabled=false` (data + SFT of both players,
SmolLM2 LoRA), then evaluates on the held-out start states (greedy and sampled):
    sft policy + sft reflection adapter    the method's warm start
    sft policy + base reflection model     what the reflection SFT adds
    untrained policy + base reflections    the reference
Each evaluation starts its own vLLM server; all run on the same Ray.

    python -m diagnostics.sft_heldout [--episodes 200] [--steps 150] [--eval-episodes 30]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import print_table, write_results
from diagnostics.common import RESULTS

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--episodes", type=int, default=200, help="SFT data episodes")
    parser.add_argument("--steps", type=int, default=150, help="SFT steps per player")
    parser.add_argument("--eval-episodes", type=int, default=30, help="per stage and decoding")
    parser.add_argument("--stages", default="[full]")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--run", type=Path, help="run directory (default: a temporary one)")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    run = args.run or Path(tempfile.mkdtemp()) / "run"
    settings = [
        f"data.episodes={args.episodes}",
        f"sft.max_steps={args.steps}",
        f"eval.episodes={args.eval_episodes}",
        f"eval.stages={args.stages}",
    ]
    started = time.perf_counter()
    if not (run / "stages" / "sft.json").is_file():
        command = [sys.executable, "-m", "reflectrl.cli", "launch", "--output", str(run)]
        command += ["--workers", str(args.workers), "--set", "rl.enabled=false"]
        command += ["--set", "eval.enabled=false"]
        for item in settings:
            command += ["--set", item]
        subprocess.run(command, check=True, cwd=REPO)
    pipeline_s = time.perf_counter() - started

    import json

    import ray

    from reflectrl.cluster.ray_init import init_ray
    from reflectrl.config import load_config
    from reflectrl.evaluation.commands import evaluate_with
    from reflectrl.evaluation.held_out import PolicySource

    base = load_config(run / "config.yaml")
    sft = {s: json.loads((run / "stages" / f"{s}.json").read_text()) for s in ("data", "sft")}
    policy, reflection = run / "sft" / "policy", run / "sft" / "reflection"
    variants: dict[str, tuple[list[str], PolicySource]] = {
        "sft policy + sft reflection": (
            [f"policy.init_adapter={policy}", f"reflection.adapter={reflection}"],
            PolicySource(sft_adapter=policy),
        ),
        "sft policy + base reflection": (
            [f"policy.init_adapter={policy}"],
            PolicySource(sft_adapter=policy),
        ),
        "untrained policy + base reflection": ([], PolicySource()),
    }
    rows: list[dict[str, Any]] = []
    init_ray(None, base, args.workers)
    try:
        for name, (overrides, source) in variants.items():
            config = load_config(run / "config.yaml", overrides)
            t = time.perf_counter()
            report = evaluate_with(config, source, args.workers, run)
            greedy, sampled = report["greedy"]["all"], report["sampled"]["all"]
            rows.append(
                {
                    "variant": name,
                    "episodes": greedy["episodes"],
                    "greedy": greedy["success_rate"],
                    "greedy_ci95": greedy["success_ci95"],
                    "sampled": sampled["success_rate"],
                    "sampled_ci95": sampled["success_ci95"],
                    "greedy_return": greedy["return_mean"],
                    "eval_s": round(time.perf_counter() - t, 1),
                }
            )
            print_table(rows[-1:], ["variant", "episodes", "greedy", "sampled", "eval_s"])
    finally:
        ray.shutdown()
    print_table(rows, ["variant", "episodes", "greedy", "sampled", "greedy_return", "eval_s"])
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO
    ).stdout.strip()
    path = write_results(
        "sft_heldout",
        {
            "commit": commit,
            "model": "smollm2 (policy and reflection, LoRA)",
            "settings": settings,
            "data_and_sft_s": round(pipeline_s, 1),
            "stages": sft,
            "variants": rows,
        },
        folder=RESULTS,
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
