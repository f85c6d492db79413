"""Question: can a from-scratch trunk learn to look a command up on a menu at all?
Answer (see docs/action_heads.md, docs/results/auto-explore-cpu.md): not with the label head in
a CPU recipe's steps: the 2-layer trunk copies a named label from step 250 on but stays at
chance where the row names a command (0.148 after 2,000 steps, chance 0.161); with the text head
it finds the command (0.979 at step 250, 1.000 at 500).
Results: diagnostics/results/menu_lookup_*.json.

Two synthetic tasks on short rows built from one data folder's own menu commands (its train
split), with the policy's objective (the label logits at the last position, softmax over the
menu, cross-entropy):

- `label`: the row names the label itself (`Next: 7`, then the menu): one copied token.
- `command`: the row names the command (`Next: cat utils.py`, then the menu), as a
  reflection does; answering means finding that command on the menu and giving its label.
- `word`: as `command`, over single-token words of the tokenizer instead of DIR's commands
  (500 of them), so a match is one token against one token.

    Next: cat utils.py
    Valid actions:
    1. id setup.py
    2. cat utils.py
    3. cd tests # Action:
    -> 2

Menus of 3-12 commands drawn at random (a uniform pick scores 0.160), the taught line uniform,
so no order or prior helps. Trunks are seeded random-init Llamas of width 128 and 2 heads
(diagnostics/common.py's `llama_2x128`, `llama_4x128`) over the `--model` directory's
tokenizer; every row is fresh, and 512 fixed rows are held out.

With `--pretrained`, the trunk is MODEL_DIR's own model (e.g. SmolLM2-135M, `smollm2`), every
weight trained; `--steps 0` scores it as it comes. Every curve starts with a held-out score at
step 0, before training.

With `--grow`, training menus start at 2 commands and get one more each time 90% of the
last 50 batches' rows were answered right (a curriculum); the held-out rows stay at 3-12.

With `--match-loss W`, every menu line gets a target too: at its last token, two label logits
answer "does this line hold the named command?" (weight W beside the row's answer).

With `--pretrain N`, N steps of drill rows come first: a menu, then every line asked for once in
random order (`Next: <command> # Action:` and its label), a target per line where a task row
has one; the curve records the drill loss beside what ruling out the lines already asked gives.

    python -m diagnostics.menu_lookup --data DIR --model MODEL_DIR [--task label --task command]
        [--layers 2 --layers 4] [--steps 2000] [--every 250] [--grow] [--pretrained]
        [--match-loss 1] [--pretrain 2000] [--head text [--text-loss choice]]

With `--head text`, the trunk scores each command by the log-probability of its own tokens
after the row (reflectrl/models/action_text.py), per token, and trains on the taught command's
negative log-likelihood (`--text-loss tokens`, SFT's loss) or on the cross-entropy over the
menu (`choice`). `--match-loss` reads the label head only.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import print_table, write_results
from diagnostics.common import RESULTS, add_head_arguments, build_trunk, text_head_scores
from reflectrl.text.prompts import ACTION_MARKER, MENU_HEADER, render_menu

LABELS = "123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
BATCH = 32
HELD_OUT = 512


def menu_commands(data: Path) -> list[str]:
    """Every command the train split's policy rows show on a menu."""
    commands = set()
    for line in (data / "data.jsonl").open():
        row = json.loads(line)
        if row["target"] == "sft_policy" and row["split"] == "train":
            menu = row["prompt"].rsplit(MENU_HEADER, 1)[1].removesuffix(ACTION_MARKER)
            commands.update(entry.split(". ", 1)[1] for entry in menu.split("\n"))
    return sorted(commands)


def single_token_words(tokenizer: Any, count: int = 500) -> list[str]:
    """The first `count` alphabetic words of 4+ letters that are one token with a leading space."""
    words = [t[1:] for t in tokenizer.get_vocab() if t[:1] == "\u0120" and t[1:].isalpha()]
    return sorted(w for w in words if len(w) > 3)[:count]


