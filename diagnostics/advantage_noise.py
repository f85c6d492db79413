"""Question: how far is one batch's policy gradient, under each learned advantage estimate,
from the policy gradient of the exact advantage, and which lever (a larger batch, group resets,
a shorter horizon, TD over the state table) brings it closer?

Answer (docs/rl.md, "What the learned estimates miss"): not noise. Against the advantage they
estimate, the one with the step limit, the table estimators come as close as its exact value
at the sampled actions (cosine 0.58-0.60 against 0.65 at 2,048 env steps); that advantage and
the step-limit-free one that lifts point apart (0.17). Bootstrapping a cut return from the table
(`mc_table_bootstrap`) turns toward the latter (0.17 -> 0.29; 0.24 -> 0.47 at 8,192 steps).
Results: diagnostics/results/advantage_noise.json.

Why: on the map-reading SFT players the exact advantage lifts held-out success by +0.244 in 61k
env steps, the state table by +0.194 and the pipeline by +0.133
(diagnostics/oracle_advantages.py); what is left to lower is the estimate's noise.

How: the SFT policy of a run, as a table of action probabilities per prompt (as in
diagnostics/oracle_advantages.py), samples `--batches` batches per setting
(diagnostics/taxi_rollouts.py). For a softmax over a table, step t moves the logits of its
prompt by A_t (onehot(a_t) - pi(.|s_t)), so a batch's gradient is a [prompts, actions] matrix.
Its reference, per batch, is the expected gradient given the batch's visits:
sum over the visits of s of pi(.|s) * A^pi(s, .), with A^pi the exact advantage of this policy
(`exact_advantages`, gamma `--gamma`, the rollouts' reward). Each estimator's score is the
cosine between its batch gradient and that reference, after the batch's advantages are
centred (as the pipeline standardises them; the scale does not change a cosine), averaged over
the batches after the first (the tables then hold earlier batches of the same policy: an
upper bound for a policy that moves). `exact` (A^pi at the sampled action) gives the floor
that sampling the actions leaves. Estimators and their tables: diagnostics/taxi_rollouts.py.

    python -m diagnostics.advantage_noise --run RUN --reflection-cache FILE --danger-penalty -100

Writes diagnostics/results/NAME.json (default advantage_noise).
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.common import print_table, write_results
from diagnostics.common import RESULTS
from diagnostics.failure_modes import load_players
from diagnostics.oracle_advantages import exact_advantages, step_limit_advantages
from diagnostics.taxi_prompts import Prompts, logits_of
from diagnostics.taxi_rollouts import Step, TableCritics, TaxiRollouts
from reflectrl.envs.taxi import TaxiOptions

# (name, table estimator or None for an exact one, lambda)
ESTIMATORS = [
    ("exact", None, 0.0),
    ("exact_step_limit", None, 0.0),
    ("mc_batch", "mc_batch", 0.0),
    ("mc_table", "mc_table", 0.0),
    ("mc_table_bootstrap", "mc_table_bootstrap", 0.0),
    ("q_table", "q_table", 0.0),
    ("td_table_lam0", "td_table", 0.0),
    ("td_table_lam0.9", "td_table", 0.9),
    ("td_model", "td_model", 0.0),
    ("q_model", "q_model", 0.0),
]


def batch_gradient(steps: list[Step], adv: np.ndarray, probs: np.ndarray) -> np.ndarray:
    """sum_t A_t (onehot(a_t) - pi(.|s_t)), as a [prompts, actions] matrix."""
    grad = np.zeros_like(probs)
    rows = np.array([s["row"] for s in steps])
    np.add.at(grad, rows, -adv[:, None] * probs[rows])
    np.add.at(grad, (rows, np.array([s["action"] for s in steps])), adv)
    return grad


def exact_at(table: dict[str, np.ndarray], step: Step, max_steps: int | None) -> np.ndarray:
    """A^pi(s, .) at a step: of `exact_advantages`, or with `max_steps` of
    `step_limit_advantages` at the steps the episode had left."""
    if max_steps is None:
        return table[step["stage"]][step["state"]]
    return table[step["stage"]][max_steps - step["t"], step["state"]]


def expected_gradient(steps: list[Step], table: Any, probs: np.ndarray, max_steps: int | None):
    """sum over the batch's visits of pi(.|s) * A^pi(s, .): the gradient the exact advantage
    gives in expectation over the actions, at the states this batch visited."""
    grad = np.zeros_like(probs)
    for s in steps:
        grad[s["row"]] += probs[s["row"]] * exact_at(table, s, max_steps)
    return grad


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float((a * b).sum() / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-12))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--run", type=Path, required=True)
    parser.add_argument("--reflection-cache", type=Path)
    parser.add_argument("--danger-penalty", type=float)
    parser.add_argument("--gamma", type=float, default=0.99, help="the objective's discount")
    parser.add_argument("--estimator-gammas", default="0.99,0.95,0.9")
    parser.add_argument("--batch-steps", default="2048,8192")
    parser.add_argument("--groups", default="1,8")
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--envs", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--name", default="advantage_noise")
    args = parser.parse_args()
    started = time.perf_counter()
    players = load_players(args.run, after_rl=False)
    options = dict(players.config.env.options)
    prompts = Prompts(players, TaxiOptions(**options), args.reflection_cache)
    if args.danger_penalty is not None:  # after the prompts: reflections read no reward
        options["danger_penalty"] = args.danger_penalty
    with torch.no_grad():
        logits = logits_of(players.policy.eval(), prompts.rows)
    logp_table = torch.log_softmax(logits, -1)
    probs = logp_table.exp().numpy()
    rollout_options = TaxiOptions(**options)
    gammas = {args.gamma, *map(float, args.estimator_gammas.split(","))}
    limit = rollout_options.max_steps
    exact = {g: exact_advantages(prompts, probs, rollout_options, g) for g in gammas}
    finite = {g: step_limit_advantages(prompts, probs, rollout_options, g) for g in gammas}
    # The references: the step limit ignored (what `--advantage exact` trains with), or kept.
    references = {"": (exact[args.gamma], None), "@limit": (finite[args.gamma], limit)}
    rows: list[dict[str, Any]] = []
    settings = itertools.product(
        map(int, args.batch_steps.split(",")),
        map(int, args.groups.split(",")),
        map(float, args.estimator_gammas.split(",")),
    )
    for batch_steps, group, gamma in settings:
        rng = np.random.default_rng(args.seed)
        train = TaxiOptions(**{**options, "split": "train"})
        stages = ["pickup", "dropoff", "full"]
        rollouts = TaxiRollouts(prompts, train, stages, args.envs, args.seed, rng, gamma, group)
        generator = torch.Generator().manual_seed(args.seed)
        critics = {name: TableCritics(*probs.shape) for name, *_ in ESTIMATORS}
        scores: dict[str, list[float]] = {
            name + ref: [] for name, *_ in ESTIMATORS for ref in references
        }
        for _ in range(args.batches):
            steps, _, _ = rollouts.batch(logp_table, batch_steps, generator)
            targets = {
                ref: expected_gradient(steps, table, probs, cut)
                for ref, (table, cut) in references.items()
            }
            for name, kind, lam in ESTIMATORS:
                if kind is None:
                    table, cut = (finite[gamma], limit) if "limit" in name else (exact[gamma], None)
                    adv = np.array([exact_at(table, s, cut)[s["action"]] for s in steps])
                else:
                    adv = critics[name].advantages(kind, steps, probs, gamma, lam)
                grad = batch_gradient(steps, adv - adv.mean(), probs)
                for ref, target in targets.items():
                    scores[name + ref].append(cosine(grad, target))
        row = {"batch_steps": batch_steps, "group": group, "gamma": gamma}
        for name, values in scores.items():
            row[name] = round(float(np.mean(values[1:] or values)), 3)
            row[f"{name}_first"] = round(values[0], 3)
        rows.append(row)
        print(row, flush=True)
    columns = ["batch_steps", "group", "gamma"]
    columns += [name + ref for ref in references for name, *_ in ESTIMATORS]
    print_table(rows, columns)
    settings_out = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    path = write_results(
        args.name,
        {
            "command": "python -m diagnostics.advantage_noise " + " ".join(sys.argv[1:]),
            "settings": settings_out,
            "prompts": len(prompts.rows),
            "rows": rows,
            "wall_s": round(time.perf_counter() - started),
        },
        folder=RESULTS,
    )
    print(path)


if __name__ == "__main__":
    main()
