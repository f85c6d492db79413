"""What the text action head costs against the label head, per env step, on the same rows.

Both heads score the same observation batches of a CPU recipe's env (its `policy.model`, the
no-reflection layout: a reflection would lengthen every prompt alike, so the text head's
share is, if anything, overstated here), from envs stepped with seeded random actions:
- rollout: the menu's logits without gradients, `--batch` rows at a time (a worker's envs);
- update: logits, the log-probability of the row's first valid action, backward, with every
  LM weight trainable, `--batch` rows at a time (a learner's micro-batch).
Reported per env and head: milliseconds per row for each, and the text head's ratio to the
label head's in the same run, beside the prompt and action lengths the cost comes from.

    python -m benchmarks.action_head_cost [--config configs/cpu.yaml
        --config configs/auto_explore_cpu.yaml] [--rows 256] [--batch 8] [--repeats 2]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.common import print_table, write_results

REPO = Path(__file__).resolve().parents[1]
CONFIGS = ("configs/cpu.yaml", "configs/auto_explore_cpu.yaml")


def observation_rows(config_path: Path, rows: int, batch: int) -> tuple[Any, Any, dict]:
    """(config, model dir, `rows` observation rows of the text head's env as tensors)."""
    from reflectrl.config import load_config
    from reflectrl.data.scratch import resolve_or_build
    from reflectrl.models.loading import load_tokenizer
    from reflectrl.rollout.vector_env import ReflectRLVectorEnv

    overrides = ["reflection.enabled=false", "policy.action_head=text"]
    config = load_config(config_path, overrides)
    model_dir = resolve_or_build(config.policy.model)
    env = ReflectRLVectorEnv(config, load_tokenizer(model_dir), None, num_envs=batch)
    rng = np.random.default_rng(config.run.seed)
    obs, _ = env.reset(seed=config.run.seed)
    batches = []
    while sum(len(b["input_ids"]) for b in batches) < rows:
        batches.append({k: np.asarray(v) for k, v in obs.items() if k != "live"})
        valid = [np.flatnonzero(m) for m in obs["option_mask"]]
        obs, *_ = env.step(np.array([rng.choice(v) if len(v) else 0 for v in valid]))
    stacked = {k: torch.as_tensor(np.concatenate([b[k] for b in batches])[:rows])
               for k in batches[0]}  # fmt: skip
    return config, model_dir, stacked


def timed(work: Any, repeats: int) -> float:
    """Best wall seconds of `repeats` runs of `work`, after one warm-up."""
    work()
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - started)
    return best


def head_cost(head: str, config: Any, model_dir: Path, rows: dict, args: Any) -> dict[str, Any]:
    from reflectrl.models.loading import load_tokenizer
    from reflectrl.models.policy import OptionPolicy
    from reflectrl.text.prompts import ACTION_MARKER
    from reflectrl.text.tokens import label_token_ids

    n = len(rows["input_ids"])
    labels = config.policy.labels[: rows["option_mask"].shape[1]]
    label_ids = label_token_ids(load_tokenizer(model_dir), labels, ACTION_MARKER)
    policy = OptionPolicy(model_dir, label_ids, seed=config.run.seed, action_head=head,
                          train_base=True)  # fmt: skip
    parts = [{k: v[i : i + args.batch] for k, v in rows.items()} for i in range(0, n, args.batch)]

    def rollout() -> None:
        with torch.no_grad():
            for part in parts:
                policy.logits_and_hidden(part)

    def update() -> None:
        for part in parts:
            logits, _ = policy.logits_and_hidden(part)
            first = part["option_mask"].argmax(dim=1)
            logp = torch.log_softmax(logits, -1)[torch.arange(len(first)), first]
            (-logp.mean()).backward()
        policy.zero_grad(set_to_none=True)

    policy.eval()
    rollout_s = timed(rollout, args.repeats)
    policy.train()
    update_s = timed(update, args.repeats)
    return {"rollout_ms_per_row": 1000 * rollout_s / n, "update_ms_per_row": 1000 * update_s / n}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", action="append", help=f"default: {', '.join(CONFIGS)}")
    parser.add_argument("--rows", type=int, default=256, help="observation rows per env")
    parser.add_argument("--batch", type=int, default=8, help="rows per forward")
    parser.add_argument("--repeats", type=int, default=2, help="timed runs (the best is kept)")
    parser.add_argument("--name", default="action_head_cost", help="results file name")
    args = parser.parse_args()
    torch.manual_seed(0)
    results = []
    for path in args.config or CONFIGS:
        config, model_dir, rows = observation_rows(REPO / path, args.rows, args.batch)
        costs = {head: head_cost(head, config, model_dir, rows, args) for head in ("label", "text")}
        valid = rows["option_mask"].sum(1)
        for head, cost in costs.items():
            results.append({
                "config": path, "env": config.env.name, "head": head, "rows": len(valid),
                "prompt_tokens": float(rows["attention_mask"].sum(1).float().mean()),
                "actions_per_row": float(valid.mean()),
                "tokens_per_action": float(rows["action_mask"].sum(-1).sum() / valid.sum()),
                **{k: round(v, 3) for k, v in cost.items()},
                "rollout_ratio": round(cost["rollout_ms_per_row"]
                                       / costs["label"]["rollout_ms_per_row"], 2),
                "update_ratio": round(cost["update_ms_per_row"]
                                      / costs["label"]["update_ms_per_row"], 2),
            })  # fmt: skip
            print(f"{config.env.name} {head}: {results[-1]}", file=sys.stderr)
    command = "python -m benchmarks.action_head_cost " + " ".join(sys.argv[1:])
    path = write_results(args.name, {"command": command.strip(), "rows": results})
    columns = ["env", "head", "prompt_tokens", "actions_per_row", "tokens_per_action"]
    columns += ["rollout_ms_per_row", "rollout_ratio", "update_ms_per_row", "update_ratio"]
    print_table(results, columns)
    print(path)


if __name__ == "__main__":
    main()