def lookup_row(
    task: str, commands: list[str], draw: random.Random, longest: int = 12
) -> tuple[str, list[str], int]:
    """(text, the menu's commands, taught line's index) of one synthetic row."""
    menu = draw.sample(commands, draw.randint(min(3, longest), longest))
    taught = draw.randrange(len(menu))
    named = LABELS[taught] if task == "label" else menu[taught]
    text = f"Next: {named}{MENU_HEADER}{render_menu(menu, LABELS, range(len(menu)))}"
    return text + ACTION_MARKER, menu, taught


def line_ends(tokenizer: Any, text: str) -> list[int]:
    """Index of the token that ends each menu line of `text`."""
    spans = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    start = text.index(MENU_HEADER) + len(MENU_HEADER)
    ends, at = [], start
    for line in text[start:].removesuffix(ACTION_MARKER).split("\n"):
        at += len(line)
        ends.append(next(i for i, (_, end) in enumerate(spans.offset_mapping) if end >= at))
        at += 1  # the newline
    return ends


def drill_row(commands: list[str], draw: random.Random) -> str:
    """A menu of 3-12 commands, then every line asked for once, in random order:
    `Next: <command> # Action:` and its label. A target at every answer, where a lookup row
    has one."""
    menu = draw.sample(commands, draw.randint(3, 12))
    asked = draw.sample(range(len(menu)), len(menu))
    queries = "".join(f"\nNext: {menu[i]}{ACTION_MARKER}{LABELS[i]}" for i in asked)
    return f"{MENU_HEADER.lstrip()}{render_menu(menu, LABELS, range(len(menu)))}{queries}"


def drill_targets(tokenizer: Any, texts: list[str]) -> tuple[Any, list[tuple[int, int]], list[int]]:
    """(the padded batch, (row, position) of every answer's last prompt token, the answer's
    token id): an answer is the token right after an action marker."""
    batch = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True,
                      padding=True, return_tensors="pt")  # fmt: skip
    positions, targets = [], []
    for i, text in enumerate(texts):
        answers = {m.end() for m in re.finditer(re.escape(ACTION_MARKER), text)}
        for t, (start, _) in enumerate(batch["offset_mapping"][i].tolist()):
            if t > 0 and start in answers:
                positions.append((i, t - 1))
                targets.append(int(batch["input_ids"][i, t]))
    return batch, positions, targets


def drill_loss(model: Any, tokenizer: Any, texts: list[str]) -> Any:
    """Next-token cross-entropy at every answer of the drill rows."""
    import torch

    batch, positions, targets = drill_targets(tokenizer, texts)
    hidden = model.base_model(input_ids=batch["input_ids"],
                              attention_mask=batch["attention_mask"]).last_hidden_state  # fmt: skip
    rows, at = zip(*positions, strict=True)
    logits = model.lm_head(hidden[torch.tensor(rows), torch.tensor(at)])
    return torch.nn.functional.cross_entropy(logits, torch.tensor(targets))


def label_scores(
    model: Any, tokenizer: Any, rows: list[Any], label_ids: Any, with_hidden: bool = False
) -> Any:
    import torch

    ids = [tokenizer.encode(text, add_special_tokens=False) for text, _, _ in rows]
    pad = tokenizer.pad_token_id
    x = torch.full((len(ids), max(map(len, ids))), pad)
    for i, row in enumerate(ids):
        x[i, : len(row)] = torch.tensor(row)
    hidden = model.base_model(input_ids=x, attention_mask=(x != pad).long()).last_hidden_state
    last = torch.tensor([len(row) - 1 for row in ids])
    scores = model.lm_head(hidden[torch.arange(len(ids)), last])[:, label_ids]
    menus = torch.tensor([len(menu) for _, menu, _ in rows])
    scores = scores.masked_fill(torch.arange(len(label_ids))[None] >= menus[:, None], -1e9)
    return (scores, hidden) if with_hidden else scores


