"""Question: is the policy's trunk what stops it from following the reflection?
Answer (see docs/action_heads.md, docs/results/auto-explore-cpu.md,
docs/results/alfworld-cpu.md): the label head is: on shuffled menus no trunk tried follows the
reflection with it (0.12-0.15 after 500 steps, chance 0.152), while the recipe's trunk with the
text head reaches 0.598, and 0.961 with the menu left out of the prompt.
Results: diagnostics/results/policy_copy*.json.

Policy trunks of several shapes are trained, supervised, on the policy rows of one `reflectrl
data` folder, and scored on its held-out rows (the episodes SFT keeps for its eval loss) every
`--every` steps.

The objective is the policy's own: the LM's logits of the menu's labels at the last position,
a softmax over them (option scoring), cross-entropy against the expert's label. The prompts
are the data's, with the expert's reflection in them; where that reflection quotes the taught
command, answering is a copy (diagnostics/sft_policy_accuracy.py measures a run's SFT policy
the same way). Equal steps, equal batch, one seed: trunks differ only in shape.

Trunks: `recipe` is the config's `policy.model` as built (`scratch:<env>`: 2 layers x 128,
2 heads, RoPE); `llama_2x128_4h` splits the same width into 4 heads; `llama_4x128` doubles the
depth; `gpt2` is the recipe's size with learned absolute positions; `llama_copy` is the recipe's
trunk after the generic copy and lookup pretraining (`<policy.model>:llama_copy`,
reflectrl/data/pretrain.py).

    python -m diagnostics.policy_copy --data DIR [--config configs/auto_explore_cpu.yaml]
        [--trunk recipe ...] [--steps 500] [--every 100] [--prompt-loss W] [--name FILE]

`--prompt-loss W` adds W x the next-token loss over the prompts' own tokens to the label loss
(the trunk then also learns the env's text, as a pretrained LM would have; SFT itself trains
the label only). Data made with `--set env.shuffle_options=true` takes away the label prior
that the env's menu order gives; so does `--reorder-menus` (a fresh order at every draw).
`--head text` scores each action by its own tokens (reflectrl/models/action_text.py) and trains
on the taught action's negative log-likelihood (`--text-loss tokens`, SFT's) or the menu
cross-entropy (`choice`). `--context reflection` leaves the observation out of every prompt;
`--vocab N` puts the trunks over an N-id tokenizer trained on the data's train rows instead of
the config's.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import print_table, write_results
from diagnostics.common import RESULTS, add_head_arguments, build_trunk, text_head_scores
from reflectrl.text.prompts import ACTION_MARKER, ANALYZE_MARKER, MENU_HEADER, render_menu

REPO = Path(__file__).resolve().parents[1]
TRUNKS = ("recipe", "llama_2x128_4h", "llama_4x128", "gpt2", "llama_copy")
BATCH = 32
QUOTED = re.compile(r' "([^"]+)"')


def unquote_reflection(prompt: str) -> str:
    """The prompt with the reflection's quoted commands unquoted (` "cat a.py"` -> ` cat a.py`):
    the command's first word then gets the token the menu gives it (a word after a space), not
    the one it gets glued to a quote mark."""
    head, _, rest = prompt.rpartition(" # Analyze:")
    reflection, _, menu = rest.partition("Valid actions:")
    unquoted = QUOTED.sub(r" \1", reflection)
    return f"{head} # Analyze:{unquoted}Valid actions:{menu}"


def without_observation(prompt: str) -> str:
    """The prompt's task line, reflection and menu: the observation between them left out."""
    task = prompt.split("\n", 1)[0]
    return task + ANALYZE_MARKER + prompt.split(ANALYZE_MARKER, 1)[1]


def menu_actions(prompt: str) -> list[str]:
    """The action texts of the prompt's menu, in menu order."""
    menu = prompt.rsplit(MENU_HEADER, 1)[1].removesuffix(ACTION_MARKER)
    return [line.split(". ", 1)[1] for line in menu.split("\n")]


