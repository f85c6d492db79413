"""Question: does a policy's last-token state (the input the label logits and the value head
read) tell Taxi grids apart, over every train start of stage `pickup`?
Answer (see docs/diagnostics.md, docs/rl.md): hardly: the recipe's random-init trunk maps the
240 start prompts to states at a mean pairwise cosine of 0.998, though a linear probe on them
still predicts 0.72 of held-out first moves.
Results: diagnostics/results/grid_separation.json.

For each model: the mean pairwise cosine of the last-token states of the start prompts (no
reflection), their spread around the mean (|h - mean| / |mean|), and how well a linear probe
on those states predicts the expert's first action (fit on 3/4 of the starts, scored on the
rest): a PPO policy is a linear read-out of this state, so a trunk that maps every grid to
nearly the same vector leaves it little to learn from.

    python -m diagnostics.grid_separation [--model scratch:dangerous_taxi] [--model DIR ...]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import print_table, write_results
from diagnostics.common import RESULTS

REPO = Path(__file__).resolve().parents[1]


def measure(model: str, probe_steps: int) -> dict[str, Any]:
    import numpy as np
    import torch

    from reflectrl.config import load_config
    from reflectrl.data.scratch import resolve_or_build
    from reflectrl.envs.taxi import ACTIONS, expert_action
    from reflectrl.models.loading import load_tokenizer
    from reflectrl.models.policy import OptionPolicy
    from reflectrl.rollout.vector_env import ReflectRLVectorEnv

    config = load_config(REPO / "configs" / "cpu.yaml", ["reflection.enabled=false"])
    model_dir = resolve_or_build(model)
    env = ReflectRLVectorEnv(config, load_tokenizer(model_dir), None, num_envs=1)
    env.set_stage("pickup")
    policy = OptionPolicy(model_dir, env.label_ids, seed=0).eval()
    starts = env.envs[0].unwrapped.start_ids("pickup") or []
    hidden, targets = [], []
    for start in starts:
        env.set_starts([[start]])
        obs, _ = env.reset()
        with torch.no_grad():
            ids, mask = torch.as_tensor(obs["input_ids"]), torch.as_tensor(obs["attention_mask"])
            hidden.append(policy.encode(ids, mask)[0])
        targets.append(expert_action(env.envs[0].unwrapped))
    h = torch.stack(hidden)
    unit = torch.nn.functional.normalize(h, dim=-1)
    cosine = unit @ unit.T
    off_diagonal = cosine[~torch.eye(len(h), dtype=torch.bool)]
    spread = (h - h.mean(0)).norm(dim=-1) / h.mean(0).norm()
    y = torch.tensor(targets)
    order = torch.randperm(len(h), generator=torch.Generator().manual_seed(0))
    cut = len(h) * 3 // 4
    fit, held = order[:cut], order[cut:]
    x = (h - h[fit].mean(0)) / (h[fit].std(0) + 1e-6)  # standardised: the probe sees spread
    torch.manual_seed(0)  # the probe's init
    probe = torch.nn.Linear(h.shape[1], len(ACTIONS))
    optimizer = torch.optim.Adam(probe.parameters(), lr=0.01)
    for _ in range(probe_steps):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(probe(x[fit]), y[fit]).backward()
        optimizer.step()
    with torch.no_grad():
        predicted = probe(x).argmax(-1)
    majority = float(np.bincount(y[fit].numpy()).max() / len(fit))
    return {
        "model": model,
        "starts": len(starts),
        "mean_cosine": float(off_diagonal.mean()),
        "min_cosine": float(off_diagonal.min()),
        "spread_mean": float(spread.mean()),
        "probe_fit_accuracy": float((predicted[fit] == y[fit]).float().mean()),
        "probe_held_out_accuracy": float((predicted[held] == y[held]).float().mean()),
        "majority_action_share": majority,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", action="append", help="policy model specs or directories")
    parser.add_argument("--probe-steps", type=int, default=500)
    parser.add_argument("--out", default="grid_separation")
    args = parser.parse_args()
    started = time.perf_counter()
    rows = [measure(m, args.probe_steps) for m in args.model or ["scratch:dangerous_taxi"]]
    print_table(rows, ["model", "starts", "mean_cosine", "min_cosine", "spread_mean",
                       "probe_fit_accuracy", "probe_held_out_accuracy",
                       "majority_action_share"])  # fmt: skip
    command = "python -m diagnostics.grid_separation " + " ".join(sys.argv[1:])
    payload = {"command": command, "rows": rows, "wall_s": round(time.perf_counter() - started)}
    print(write_results(args.out, payload, folder=RESULTS))


if __name__ == "__main__":
    main()
