"""Question: what does the CPU recipe reach end to end, and how long does each stage take?
Answer (see README.md, docs/getting-started.md): on 2 CPU cores about 15 minutes (data 10 s, SFT
6 min, RL 8.2 min, eval 25 s), and 178 of the 180 held-out episodes solved greedily (0.989),
already 0.989 before RL.
Results: diagnostics/results/cpu_recipe.json.

The CPU recipe end to end, as `make run` starts it on a machine without CUDA: every stage's
wall time and the held-out success it reaches (configs/cpu.yaml, 2 rollout workers).

Runs `reflectrl launch` (no --config: the machine's recipe) in a fresh run directory, then
reads the run's own files (stages/*.json, the eval JSON, metrics.jsonl). Writes
diagnostics/results/cpu_recipe.json.

    python -m diagnostics.cpu_recipe [--run DIR] [--workers 2] [--set KEY=VALUE ...]
    python -m diagnostics.cpu_recipe --from-run DIR   # a finished run of the recipe, not rerun

With `--from-run` the figures are those the run wrote (its stages' wall times, which leave out
the few seconds Ray takes to start); the run's config must be the recipe's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import print_table, write_results
from diagnostics.common import RESULTS
from reflectrl.config import load_config
from reflectrl.experiment.results import curve, run_summary

REPO = Path(__file__).resolve().parents[1]
CURVE_KEYS = (
    "iteration",
    "env_steps",
    "success_rate",
    "stage",
    "episode_return_mean",
    "iteration_s",
    "eval_success_rate",  # held-out greedy success, every eval.every iterations
    "eval_success_rate_sampled",
)
BUDGET_S = 3600  # the recipe's promise: <= 60 min on 2 cores, install excluded


def eval_by_stage(run: Path, summary: dict) -> dict:
    """Held-out success per stage and decoding, from the run's eval JSON."""
    if not summary["finished"]:
        return {}
    report = json.loads((run / summary["eval_file"]).read_text())
    return {
        decoding: {stage: s["success_rate"] for stage, s in report[decoding]["stages"].items()}
        for decoding in ("greedy", "sampled")
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--run", type=Path, help="run directory (default: a temporary one)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--from-run", type=Path, help="a finished run of the recipe to report")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.from_run:
        run = args.from_run
        recipe = load_config(REPO / "configs" / "cpu.yaml", args.overrides)
        ran = load_config(run / "config.yaml")
        if ran.model_copy(update={"run": recipe.run}) != recipe:
            sys.exit(f"{run} was not run with configs/cpu.yaml (+ --set); pass a run of it")
        wall = sum(run_summary(run)["stage_seconds"].values())
    else:
        run = args.run or Path(tempfile.mkdtemp(prefix="cpu-recipe-")) / "run"
        command = [sys.executable, "-m", "reflectrl.cli", "launch", "--workers",
                   str(args.workers), "--output", str(run)]  # fmt: skip
        for override in args.overrides:
            command += ["--set", override]
        started = time.perf_counter()
        subprocess.run(command, check=True, cwd=REPO)
        wall = time.perf_counter() - started
    summary = run_summary(run)
    rows = curve(run)
    stage_rows = [{"stage": k, "seconds": v} for k, v in summary["stage_seconds"].items()]
    stage_rows.append({"stage": "total", "seconds": round(wall, 1)})
    print_table(stage_rows, ["stage", "seconds"])
    outcome = {
        "held-out success before RL, greedy": summary.get("success_before_rl_greedy"),
        "held-out success, greedy": summary["success_greedy"],
        "held-out success, sampled": summary["success_sampled"],
        "within 60 min": wall <= BUDGET_S,
    }
    for key, value in outcome.items():
        print(f"{key}: {value}")
    write_results(
        "cpu_recipe",
        {
            "command": "python -m diagnostics.cpu_recipe " + " ".join(sys.argv[1:]),
            "config": "configs/cpu.yaml",
            "overrides": args.overrides,
            "from_run": str(args.from_run) if args.from_run else None,
            "workers": args.workers,
            "wall_s": round(wall, 1),
            "budget_s": BUDGET_S,
            "within_budget": wall <= BUDGET_S,
            "summary": summary,
            "eval_by_stage": eval_by_stage(run, summary),
            "rl_curve": [{k: r.get(k) for k in CURVE_KEYS} for r in rows],
        },
        folder=RESULTS,
    )


if __name__ == "__main__":
    main()
