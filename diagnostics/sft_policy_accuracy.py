"""Question: how often does a run's SFT policy pick the label its SFT data teaches, on that
data's held-out rows, with the expert's own reflection in the prompt?
Answer (see docs/results/auto-explore-cpu.md, docs/results/alfworld-cpu.md): on 0.666 of
AutoExplore's rows (a uniform pick 0.142; the most-taught label alone 0.536) and 0.27 of
ALFWorld's (a uniform pick 0.044).
Results: diagnostics/results/sft_policy_accuracy_*.json.

Where the reflection quotes the very command the row teaches ("... Now do "cat auto.py"."), the
policy only has to find that command on the menu and answer its label (the label head), or
score that command's own text highest (`policy.action_head: text`): a copy. Per-step accuracy
compounds over an episode, so this bounds what the SFT players can start RL from.

    python -m diagnostics.sft_policy_accuracy --run RUN [--name NAME]
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import torch

from benchmarks.common import print_table, write_results
from diagnostics.common import RESULTS, text_head_scores
from reflectrl.config import load_config
from reflectrl.models.loading import load_causal_lm, load_tokenizer
from reflectrl.text.prompts import ACTION_MARKER
from reflectrl.text.tokens import label_token_ids

QUOTED = re.compile(r'"([^"]+)"')


def menu_of(row: dict) -> list[str]:
    """The row's valid commands, in label order (read off its prompt in data made before rows
    recorded their menu)."""
    if "menu" in row:
        return list(row["menu"])
    prompt = row["prompt"]
    lines = prompt.rsplit("Valid actions:\n", 1)[1].rsplit(" # Action:", 1)[0].splitlines()
    return [line.split(". ", 1)[1] for line in lines]


def named_command(prompt: str) -> str | None:
    """The last command the reflection quotes (its suggestion), if it quotes one."""
    if "# Analyze:" not in prompt:
        return None
    reflection = prompt.rsplit("# Analyze:", 1)[1].rsplit("Valid actions:", 1)[0]
    quoted = QUOTED.findall(reflection)
    return quoted[-1] if quoted else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--run", type=Path, required=True, help="a run with data/ and sft/policy")
    parser.add_argument("--data", type=Path,
                        help="the run's data made again by `reflectrl data --config "
                        "RUN/config.yaml` (for runs whose rows predate the `menu` field and "
                        "whose prompts leave the menu out; default: RUN/data)")  # fmt: skip
    parser.add_argument("--name", help="results file name (default: sft_policy_accuracy_<env>)")
    args = parser.parse_args()
    config = load_config(args.run / "config.yaml")
    data = args.data or args.run / "data"
    rows = [json.loads(line) for line in (data / "data.jsonl").open()]
    rows = [r for r in rows if r["target"] == "sft_policy" and r["split"] == "eval"]
    policy_dir = args.run / "sft" / "policy"
    tokenizer = load_tokenizer(policy_dir)
    model = load_causal_lm(policy_dir).eval()
    labels = config.policy.labels
    label_ids = label_token_ids(tokenizer, labels, ACTION_MARKER)
    groups: dict[str, list[tuple[bool, int]]] = {}
    text_head = config.policy.action_head == "text"
    for row in rows:
        menu = menu_of(row)
        ids = tokenizer.encode(row["prompt"], add_special_tokens=False)
        with torch.no_grad():
            if text_head:
                scores = text_head_scores(model, tokenizer, [ids], [menu])[0][0]
            else:
                scores = model(torch.tensor([ids])).logits[0, -1][label_ids[: len(menu)]]
        pick = labels[int(torch.argmax(scores))]
        taught = menu[labels.index(row["completion"])]
        named = named_command(row["prompt"])
        kind = (
            "reflection quotes the taught command"
            if named == taught
            else "reflection quotes another command"
            if named
            else "reflection quotes no command"
        )
        for group in (kind, "all"):
            groups.setdefault(group, []).append((pick == row["completion"], len(menu)))
    table = [
        {
            "rows": group,
            "n": len(hits),
            "picks_the_taught_label": sum(h for h, _ in hits) / len(hits),
            "menu_mean": sum(m for _, m in hits) / len(hits),
            "chance": sum(1 / m for _, m in hits) / len(hits),
        }
        for group, hits in groups.items()
    ]
    print_table(table, ["rows", "n", "picks_the_taught_label", "menu_mean", "chance"])
    name = args.name or f"sft_policy_accuracy_{config.env.name}"
    path = write_results(name, {"run": str(args.run), "results": table}, folder=RESULTS)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