def text_scores(model: Any, tokenizer: Any, rows: list[Any]) -> tuple[Any, Any]:
    """The text head's scores over each row's menu (padded to 12) and summed log-probs."""
    import torch

    prompts = [tokenizer.encode(text, add_special_tokens=False) for text, _, _ in rows]
    scores, log_probs = text_head_scores(model, tokenizer, prompts, [m for _, m, _ in rows])
    fill = 12 - scores.shape[1]  # every row's scores as wide as the longest menu can be
    return torch.nn.functional.pad(scores, (0, fill), value=-1e9), log_probs


def match_loss(model: Any, tokenizer: Any, rows: list[Any], hidden: Any, label_ids: Any) -> Any:
    """Cross-entropy of "does this menu line hold the named command?" at each line's last
    token, read off two label logits (first: no, second: yes): a target on every line, where
    the answer gives one a row."""
    import torch

    row_of, position, matches = [], [], []
    for i, (text, _, taught) in enumerate(rows):
        for line, end in enumerate(line_ends(tokenizer, text)):
            row_of.append(i)
            position.append(end)
            matches.append(int(line == taught))
    logits = model.lm_head(hidden[torch.tensor(row_of), torch.tensor(position)])[:, label_ids[:2]]
    return torch.nn.functional.cross_entropy(logits, torch.tensor(matches))


