"""Question: does the Taxi policy read anything but the reflection's hint?
Answer (see docs/rl.md): barely: the limited-data SFT policy follows the hint at every prompt
and cannot tell a wrong hint from a right one (auc 0.481, within-group TV 0.0001); policies
taught to doubt the hint read the grid (TV 0.30-0.36) but hardly tell wrong hints apart (auc
0.53-0.54).
Results: diagnostics/results/hint_dependence_*.json.

Every prompt a run's players can see (`diagnostics.taxi_prompts.Prompts`: one per
instruction and taxi state, its reflection generated greedily once) is scored by the policy:
the SFT policy, then the RL adapter of each `--checkpoint`. Prompts are grouped by what the hint
says: (instruction, the action the reflection quotes). The hint is right when that action is on
a shortest path to success. A policy that reads only the hint gives every prompt of a group the
same distribution; RL can then only make it follow hints more or less often, never leave a
wrong hint where it is wrong, and its greedy success stays the hint follower's. Per policy:
  - follows: the share of prompts whose argmax is the hinted action;
  - p_hint_right / p_hint_wrong: the mean probability of the hinted action where the hint is
    right / wrong (equal: the policy cannot tell them apart);
  - auc: over the pairs (wrong-hint prompt, right-hint prompt) of one group, the share where the
    wrong one puts less probability on the hint (0.5: blind to the grid; 1: it tells every wrong
    hint from the right ones);
  - within_group_tv: the mean total-variation distance between a prompt's distribution and its
    group's mean (0: the hint alone decides the distribution);
  - wrong_left: wrong-hint prompts whose argmax is a shortest-path action.

    python -m diagnostics.hint_dependence --run RUN [--checkpoint iter_000050 ...]
        [--reflection-cache FILE] [--name NAME]

Writes diagnostics/results/NAME.json (default hint_dependence).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import print_table, write_results
from diagnostics.common import RESULTS
from diagnostics.failure_modes import load_players
from diagnostics.reflection_accuracy import hint
from diagnostics.taxi_prompts import Prompts, logits_of
from reflectrl.envs.taxi import ACTIONS, TaxiOptions


def hint_dependence(prompts: Prompts, logits: torch.Tensor) -> dict[str, Any]:
    probs = torch.softmax(logits, -1)
    groups: dict[tuple[bool, int], list[int]] = defaultdict(list)
    hinted: dict[int, int] = {}
    for i, (pickup, _state) in enumerate(prompts.keys):
        named = hint(prompts.reflections[i], ACTIONS)
        if named is not None:
            hinted[i] = ACTIONS.index(named)
            groups[(pickup, hinted[i])].append(i)
    right = {i: prompts.oracle[i][a] == 0 for i, a in hinted.items()}
    p_hint = {i: float(probs[i, a]) for i, a in hinted.items()}
    argmax = probs.argmax(-1).tolist()
    pairs = below = 0.0
    tv = []
    for members in groups.values():
        mean = probs[members].mean(0)
        tv += (0.5 * (probs[members] - mean).abs().sum(-1)).tolist()
        wrong = [p_hint[i] for i in members if not right[i]]
        ok = [p_hint[i] for i in members if right[i]]
        for w in wrong:
            pairs += len(ok)
            below += sum(1.0 if w < r else 0.5 if w == r else 0.0 for r in ok)
    wrong_ids = [i for i in hinted if not right[i]]
    right_ids = [i for i in hinted if right[i]]
    return {
        "prompts": len(prompts.rows),
        "hinted": len(hinted),
        "hint_wrong": len(wrong_ids),
        "follows": round(sum(argmax[i] == a for i, a in hinted.items()) / len(hinted), 4),
        "p_hint_right": round(sum(p_hint[i] for i in right_ids) / max(1, len(right_ids)), 4),
        "p_hint_wrong": round(sum(p_hint[i] for i in wrong_ids) / max(1, len(wrong_ids)), 4),
        "auc": round(below / pairs, 4) if pairs else None,
        "within_group_tv": round(sum(tv) / len(tv), 4),
        "wrong_left": sum(prompts.oracle[i][argmax[i]] == 0 for i in wrong_ids),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--run", type=Path, required=True)
    parser.add_argument(
        "--checkpoint", action="append", default=[],
        help="a checkpoint folder of the run (e.g. iter_000050); repeatable",
    )  # fmt: skip
    parser.add_argument(
        "--reflection-cache", type=Path, help="a JSON file of the run's reflections to reuse"
    )
    parser.add_argument("--name", default="hint_dependence")
    args = parser.parse_args()
    started = time.perf_counter()
    players = load_players(args.run, after_rl=False)
    prompts = Prompts(players, TaxiOptions(**players.config.env.options), args.reflection_cache)
    print(f"{len(prompts.rows)} prompts, {prompts.generated} reflections generated", flush=True)
    rows = []
    for checkpoint in [None, *args.checkpoint]:
        if checkpoint is not None:
            adapter = args.run / "checkpoints" / checkpoint / "adapter"
            if not adapter.is_dir():
                sys.exit(f"--checkpoint {checkpoint}: no adapter at {adapter}; name a folder "
                         f"under {args.run / 'checkpoints'}")  # fmt: skip
            players.policy.load_adapter(adapter)
        with torch.no_grad():
            logits = logits_of(players.policy, prompts.rows)
        rows.append({"run": str(args.run), "policy": checkpoint or "sft",
                     **hint_dependence(prompts, logits)})  # fmt: skip
        print(rows[-1], flush=True)
    columns = ["run", "policy", "hint_wrong", "follows", "p_hint_right", "p_hint_wrong", "auc",
               "within_group_tv", "wrong_left"]  # fmt: skip
    print_table(rows, columns)
    command = "python -m diagnostics.hint_dependence " + " ".join(sys.argv[1:])
    wall_s = round(time.perf_counter() - started)
    write_results(args.name, {"command": command, "rows": rows, "wall_s": wall_s}, folder=RESULTS)


if __name__ == "__main__":
    main()
