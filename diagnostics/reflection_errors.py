"""Question: where does a trained AutoExplore reflection model's command go wrong?
Answer (see docs/action_heads.md): in copying a name from the screen: a third of its commands
(0.330) name an entry that is not on the screen, more than every wrong choice among the listed
entries together (0.219); it is right on 0.336, and would be on 0.440 if chosen among the valid
actions.
Results: diagnostics/results/reflection_errors_*.json.

Where a trained AutoExplore reflection model goes wrong: on each held-out reflection row of
one `reflectrl data` folder, the model reads the row's prompt and its own reflection up to the
quote that opens the expert's command (teacher-forced), then writes the command greedily to the
closing quote. Each command it writes is sorted by what the prompt shows:

- right: the expert's command;
- first_unread: not the expert's, but a `cat`/`cd` of the first entry of the listing that the
  history ("Commands so far") does not name; the expert ranks by the names' likeness to the
  question and by the training split's statistics, and falls back to that order on a tie;
- named_before: a `cat`/`cd` of an entry the history names (read or entered already);
- other_unread: a `cat`/`cd` of another entry of the listing the history does not name;
- not_listed: a `cat`/`cd`/`id` of a name the listing does not hold (a mangled copy);
- wrong_kind: `cd ..` or `id` where the expert does something else, or the reverse.

Split by the expert command's kind (`cat`, `cd`, `cd ..`, `id`).

Beside it, `menu_pick`: the share of rows where, of the row's valid actions (its menu), the one
the model gives the highest log-probability as the quoted text (the action's tokens and the
closing quote, after the same prefix) is the expert's: what the reflection would name if its
command were chosen among the valid actions, as the policy's text head chooses.

    python -m diagnostics.reflection_errors --data DIR --model MODEL_DIR [--rows N] [--name NAME]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.common import print_table, write_results
from diagnostics.common import RESULTS
from diagnostics.reflection_copy import KINDS, command_kind, reflection_rows

OUTCOMES = ("right", "first_unread", "named_before", "other_unread", "not_listed", "wrong_kind")
COLUMNS = (*OUTCOMES, "menu_pick")
MAX_COMMAND_TOKENS = 24


def menus_of(data: Path, tokenizer: Any) -> dict[str, list[str]]:
    """Each held-out reflection prompt's menu (the valid actions the data records), keyed
    by the prompt as its ids decode."""
    menus = {}
    for line in (data / "data.jsonl").open():
        row = json.loads(line)
        if row["target"] == "sft_reflection" and row["split"] == "eval":
            ids = tokenizer.encode(row["prompt"], add_special_tokens=False)
            menus[tokenizer.decode(ids)] = list(row["menu"])
    return menus


def screen(prompt: str) -> tuple[list[str], set[str]]:
    """(the listing's names in order, the names the history's commands take)."""
    listing = prompt.split("\nContents:\n", 1)[1].split("\nCommands so far:", 1)[0]
    names = [n.rstrip("/") for n in listing.split("\n") if n and not n.startswith("(")]
    history = prompt.split("\nCommands so far:", 1)[1].split("\n", 1)[0]
    history = history.rsplit(" (", 1)[0]  # "(N steps left)"
    taken = {c.strip().split(" ", 1)[1] for c in history.split(";") if " " in c.strip()}
    return names, taken


def outcome(said: str, expert: str, names: list[str], taken: set[str]) -> str:
    if said == expert:
        return "right"
    said_kind, expert_kind = command_kind(said), command_kind(expert)
    moves = ("cd ..", "id")
    if said_kind != expert_kind and (said_kind in moves or expert_kind in moves):
        return "wrong_kind"
    name = said.partition(" ")[2]
    if name not in names:
        return "not_listed"
    if name in taken:
        return "named_before"
    unread = [n for n in names if n not in taken]
    return "first_unread" if name == unread[0] else "other_unread"


def written_command(model: Any, tokenizer: Any, ids: list[int], at: int) -> str:
    """The model's greedy continuation of `ids[:at]` (which ends with the opening quote), cut
    at the closing quote."""
    import torch

    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids[:at]]),
            max_new_tokens=MAX_COMMAND_TOKENS,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
        )
    return tokenizer.decode(out[0, at:]).split('"', 1)[0]


def menu_pick(model: Any, tokenizer: Any, ids: list[int], at: int, menu: list[str]) -> str:
    """The menu action with the highest summed log-probability of `action"` after
    `ids[:at]`."""
    import torch

    from reflectrl.models.action_text import action_log_probs

    encoded = [tokenizer.encode(f'{a}"', add_special_tokens=False) for a in menu]
    width = max(map(len, encoded))
    actions = torch.zeros(1, len(menu), width, dtype=torch.long)
    mask = torch.zeros(1, len(menu), width, dtype=torch.long)
    for k, tokens in enumerate(encoded):
        actions[0, k, : len(tokens)] = torch.tensor(tokens)
        mask[0, k, : len(tokens)] = 1
    prompt = torch.tensor([ids[:at]])
    with torch.no_grad():
        log_probs, _ = action_log_probs(model.base_model, model.get_output_embeddings(),
                                        prompt, torch.ones_like(prompt), actions, mask)  # fmt: skip
    return menu[int(log_probs[0].argmax())]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="a `reflectrl data` folder")
    parser.add_argument("--model", type=Path, required=True, help="a reflection model directory")
    parser.add_argument("--rows", type=int, default=0, help="held-out rows to score (0: all)")
    parser.add_argument("--name", default="reflection_errors", help="results file name")
    args = parser.parse_args()

    from reflectrl.models.loading import load_causal_lm, load_tokenizer

    started = time.perf_counter()
    tokenizer = load_tokenizer(args.model)
    model = load_causal_lm(args.model).eval()
    rows = reflection_rows(args.data, "eval", tokenizer)
    rows = rows[: args.rows] if args.rows else rows
    menus = menus_of(args.data, tokenizer)
    counts: dict[str, Counter[str]] = {kind: Counter() for kind in KINDS}
    for ids, start, at, end, kind in rows:
        prompt = tokenizer.decode(ids[:start])
        expert = tokenizer.decode(ids[at:end])
        names, taken = screen(prompt)
        said = written_command(model, tokenizer, ids, at)
        counts[kind][outcome(said, expert, names, taken)] += 1
        counts[kind]["menu_pick"] += menu_pick(model, tokenizer, ids, at, menus[prompt]) == expert
    table = []
    for kind in (*KINDS, "all"):
        found = sum(counts.values(), Counter()) if kind == "all" else counts[kind]
        n = sum(found[o] for o in OUTCOMES)
        table.append({"kind": kind, "rows": n,
                      **{o: round(found[o] / n, 3) if n else 0.0 for o in COLUMNS}})  # fmt: skip
    command = "python -m diagnostics.reflection_errors " + " ".join(sys.argv[1:])
    payload = {"command": command, "data": str(args.data), "model": str(args.model),
               "rows": table, "wall_s": round(time.perf_counter() - started)}  # fmt: skip
    path = write_results(args.name, payload, folder=RESULTS)
    print_table(table, ["kind", "rows", *COLUMNS])
    print(path)


if __name__ == "__main__":
    main()