def learning_curve(task: str, layers: int, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from reflectrl.models.loading import load_tokenizer
    from reflectrl.text.tokens import label_token_ids

    tokenizer = load_tokenizer(args.model)
    label_ids = torch.tensor(label_token_ids(tokenizer, LABELS, ACTION_MARKER))
    commands = single_token_words(tokenizer) if task == "word" else menu_commands(args.data)
    held_out = [lookup_row(task, commands, random.Random(10_000 + i)) for i in range(HELD_OUT)]
    taught = torch.tensor([t for _, _, t in held_out])
    trunk = "recipe" if args.pretrained else f"llama_{layers}x128"  # recipe: the dir's weights
    model = build_trunk(trunk, args.model, len(tokenizer))
    layers = model.config.num_hidden_layers
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    draw, curve, started = random.Random(0), [], time.perf_counter()

    def scores_and_loss(rows: list[Any]) -> tuple[Any, Any, Any]:
        """The head's scores over each row's menu, the loss it trains on, and (label head)
        the hidden states."""
        answers = torch.tensor([t for _, _, t in rows])
        if args.head == "text":
            scores, log_probs = text_scores(model, tokenizer, rows)
            if args.text_loss == "tokens":  # SFT's: the taught command's own tokens
                return scores, -log_probs[torch.arange(len(rows)), answers].mean(), None
            return scores, torch.nn.functional.cross_entropy(scores, answers), None
        scores, hidden = label_scores(model, tokenizer, rows, label_ids, with_hidden=True)
        return scores, torch.nn.functional.cross_entropy(scores, answers), hidden

    def held_out_score() -> float:
        with torch.no_grad():
            picks = torch.cat([scores_and_loss(held_out[i : i + 64])[0].argmax(-1)
                               for i in range(0, HELD_OUT, 64)])  # fmt: skip
        return float((picks == taught).float().mean())

    # --pretrain: drill rows first (menu, then every line asked for), a target per line.
    drill = []
    for step in range(1, args.pretrain + 1):
        loss = drill_loss(model, tokenizer, [drill_row(commands, draw) for _ in range(BATCH)])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % args.every == 0 or step == args.pretrain:
            point = {"step": step, "loss": round(float(loss.detach()), 4),
                     "held_out": held_out_score(),
                     "train_s": round(time.perf_counter() - started)}  # fmt: skip
            drill.append(point)
            print(f"{task}, {layers} layers: drill step {step}, loss {point['loss']:.3f}, "
                  f"held-out {point['held_out']:.3f}, {point['train_s']} s",
                  file=sys.stderr)  # fmt: skip
    before = {"step": 0, "held_out": held_out_score()}
    curve.append({**before, "train_s": round(time.perf_counter() - started)})  # before training
    # --grow: menus of 2 commands first; one more each time 90% of the last 50 batches' rows
    # were answered right (held-out rows keep menus of 3-12 throughout).
    longest, recent = (2 if args.grow else 12), []
    for step in range(1, args.steps + 1):
        rows = [lookup_row(task, commands, draw, longest) for _ in range(BATCH)]
        scores, loss, hidden = scores_and_loss(rows)
        answers = torch.tensor([t for _, _, t in rows])
        total = loss
        if args.match_loss:
            total = loss + args.match_loss * match_loss(model, tokenizer, rows, hidden, label_ids)
        optimizer.zero_grad()
        total.backward()
        optimizer.step()
        recent = [*recent[-49:], float((scores.argmax(-1) == answers).float().mean())]
        if args.grow and longest < 12 and len(recent) == 50 and sum(recent) / 50 >= 0.9:
            longest, recent = longest + 1, []
        if step % args.every == 0 or step == args.steps:
            point = {"step": step, "loss": round(float(loss.detach()), 4),
                     "held_out": held_out_score(), "longest_menu": longest,
                     "train_s": round(time.perf_counter() - started)}  # fmt: skip
            curve.append(point)
            print(f"{task}, {layers} layers: step {step}, loss {point['loss']:.3f}, held-out "
                  f"{point['held_out']:.3f}, menus up to {longest}, {point['train_s']} s",
                  file=sys.stderr)  # fmt: skip
    return {
        "task": task,
        "head": args.head,
        "text_loss": args.text_loss if args.head == "text" else None,
        "layers": layers,
        "pretrained": args.pretrained,
        "grow": args.grow,
        "match_loss": args.match_loss,
        "pretrain": args.pretrain,
        "drill_curve": drill,
        # A picker that knows only which lines were asked already: ln(k) over k unasked.
        "drill_elimination_loss": sum(math.lgamma(n + 1) / n for n in range(3, 13)) / 10,
        "vocab": len(tokenizer),
        "commands": len(commands),
        "chance": sum(1 / len(menu) for _, menu, _ in held_out) / HELD_OUT,
        "final_held_out": curve[-1]["held_out"],
        "best_held_out": max(p["held_out"] for p in curve),
        "seconds": curve[-1]["train_s"],
        "curve": curve,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="a `reflectrl data` folder")
    parser.add_argument("--model", type=Path, required=True, help="a model dir (its tokenizer)")
    parser.add_argument("--task", action="append", choices=("label", "command", "word"))
    parser.add_argument("--layers", action="append", type=int, choices=(2, 4), help="default: 2")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--every", type=int, default=250)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--grow", action="store_true", help="train menus from 2 commands up")
    parser.add_argument(
        "--pretrained", action="store_true", help="the trunk: MODEL_DIR's own weights, all trained"
    )
    parser.add_argument(
        "--match-loss", type=float, default=0.0,
        help="weight of a loss on every menu line: does it hold the named command?",
    )  # fmt: skip
    parser.add_argument(
        "--pretrain", type=int, default=0,
        help="steps of drill rows (a menu, then every line asked for) before the task's",
    )  # fmt: skip
    add_head_arguments(parser)
    parser.add_argument("--name", default="menu_lookup", help="results file name")
    args = parser.parse_args()
    if args.head == "text" and args.match_loss:
        parser.error("--match-loss reads the label head; leave it out with --head text")
    command = "python -m diagnostics.menu_lookup " + " ".join(sys.argv[1:])
    rows: list[dict[str, Any]] = []
    for task in args.task or ["label", "command"]:
        for layers in args.layers or [2]:  # written after each curve: a long grid keeps them
            rows.append(learning_curve(task, layers, args))
            path = write_results(args.name, {"command": command, "rows": rows}, folder=RESULTS)
    columns = ["task", "head", "layers", "vocab", "chance", "best_held_out", "final_held_out"]
    columns.append("seconds")
    print_table(rows, columns)
    print(path)


if __name__ == "__main__":
    main()
