"""Question: how many PPO iterations do the learning tests of tests/test_learning.py need, with
each advantage estimator and action head they run?
Answer (see docs/diagnostics.md): fewer than they ran (8): over run.seed 0-2, greedy success on
the five starts reaches 1.0 within 2-4 iterations and is 1.0 after iteration 6 in all nine runs
(0.8 at worst after iteration 5), and the sampled success of one of iterations 4-6 tops the
first iteration's by 0.3-0.8. The tests now run 6 iterations and ask for 0.8 and +0.2.
Results: diagnostics/results/learning_test_budget.json.

With `--num-epochs 2` (half the tests' PPO epochs per batch, to spend less time): greedy
success is 1.0 after iteration 6 in all nine runs too, but first reaches 1.0 after 2-5
iterations, and PPO with seed 1 is back at 0.6 after iteration 5: a thinner margin than the
time saved is worth, so the tests keep 4 epochs.
Results: diagnostics/results/learning_test_budget_epochs2.json.

Each run is the test's own: its config (`FROM_REWARD` and the test's overrides), 2 rollout
workers, and the greedy policy played once from each of the five starts, before RL and after
every iteration.

    python -m diagnostics.learning_test_budget [--iterations 7] [--seeds 0 1 2]
        [--num-epochs N]  (N other than the tests': results under learning_test_budget_epochsN)
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import print_table, write_results
from diagnostics.common import RESULTS

# The tests' variants: tests/test_learning.py, test_ppo_from_reward_alone_..., test_gigpo_...,
# test_ppo_with_the_text_action_head_...
VARIANTS = {
    "ppo_overlapped": ["ppo.max_staleness=1"],
    "gigpo": ["rl.advantage=gigpo", "ppo.batch_mode=complete_episodes"],
    "ppo_text_head": ["policy.action_head=text"],
}


def curve(variant: str, seed: int, iterations: int, epochs: list[str]) -> dict[str, Any]:
    import ray

    from reflectrl.config import load_config
    from reflectrl.rl.driver import Run
    from tests.support.policy_copy import policy_copy
    from tests.test_learning import FROM_REWARD, REPO, handful_greedy_success

    overrides = [*FROM_REWARD, *VARIANTS[variant], f"run.seed={seed}", *epochs]
    config = load_config(REPO / "configs" / "smoke.yaml", overrides)
    greedy_success = handful_greedy_success(config)
    started = time.perf_counter()
    ray.init(address="local", num_cpus=3, include_dashboard=False, log_to_driver=False)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            run = Run(config, Path(tmp) / "run", workers=2)
            try:
                run.start()
                policy = policy_copy(run)
                greedy, sampled = [greedy_success(policy)], []
                for _ in range(iterations):
                    sampled.append(round(run.train_iteration()["success_rate"], 3))
                    policy.load_trainable_state(run.algo.policy_state())
                    greedy.append(greedy_success(policy))
            finally:
                run.close()
    finally:
        ray.shutdown()
    return {
        "variant": variant,
        "seed": seed,
        "greedy_after_iteration": greedy,  # index 0: before RL
        "sampled_success": sampled,
        "seconds": round(time.perf_counter() - started, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=7)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--variant", choices=list(VARIANTS), action="append")
    parser.add_argument("--num-epochs", type=int, help="ppo.num_epochs (default: the tests')")
    args = parser.parse_args()
    epochs = [] if args.num_epochs is None else [f"ppo.num_epochs={args.num_epochs}"]
    rows = [
        curve(variant, seed, args.iterations, epochs)
        for seed in args.seeds
        for variant in args.variant or list(VARIANTS)
    ]
    print_table(
        [
            {**r, "greedy": r["greedy_after_iteration"], "sampled": r["sampled_success"]}
            for r in rows
        ],
        ["variant", "seed", "greedy", "sampled", "seconds"],
    )
    flags = [f"--iterations {args.iterations}", "--seeds", *map(str, args.seeds)]
    name = "learning_test_budget"
    if args.num_epochs is not None:
        flags.append(f"--num-epochs {args.num_epochs}")
        name += f"_epochs{args.num_epochs}"
    command = "python -m diagnostics.learning_test_budget " + " ".join(flags)
    path = write_results(name, {"command": command, "runs": rows}, RESULTS)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
