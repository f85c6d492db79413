"""Question: does PPO learn Taxi from reward alone (no SFT, no reflection, a random-init model)?
Answer (see docs/diagnostics.md): not here: held-out greedy success stayed 0.00 in every variant
run (up to 67k env steps); with Taxi's own penalty PPO learns to end its episodes at once.
Results: diagnostics/results/ppo_from_scratch_*.json.

PPO from reward alone: no SFT, no reflection, a random-init scratch model, Taxi `pickup` then
`full` with the curriculum. Held-out greedy success (every test start state once, stage `full`)
against env steps, one `reflectrl launch` per seed (real Ray and RLlib).

    python -m diagnostics.ppo_from_scratch [--variant NAME] [--seeds 0,1,2] [--iterations 290]
                                          [--every 10] [--set KEY=VALUE ...] [--report-only]

Variants (`--variant`): `paper_penalty` keeps Taxi's own rewards (a dangerous no-op: -10 / 20,
a step: -1 / 20); `no_suicide` (the default) makes the dangerous no-op cost more than any
episode of steps can (-200 / 20): with the paper's penalty, and GAE bootstrapping the step
limit, ending an episode at once is worth more than wandering, and PPO from a random policy
learns to end its episodes (see the results' curves).
`explore` keeps Taxi's rewards but adds an entropy bonus of 0.2 and a `dropoff` stage: what
the same PPO over a one-hot state needed to learn `full` (diagnostics/ppo_tabular.py);
`explore_coordinates` also names each letter's cell under the grid (env.options.coordinates).

Each run's directory is `runs/ppo_from_scratch/<variant>-seed<S>` (its metrics.jsonl holds the
curve); the curves go to diagnostics/results/ppo_from_scratch_<variant>.json. A finished seed
is read, not rerun; `--report-only` reads what the runs wrote so far.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
ALL_LINEAR = "[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]"
# What a random-init model needs to learn from reward (see the result's `settings`): a LoRA
# over every linear layer with a rank near the width (128), so the whole network can move.
OVERRIDES = [
    "sft.enabled=false",
    "reflection.enabled=false",
    f"policy.lora.target_modules={ALL_LINEAR}",
    "policy.lora.r=32",
    "policy.lora.alpha=32",
    "ppo.lr=0.001",
    "ppo.num_epochs=4",
    "ppo.entropy_coeff=0.01",
    "curriculum.stages=[{name: pickup, success_threshold: 0.8, max_iterations: 60}, {name: full}]",
    "eval.stages=[full]",
    "eval.enabled=false",  # the curve's last point is the final held-out figure
]
THREE_STAGES = (
    "curriculum.stages=[{name: pickup, success_threshold: 0.8, max_iterations: 60}, "
    "{name: dropoff, success_threshold: 0.8, max_iterations: 60}, {name: full}]"
)
VARIANTS = {
    "paper_penalty": [],
    "no_suicide": ["env.options.danger_penalty=-200"],
    # What a PPO over a one-hot state needed to reach 0.95 / 0.95 / 0.82 on `full` within 300k
    # env steps (diagnostics/ppo_tabular.py): an entropy bonus of 0.2 and a `dropoff` stage.
    "explore": ["ppo.entropy_coeff=0.2", THREE_STAGES],
    # The same, with the status line naming each letter's cell (env.options.coordinates): told
    # the answer, the trunk reads first moves 0.82 of the time from it, 0.57 from the grid alone
    # (diagnostics/grid_reading.py).
    "explore_coordinates": ["ppo.entropy_coeff=0.2", THREE_STAGES, "env.options.coordinates=true"],
}


def run_seed(seed: int, args: argparse.Namespace) -> dict[str, Any]:
    out = REPO / "runs" / "ppo_from_scratch" / f"{args.variant}-seed{seed}"
    done = out / "stages" / "rl.json"
    if not done.is_file() and not args.report_only:
        command = [
            sys.executable, "-m", "reflectrl.cli", "launch", "--workers", "2",
            "--config", str(REPO / "configs" / "cpu.yaml"), "--iterations", str(args.iterations),
            *[f"--set={o}" for o in [*settings(args), f"run.seed={seed}",
                                     f"eval.every={args.every}"]],
        ]  # fmt: skip
        resume = (out / "config.yaml").is_file()
        command += ["--resume", str(out)] if resume else ["--output", str(out)]
        subprocess.run(command, cwd=REPO, check=True)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    curve = [
        {"env_steps": r["env_steps"], "stage": r["stage"], "greedy": r["eval_success_rate"],
         "sampled": r["eval_success_rate_sampled"]}
        for r in rows if "eval_success_rate" in r
    ]  # fmt: skip
    before = out / "eval_before_rl.json"
    if before.is_file():  # the untrained policy: the curve's first point
        first = json.loads(before.read_text())
        curve.insert(0, {"env_steps": 0, "stage": "pickup", "greedy": first["eval_success_rate"],
                         "sampled": first["eval_success_rate_sampled"]})  # fmt: skip
    switches = [
        {"env_steps": r["env_steps"], "to": r["next_stage"]}
        for r in rows
        if r.get("next_stage") and r["next_stage"] != r["stage"]
    ]
    training = [
        {"env_steps": r["env_steps"], "success": r["success_rate"],
         "return": r["episode_return_mean"], "length": r["episode_len_mean"],
         "iteration_s": r["iteration_s"], "update_s": r["update_s"]}
        for r in rows
    ]  # fmt: skip
    best = max((p["greedy"] for p in curve), default=0.0)
    return {"seed": seed, "dir": str(out.relative_to(REPO)), "curve": curve, "training": training,
            "stage_switches": switches, "best_greedy": best,
            "final_greedy": curve[-1]["greedy"] if curve else None,
            "env_steps": rows[-1]["env_steps"] if rows else 0}  # fmt: skip


def settings(args: argparse.Namespace) -> list[str]:
    return [*OVERRIDES, *VARIANTS[args.variant], *args.set]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--variant", choices=sorted(VARIANTS), default="no_suicide")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--iterations", type=int, default=290, help="1024 env steps each")
    parser.add_argument("--every", type=int, default=10, help="held-out eval every N iterations")
    parser.add_argument("--set", action="append", default=[], help="extra config overrides")
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args()
    from benchmarks.common import print_table, write_results
    from diagnostics.common import RESULTS

    started = time.perf_counter()
    seeds = [run_seed(int(s), args) for s in args.seeds.split(",")]
    rows = [{"seed": s["seed"], "env_steps": s["env_steps"], "best_greedy": s["best_greedy"],
             "final_greedy": s["final_greedy"]} for s in seeds]  # fmt: skip
    print_table(rows, ["seed", "env_steps", "best_greedy", "final_greedy"])
    command = "python -m diagnostics.ppo_from_scratch " + " ".join(sys.argv[1:])
    wall_s = round(time.perf_counter() - started)
    payload = {"command": command, "variant": args.variant, "settings": settings(args),
               "seeds": seeds, "wall_s": wall_s}  # fmt: skip
    path = write_results(f"ppo_from_scratch_{args.variant}", payload, folder=RESULTS)
    print(path)


if __name__ == "__main__":
    main()