def reorder_menu(prompt: str, taught: int, labels: str, draw: random.Random) -> tuple[str, int]:
    """The prompt with its menu's actions in a random order (labels stay in order), and the
    label the taught action now has: the menu order then tells nothing about the answer."""
    head = prompt.rsplit(MENU_HEADER, 1)[0]
    actions = menu_actions(prompt)
    order = list(range(len(actions)))
    draw.shuffle(order)
    menu = render_menu(actions, labels, order)
    return f"{head}{MENU_HEADER}{menu}{ACTION_MARKER}", order.index(taught)


def policy_rows(
    data: Path, split: str, labels: str, unquoted: bool = False, context: str = "full"
) -> list[tuple[str, int, int]]:
    """(prompt, menu length, taught label's index) of every policy row of `split`."""
    rows = []
    for line in (data / "data.jsonl").open():
        row = json.loads(line)
        if row["target"] != "sft_policy" or row["split"] != split:
            continue
        menu = row["prompt"].rsplit(MENU_HEADER, 1)[1].count("\n") + 1
        prompt = unquote_reflection(row["prompt"]) if unquoted else row["prompt"]
        if context == "reflection":
            prompt = without_observation(prompt)
        rows.append((prompt, menu, labels.index(row["completion"])))
    return rows


def encoded(
    rows: list[tuple[str, int, int]],
    tokenizer: Any,
    labels: str,
    draw: random.Random | None,
    show_menu: bool = True,
) -> list[tuple[list[int], int, int]]:
    """Rows as (token ids, the menu's actions, taught index); with `draw`, each menu reordered
    first; without `show_menu`, the menu left out of the prompt (the text head scores the
    actions all the same, and the reflection is then the last thing before the answer)."""
    out = []
    for prompt, _, taught in rows:
        if draw is not None:
            prompt, taught = reorder_menu(prompt, taught, labels, draw)
        actions = menu_actions(prompt)
        if not show_menu:
            prompt = prompt.rsplit(MENU_HEADER, 1)[0] + ACTION_MARKER
        out.append((tokenizer.encode(prompt, add_special_tokens=False), actions, taught))
    return out


def batch_logits(
    trunk: Any, rows: list[Any], label_ids: Any, pad: int, prompt_loss: bool = False
) -> tuple[Any, Any, Any]:
    """Label logits at each row's last position (labels past its menu masked out), the taught
    labels, and (with `prompt_loss`, else None) the next-token loss over the prompts' tokens."""
    import torch

    width = max(len(ids) for ids, _, _ in rows)
    x = torch.full((len(rows), width), pad)
    for i, (ids, _, _) in enumerate(rows):
        x[i, : len(ids)] = torch.tensor(ids)
    last = torch.tensor([len(ids) - 1 for ids, _, _ in rows])
    mask = (x != pad).long()
    if prompt_loss:
        out = trunk(input_ids=x, attention_mask=mask).logits
        scores = out[torch.arange(len(rows)), last][:, label_ids]
    else:  # the LM head at the last positions only: a 49k-id head over every position is GBs
        hidden = trunk.base_model(input_ids=x, attention_mask=mask).last_hidden_state
        scores = trunk.lm_head(hidden[torch.arange(len(rows)), last])[:, label_ids]
    menus = torch.tensor([len(menu) for _, menu, _ in rows])
    scores = scores.masked_fill(torch.arange(len(label_ids))[None] >= menus[:, None], -1e9)
    taught_labels = torch.tensor([t for _, _, t in rows])
    if not prompt_loss:
        return scores, taught_labels, None
    targets = x[:, 1:].masked_fill(x[:, 1:] == pad, -100)
    return (
        scores,
        taught_labels,
        torch.nn.functional.cross_entropy(out[:, :-1].flatten(0, 1), targets.flatten()),
    )


def text_logits(trunk: Any, rows: list[Any], tokenizer: Any) -> tuple[Any, Any, Any]:
    """The text head's scores over each row's menu, the taught indices, and every action's
    summed log-probability."""
    import torch

    prompts = [ids for ids, _, _ in rows]
    scores, log_probs = text_head_scores(trunk, tokenizer, prompts, [m for _, m, _ in rows])
    return scores, torch.tensor([t for _, _, t in rows]), log_probs


