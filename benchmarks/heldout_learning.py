"""Held-out success before and after a short PPO run (tiny model, no reflection, real Ray/RLlib).

DangerousTaxi `pickup` from random start states: train for `--iterations` iterations on the
smoke shape (2 workers x 2 envs x 16 steps), then run the greedy and the sampled policy on
start states drawn from a stream training never uses (run.seed 10_000 + k). Taxi has only
~300 start states, so "held-out" here means unseen *draws*, not unseen states (METHOD.md).
To measure a change before and after, run each commit's own copy of this file from a checkout
of that commit (the package's layout moves between commits, and the script imports it):
    git worktree add /tmp/before <commit> && cd /tmp/before && python -m benchmarks.heldout_learning

    python -m benchmarks.heldout_learning [--iterations 30] [--seed 0] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OVERRIDES = [
    "reflection.enabled=false",
    "env.options.max_steps=12",
    "curriculum.stages=[{name: pickup}]",
    "ppo.lr=0.003",
    "ppo.entropy_coeff=0.0",
    "ppo.num_epochs=4",
    "policy.lora.target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    from reflectrl.config import load_config
    from reflectrl.data.model_dirs import resolve_model
    from reflectrl.evaluation.episodes import evaluate
    from reflectrl.models.loading import load_tokenizer
    from reflectrl.rl.driver import Run
    from reflectrl.rollout.vector_env import ReflectRLVectorEnv
    from tests.support.policy_copy import policy_copy

    config = load_config(REPO / "configs" / "smoke.yaml", [*OVERRIDES, f"run.seed={args.seed}"])
    held_out = load_config(
        REPO / "configs" / "smoke.yaml", [*OVERRIDES, f"run.seed={10_000 + args.seed}"]
    )
    tokenizer = load_tokenizer(resolve_model(config.policy.model))
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO
    ).stdout.strip()

    def held_out_success(policy: object) -> dict[str, float]:
        result = {}
        for name, greedy in (("greedy", True), ("sampled", False)):
            env = ReflectRLVectorEnv(held_out, tokenizer, None, num_envs=4, worker_index=7)
            env.set_stage("pickup")
            outcome = evaluate(policy, env, episodes=args.episodes, greedy=greedy, seed=1)
            result[f"{name}_success"] = outcome.success_rate
            result[f"{name}_return"] = outcome.return_mean
        return result

    ray.init(address="local", num_cpus=3, include_dashboard=False, log_to_driver=False)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        run = Run(config, Path(tmp) / "run", workers=2)
        try:
            run.start()
            policy = policy_copy(run)
            before = held_out_success(policy)
            curve = []
            for _ in range(args.iterations):
                row = run.train_iteration()
                curve.append(
                    {k: row[k] for k in ("iteration", "env_steps", "success_rate",
                                         "episode_return_mean")}
                )  # fmt: skip
                print(json.dumps(curve[-1]), flush=True)
            policy.load_trainable_state(run.algo.policy_state())
            after = held_out_success(policy)
        finally:
            run.close()
            ray.shutdown()
    import reflectrl

    result = {
        "commit": commit,
        "code": str(Path(reflectrl.__file__).parent),
        "seed": args.seed,
        "iterations": args.iterations,
        "env_steps": curve[-1]["env_steps"] if curve else 0,
        "wall_s": time.perf_counter() - started,
        "before": before,
        "after": after,
        "curve": curve,
    }
    print(json.dumps({k: v for k, v in result.items() if k != "curve"}, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
