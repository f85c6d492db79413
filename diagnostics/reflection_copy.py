"""Question: does the reflection model name the expert's next command, and what lifts it?
Answer (see docs/action_heads.md): on 0.235 of the held-out AutoExplore rows after 1,000 steps
from the recipe's trunk; the command's tokens weighing 10x in the loss lift it to 0.317 (`id`
0.000 -> 0.594), the copy pretraining lowers it (0.170).
Results: diagnostics/results/reflection_copy_*.json.

Reflection trunks are trained as SFT trains the reflection (the loss on the completion's tokens,
AdamW, warmup then cosine) on the reflection rows of one `reflectrl data` folder (AutoExplore),
and scored on its held-out rows every `--every` steps.

Score: teacher-forced, the share of held-out rows where every token of the command that the
row's reflection quotes last (the expert's) is the model's argmax, given the reflection's text
up to the quote. Split by the command's kind (`cat`, `cd`, `cd ..`, `id`): `id` follows a `cat`
whose output states the answer (a match of the question's name in the output, then a copy of
the file's name), `cat` and `cd` pick a name from the listing, `cd ..` copies nothing.

Trunks: `recipe` is the config's `reflection.model` as built (`scratch:auto_explore`, random
init); `llama_copy` is the same Llama after the generic copy and lookup pretraining
(`scratch:auto_explore:llama_copy`, reflectrl/data/pretrain.py). A model directory is taken as
it is.

`--rename-files P`: a share P of the training rows (never the held-out ones) has its listing's
files renamed, so that no name can be recalled from the training trees and the model has to
copy it from the screen: each file whose name is not like the question's key (the observable
expert's first criterion) gets a made-up name with the same suffix, the new names in the old
names' alphabetical order (the expert's tie order), everywhere in the prompt and the
reflection. The expert's command is the same command under the new names.

    python -m diagnostics.reflection_copy --data DIR [--trunk recipe --trunk llama_copy]
        [--steps 1000] [--every 250] [--command-weight W] [--rename-files P] [--threads N]
        [--name FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.common import print_table, write_results
from diagnostics.common import RESULTS

REPO = Path(__file__).resolve().parents[1]
TRUNKS = {"recipe": "scratch:auto_explore", "llama_copy": "scratch:auto_explore:llama_copy"}
KINDS = ("cat", "cd", "cd ..", "id")
BATCH = 32
MAX_TOKENS = 1024 + 112  # the recipe's prompt budget and the reflection's max_tokens


def command_kind(command: str) -> str:
    return "cd .." if command == "cd .." else command.split(" ", 1)[0]


def reflection_rows(
    data: Path, split: str, tokenizer: Any, rename_share: float = 0.0
) -> list[tuple[Any, ...]]:
    """(ids of prompt + completion, where the completion starts, where the last quoted expert
    command starts and ends, its kind) of every reflection row of `split` that quotes its
    expert's command and fits the budget, encoded as SFT encodes them; a share
    `rename_share` of them with their files renamed (`renamed`, seeded)."""
    from reflectrl.sft.rows import quoted_command_span

    rows = []
    draw = random.Random(0)
    for line in (data / "data.jsonl").open():
        row = json.loads(line)
        if row["target"] != "sft_reflection" or row["split"] != split:
            continue
        if rename_share and draw.random() < rename_share:
            row = renamed(row, draw)
        # Only rows whose command starts and ends on token boundaries (nearly all).
        span = quoted_command_span(tokenizer, row["completion"], row["expert_action"])
        if span is None:
            continue
        prompt = tokenizer.encode(row["prompt"], add_special_tokens=False)
        completion = tokenizer.encode(row["completion"], add_special_tokens=False)
        ids = [*prompt, *completion, tokenizer.eos_token_id]
        if len(ids) <= MAX_TOKENS:
            kind = command_kind(row["expert_action"])
            rows.append((ids, len(prompt), len(prompt) + span[0], len(prompt) + span[1], kind))
    return rows


NAME_SYLLABLES = ("ba", "ko", "ri", "tu", "me", "sa", "no", "vi", "da", "lu", "pe", "go", "zi")


def renamed(row: dict[str, Any], draw: random.Random) -> dict[str, Any]:
    """`row` with each listed file not like the question's key renamed (the docstring's
    `--rename-files`), in its prompt, its reflection and its expert's command."""
    from reflectrl.envs.auto_explore.explorer import resemblance

    prompt = row["prompt"]
    key = prompt.split("`", 2)[1] if prompt.count("`") >= 2 else ""
    listing = prompt.split("\nContents:\n", 1)[1].split("\nCommands so far:", 1)[0]
    files = [n for n in listing.split("\n") if "." in n[1:] and not n.endswith("/")]
    old = sorted(n for n in files if not resemblance(n, key))
    stems: set[str] = set()
    while len(stems) < len(old):
        stems.add("".join(draw.choice(NAME_SYLLABLES) for _ in range(draw.randint(2, 4))))
    new = {}
    for name, stem in zip(old, sorted(stems), strict=True):
        new[name] = stem + name[name.index(".", 1) :]
    if not new:
        return row
    pattern = re.compile(
        r"(?<![\w./-])("
        + "|".join(map(re.escape, sorted(new, key=len, reverse=True)))
        + r")(?![\w/-]|\.\w)"
    )
    swap = lambda text: pattern.sub(lambda m: new[m.group(1)], text)  # noqa: E731
    return {**row, "prompt": swap(prompt), "completion": swap(row["completion"]),
            "expert_action": swap(row["expert_action"])}  # fmt: skip