def accuracy(trunk: Any, rows: list[Any], label_ids: Any, pad: int, tokenizer: Any = None) -> float:
    """Held-out share of rows whose top-scored action is the taught one; with `tokenizer`, by
    the text head, else by the label head."""
    import torch

    hits = 0
    with torch.no_grad():
        for i in range(0, len(rows), 64):
            if tokenizer is not None:
                scores, taught, _ = text_logits(trunk, rows[i : i + 64], tokenizer)
            else:
                scores, taught, _ = batch_logits(trunk, rows[i : i + 64], label_ids, pad)
            hits += int((scores.argmax(-1) == taught).sum())
    return hits / len(rows)


def vocab_model(data: Path, vocab: int) -> Path:
    """The recipe's trunk (seeded, 2 x 128) over a byte-level BPE of `vocab` ids trained on the
    data's train rows (every target's prompt and completion), built once into the data folder."""
    from reflectrl.data.scratch import train_tokenizer
    from reflectrl.models.loading import save_random_llama

    out = data / f"scratch-vocab{vocab}"
    if not (out / "config.json").is_file():
        rows = (json.loads(line) for line in (data / "data.jsonl").open())
        texts = (r["prompt"] + r["completion"] for r in rows if r["split"] == "train")
        save_random_llama(train_tokenizer(texts, vocab), out)
    return out


def learning_curve(name: str, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from reflectrl.config import load_config
    from reflectrl.data.scratch import resolve_or_build
    from reflectrl.models.loading import load_tokenizer
    from reflectrl.text.tokens import label_token_ids

    config = load_config(args.config)
    if args.vocab:
        model_dir = vocab_model(args.data, args.vocab)
    elif name == "llama_copy":
        model_dir = resolve_or_build(f"{config.policy.model}:llama_copy")
    else:
        model_dir = resolve_or_build(config.policy.model)
    tokenizer = load_tokenizer(model_dir)
    labels = config.policy.labels
    label_ids = torch.tensor(label_token_ids(tokenizer, labels, ACTION_MARKER))
    train = policy_rows(args.data, "train", labels, args.unquoted, args.context)
    # Reordered held-out menus (one fixed draw) score reading alone, without the order's prior.
    held_out = encoded(
        policy_rows(args.data, "eval", labels, args.unquoted, args.context), tokenizer, labels,
        random.Random(1) if args.reorder_menus else None, not args.no_menu,
    )  # fmt: skip
    reorder = random.Random(0) if args.reorder_menus else None
    pad = tokenizer.pad_token_id
    trunk = build_trunk("recipe" if name == "llama_copy" else name, model_dir, len(tokenizer))
    optimizer = torch.optim.AdamW(trunk.parameters(), lr=args.lr)
    draw = torch.Generator().manual_seed(0)
    curve, started = [], time.perf_counter()
    for step in range(1, args.steps + 1):
        picks = torch.randint(len(train), (BATCH,), generator=draw).tolist()
        batch = encoded([train[i] for i in picks], tokenizer, labels, reorder, not args.no_menu)
        if args.head == "text":
            scores, taught, log_probs = text_logits(trunk, batch, tokenizer)
            prompt_loss = None
        else:
            scores, taught, prompt_loss = batch_logits(
                trunk, batch, label_ids, pad, args.prompt_loss > 0
            )
        if args.head == "text" and args.text_loss == "tokens":  # SFT's: the taught action's tokens
            loss = -log_probs[torch.arange(len(batch)), taught].mean()
        else:
            loss = torch.nn.functional.cross_entropy(scores, taught)
        if prompt_loss is not None:
            loss = loss + args.prompt_loss * prompt_loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % args.every == 0 or step == args.steps:
            point = {"step": step, "loss": round(float(loss.detach()), 4),
                     "held_out": accuracy(trunk, held_out, label_ids, pad,
                                          tokenizer if args.head == "text" else None),
                     "train_s": round(time.perf_counter() - started)}  # fmt: skip
            curve.append(point)
            print(f"{name}: step {step}, loss {point['loss']:.3f}, held-out "
                  f"{point['held_out']:.3f}, {point['train_s']} s", file=sys.stderr)  # fmt: skip
    chance = sum(1 / len(menu) for _, menu, _ in held_out) / len(held_out)
    # The menu is in the env's order, so one label is taught far more often than the rest: a
    # trunk that answers it always scores this much without reading the reflection.
    taught = [t for _, _, t in train]
    majority = max(set(taught), key=taught.count)
    majority_held_out = sum(t == majority for _, _, t in held_out) / len(held_out)
    return {
        "trunk": name,
        "head": args.head,
        "text_loss": args.text_loss if args.head == "text" else None,
        "reflection_quotes": not args.unquoted,
        "prompt_loss_weight": args.prompt_loss,
        "context": args.context,
        "menu_in_prompt": not args.no_menu,
        "vocab": len(tokenizer),
        "reordered_menus": args.reorder_menus,
        "params": sum(p.numel() for p in trunk.parameters()),
        "train_rows": len(train),
        "held_out_rows": len(held_out),
        "chance": chance,
        "majority_label": majority_held_out,
        "best_held_out": max(p["held_out"] for p in curve),
        "final_held_out": curve[-1]["held_out"],
        "seconds": curve[-1]["train_s"],
        "curve": curve,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="a `reflectrl data` folder")
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "auto_explore_cpu.yaml",
                        help="the config that made the data (labels, policy.model)")  # fmt: skip
    parser.add_argument("--trunk", action="append", choices=TRUNKS,
                        help="default: all but llama_copy")  # fmt: skip
    parser.add_argument("--steps", type=int, default=500, help="supervised steps per trunk")
    parser.add_argument("--every", type=int, default=100, help="score every this many steps")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--unquoted", action="store_true", help="unquote the reflections' commands")
    parser.add_argument("--prompt-loss", type=float, default=0.0,
                        help="weight of a next-token loss over the prompt tokens, added to the "
                        "label loss (0: the label only, as SFT trains the policy)")  # fmt: skip
    parser.add_argument("--vocab", type=int, default=0,
                        help="with the recipe's trunk: a tokenizer of this many ids trained on "
                        "the data's train rows, not the config's (0: the config's)")  # fmt: skip
    parser.add_argument("--context", choices=("full", "reflection"), default="full",
                        help="reflection: leave the observation out of every prompt (task line, "
                        "reflection and menu only)")  # fmt: skip
    parser.add_argument("--reorder-menus", action="store_true",
                        help="reorder every menu at random (train: a fresh order each "
                        "draw; held out: one fixed order): the order tells nothing")  # fmt: skip
    parser.add_argument("--no-menu", action="store_true",
                        help="with --head text: leave the menu out of the prompt (the actions "
                        "are scored all the same; the reflection comes last)")  # fmt: skip
    add_head_arguments(parser)
    parser.add_argument("--name", default="policy_copy", help="results file name")
    args = parser.parse_args()
    if args.no_menu and args.head != "text":
        parser.error("--no-menu needs --head text: the label head reads the answer off the menu")
    started = time.perf_counter()
    command = "python -m diagnostics.policy_copy " + " ".join(sys.argv[1:])
    rows: list[dict[str, Any]] = []
    # Results written after each trunk: a long grid keeps them.
    for trunk in args.trunk or TRUNKS[:4]:
        rows.append(learning_curve(trunk, args))
        payload = {"command": command.strip(), "data": str(args.data), "rows": rows,
                   "wall_s": round(time.perf_counter() - started)}  # fmt: skip
        path = write_results(args.name, payload, folder=RESULTS)
    print_table(
        rows,
        [
            "trunk",
            "head",
            "params",
            "chance",
            "majority_label",
            "best_held_out",
            "final_held_out",
            "seconds",
        ],
    )
    print(path)


if __name__ == "__main__":
    main()