def padded(rows: list[Any], pad: int) -> tuple[Any, Any]:
    import torch

    width = max(len(r[0]) for r in rows)
    x = torch.full((len(rows), width), pad)
    for i, r in enumerate(rows):
        x[i, : len(r[0])] = torch.tensor(r[0])
    return x, (x != pad).long()


def completion_loss(model: Any, rows: list[Any], pad: int, command_weight: float = 1.0) -> Any:
    """SFT's loss on the completion's tokens; the quoted command's tokens weigh
    `command_weight` times the rest (a weighted mean)."""
    import torch

    x, mask = padded(rows, pad)
    weights = torch.zeros(x.shape, dtype=torch.float32)
    for i, (ids, start, at, end, _) in enumerate(rows):
        weights[i, start - 1 : len(ids) - 1] = 1.0  # position t predicts token t + 1
        weights[i, at - 1 : end - 1] = command_weight
    logits = model(input_ids=x, attention_mask=mask).logits[:, :-1]
    losses = torch.nn.functional.cross_entropy(
        logits.flatten(0, 1), x[:, 1:].flatten(), reduction="none"
    )
    w = weights[:, :-1].flatten()
    return (losses * w).sum() / w.sum()


def command_accuracy(model: Any, rows: list[Any], tokenizer: Any) -> dict[str, float]:
    """Teacher-forced exact command, overall and per kind."""
    import torch

    hits: Counter[str] = Counter()
    with torch.no_grad():
        for i in range(0, len(rows), 16):
            chunk = rows[i : i + 16]
            x, mask = padded(chunk, tokenizer.pad_token_id)
            predicted = model(input_ids=x, attention_mask=mask).logits.argmax(-1)
            for j, (_, _, at, end, kind) in enumerate(chunk):
                hits[kind] += bool((predicted[j, at - 1 : end - 1] == x[j, at:end]).all())
    counts = Counter(r[4] for r in rows)
    shares = {k: round(hits[k] / counts[k], 3) for k in KINDS if counts[k]}
    return {"all": round(sum(hits.values()) / len(rows), 3), **shares}


def learning_curve(name: str, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from reflectrl.data.scratch import resolve_or_build
    from reflectrl.models.loading import load_causal_lm, load_tokenizer

    model_dir = resolve_or_build(TRUNKS[name]) if name in TRUNKS else Path(name)
    tokenizer = load_tokenizer(model_dir)
    model = load_causal_lm(model_dir)
    train = reflection_rows(args.data, "train", tokenizer, args.rename_files)
    held_out = reflection_rows(args.data, "eval", tokenizer)
    pad = tokenizer.pad_token_id
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    warmup = 50

    def lr_factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, args.steps - warmup)))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    draw = torch.Generator().manual_seed(0)
    before = command_accuracy(model, held_out, tokenizer)
    curve, started = [{"step": 0, "held_out": before, "train_s": 0}], time.perf_counter()
    for step in range(1, args.steps + 1):
        picks = torch.randint(len(train), (BATCH,), generator=draw).tolist()
        model.train()
        loss = completion_loss(model, [train[i] for i in picks], pad, args.command_weight)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        if step % args.every == 0 or step == args.steps:
            model.eval()
            point = {"step": step, "loss": round(float(loss.detach()), 4),
                     "held_out": command_accuracy(model, held_out, tokenizer),
                     "train_s": round(time.perf_counter() - started)}  # fmt: skip
            curve.append(point)
            line = f"{name}: step {step}, loss {point['loss']:.3f}, held-out {point['held_out']}"
            print(f"{line}, {point['train_s']} s", file=sys.stderr, flush=True)
    pretrained = model_dir / "pretrain.json"
    return {
        "trunk": name,
        "model": TRUNKS.get(name, name),
        "command_weight": args.command_weight,
        "rename_files": args.rename_files,
        "pretrain": json.loads(pretrained.read_text()) if pretrained.is_file() else None,
        "train_rows": len(train),
        "held_out_rows": len(held_out),
        "held_out_kinds": dict(Counter(r[4] for r in held_out)),
        "final": curve[-1]["held_out"],
        "seconds": curve[-1]["train_s"],
        "curve": curve,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="a `reflectrl data` folder")
    trunks = " or ".join(TRUNKS)
    parser.add_argument("--trunk", action="append",
                        help=f"{trunks}, or a model directory (default: both)")  # fmt: skip
    parser.add_argument("--steps", type=int, default=1000, help="SFT steps (the recipe's 1,000)")
    parser.add_argument("--every", type=int, default=250, help="score every this many steps")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--command-weight", type=float, default=1.0,
                        help="weight of the quoted command in the loss (1: SFT's)")  # fmt: skip
    parser.add_argument("--rename-files", type=float, default=0.0,
                        help="share of training rows with their files renamed")  # fmt: skip
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's)")
    parser.add_argument("--name", default="reflection_copy", help="results file name")
    args = parser.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    command = "python -m diagnostics.reflection_copy " + " ".join(sys.argv[1:])
    rows: list[dict[str, Any]] = []
    for trunk in args.trunk or TRUNKS:
        rows.append(learning_curve(trunk, args))
        payload = {"command": command.strip(), "data": str(args.data), "rows": rows,
                   "wall_s": round(time.perf_counter() - started)}  # fmt: skip
        path = write_results(args.name, payload, folder=RESULTS)
    flat = [{"trunk": r["trunk"], "seconds": r["seconds"], **r["final"]} for r in rows]
    print_table(flat, ["trunk", "all", *KINDS, "seconds"])
    print(path)


if __name__ == "__main__":
    main()
