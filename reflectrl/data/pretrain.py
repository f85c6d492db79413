"""A short generic pretraining of a from-scratch trunk on synthetic copy and lookup text, so that
it brings the circuits a pretrained LM has (copying what came after an earlier match, fetching
a value by its key) before SFT (`scratch:<env>:llama_copy`).

The text uses no expert action, no env reward and no env state: only the words of the env's
tokenizer, put together at random into names, lists and questions. Five kinds of example, each a
prompt and an answer (the loss is on the answers only; the prompts are random):
- `repeat`: a run of names, then the same run again (induction: copy what followed last time);
- `lookup`: `key = value` lines, then a key, answered with its value;
- `match`: a list of file-like names (`mixed_model.py`), then one name's words in CamelCase
  (`MixedModel`), answered with that name, quoted;
- `contains`: a few lines (`class MixedModel`, `def run_all`), then a name, answered `yes` if a
  line defines it and `no` otherwise;
- `unseen`: a list of names and the ones already done, answered with the first one not done.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

KINDS = ("repeat", "lookup", "match", "contains", "unseen")
SUFFIXES = (".py", ".md", ".txt", ".toml", ".yaml", ".json", ".cfg", ".rs")
SEQUENCE_TOKENS = 512  # examples are packed into rows of this many tokens


@dataclass(frozen=True)
class Example:
    kind: str
    prompt: str
    answer: str


@dataclass(frozen=True)
class PretrainResult:
    steps: int
    seconds: float
    loss_first: float
    loss_last: float
    accuracy: dict[str, float]  # held-out exact answers, per kind (greedy, teacher-forced)


def vocabulary_words(tokenizer: Any) -> list[str]:
    """The tokenizer's lower-case alphabetic tokens of 3-8 letters, sorted: the words names are
    built from (every one encodes to few tokens)."""
    words = set()
    for token_id in range(len(tokenizer)):
        text = tokenizer.decode([token_id])
        if text.isascii() and text.isalpha() and text.islower() and 3 <= len(text) <= 8:
            words.add(text)
    if len(words) < 20:
        raise ValueError(f"the tokenizer has {len(words)} alphabetic words; pretraining needs 20")
    return sorted(words)


class TextSource(Protocol):
    """Seeded examples of a few kinds (this module's `SyntheticText`, or an env's reading text
    such as reflectrl/data/pretrain_taxi.py's)."""

    kinds: tuple[str, ...]

    def example(self, kind: str | None = None) -> Example: ...


class SyntheticText:
    """Examples of every kind, drawn from a seeded generator."""

    kinds = KINDS

    def __init__(self, words: list[str], seed: int) -> None:
        self.words = words
        self.rng = np.random.default_rng(seed)
        self._makers: dict[str, Callable[[], Example]] = {
            "repeat": self.repeat,
            "lookup": self.lookup,
            "match": self.match,
            "contains": self.contains,
            "unseen": self.unseen,
        }

    def example(self, kind: str | None = None) -> Example:
        return self._makers[kind or KINDS[int(self.rng.integers(len(KINDS)))]]()

    def _parts(self, low: int = 1, high: int = 3) -> list[str]:
        count = int(self.rng.integers(low, high + 1))
        return [self.words[int(i)] for i in self.rng.integers(len(self.words), size=count)]

    def _distinct(self, count: int, make: Callable[[], str]) -> list[str]:
        names: list[str] = []
        while len(names) < count:
            name = make()
            if name not in names:
                names.append(name)
        return names

    def _file(self) -> str:
        return "_".join(self._parts()) + SUFFIXES[int(self.rng.integers(len(SUFFIXES)))]

    def repeat(self) -> Example:
        run = " ".join(self._distinct(int(self.rng.integers(3, 13)), self._file))
        return Example("repeat", f"Say: {run}\nAgain: ", run)

    def lookup(self) -> Example:
        keys = self._distinct(int(self.rng.integers(3, 10)), lambda: "_".join(self._parts()))
        values = [" ".join(self._parts(1, 2)) for _ in keys]
        asked = int(self.rng.integers(len(keys)))
        lines = "\n".join(f"{k} = {v}" for k, v in zip(keys, values, strict=True))
        return Example("lookup", f"{lines}\nWhat is {keys[asked]}? ", values[asked])

    def match(self) -> Example:
        names = self._distinct(int(self.rng.integers(3, 16)), self._file)
        asked = names[int(self.rng.integers(len(names)))]
        camel = "".join(w.capitalize() for w in asked.rsplit(".", 1)[0].split("_"))
        listing = "\n".join(names)
        return Example("match", f"{listing}\nWhich one is {camel}? ", f'"{asked}"')

    def contains(self) -> Example:
        names = self._distinct(int(self.rng.integers(3, 8)), lambda: "_".join(self._parts()))
        # A line defines each name, as a class (in CamelCase) or a function (as it is).
        lines = [
            "class " + "".join(w.capitalize() for w in n.split("_"))
            if self.rng.random() < 0.5
            else f"def {n}"
            for n in names
        ]
        shown = int(self.rng.integers(1, len(names)))  # only the first lines are shown
        asked = int(self.rng.integers(len(names)))
        name = lines[asked].split(" ", 1)[1]
        text = "\n".join(lines[:shown])
        return Example("contains", f"{text}\nDefines {name}? ", "yes" if asked < shown else "no")

    def unseen(self) -> Example:
        names = self._distinct(int(self.rng.integers(3, 12)), self._file)
        done_count = int(self.rng.integers(0, len(names)))
        done = [names[int(i)] for i in self.rng.permutation(len(names))[:done_count]]
        first = next(n for n in names if n not in done)
        return Example(
            "unseen", f"All: {' '.join(names)}\nDone: {' '.join(done)}\nNext: ", f'"{first}"'
        )


def encode(tokenizer: Any, example: Example) -> tuple[list[int], list[int]]:
    """(token ids, the positions' targets with -100 where no loss): the prompt and the answer
    tokenized apart, then the end-of-text token, so the answer starts on a token boundary."""
    prompt = tokenizer.encode(example.prompt, add_special_tokens=False)
    answer = tokenizer.encode(example.answer, add_special_tokens=False)
    ids = [*prompt, *answer, tokenizer.eos_token_id]
    targets = [-100] * len(prompt) + [*answer, tokenizer.eos_token_id]
    return ids, targets


def packed_batch(
    tokenizer: Any, text: TextSource, rows: int, length: int = SEQUENCE_TOKENS
) -> tuple[torch.Tensor, torch.Tensor]:
    """`rows` rows of `length` tokens, each packed with whole examples; targets shifted by one
    (the target at position t is the token at t + 1, or -100)."""
    inputs = torch.full((rows, length), tokenizer.pad_token_id)
    targets = torch.full((rows, length), -100)
    for r in range(rows):
        at = 0
        while True:
            ids, wanted = encode(tokenizer, text.example())
            if at + len(ids) > length:
                break
            inputs[r, at : at + len(ids)] = torch.tensor(ids)
            # Position t predicts the token at t + 1.
            targets[r, at : at + len(ids) - 1] = torch.tensor(wanted[1:])
            at += len(ids)
    return inputs, targets


def accuracy(model: Any, tokenizer: Any, text: TextSource, per_kind: int = 64) -> dict[str, float]:
    """The share of `text`'s examples (held out: seeded apart from training's) whose every
    answer token is the model's argmax, per kind."""
    shares = {}
    with torch.no_grad():
        for kind in text.kinds:
            hits = 0
            for _ in range(per_kind):
                ids, targets = encode(tokenizer, text.example(kind))
                logits = model(input_ids=torch.tensor([ids])).logits[0, :-1]
                wanted = torch.tensor(targets[1:])
                scored = wanted != -100
                hits += bool((logits.argmax(-1)[scored] == wanted[scored]).all())
            shares[kind] = hits / per_kind
    return shares


def pretrain(
    model: Any,
    tokenizer: Any,
    steps: int,
    seed: int,
    batch_rows: int = 16,
    lr: float = 1e-3,
    log: Callable[[str], None] | None = None,
    scored_per_kind: int = 64,
    make_text: Callable[[int], TextSource] | None = None,
) -> PretrainResult:
    """Train `model` in place for `steps` steps (AdamW, linear warmup over the first 5%, then
    constant), seeded, on `make_text(seed)`'s examples (default: the synthetic copy and lookup
    text over the tokenizer's words); returns the losses and the held-out accuracy per kind."""
    if make_text is None:
        words = vocabulary_words(tokenizer)

        def make_text(seed: int) -> TextSource:
            return SyntheticText(words, seed)

    text = make_text(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    warmup = max(1, steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup))
    model.train()
    started, losses = time.perf_counter(), []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for step in range(1, steps + 1):
            inputs, targets = packed_batch(tokenizer, text, batch_rows)
            logits = model(input_ids=inputs).logits
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            losses.append(float(loss.detach()))
            if log is not None and (step % 100 == 0 or step == steps):
                log(f"pretrain step {step}/{steps}: loss {losses[-1]:.3f}")
    model.eval()
    return PretrainResult(
        steps=steps,
        seconds=round(time.perf_counter() - started, 1),
        loss_first=round(losses[0], 4),
        loss_last=round(float(np.mean(losses[-20:])), 4),
        accuracy=accuracy(model, tokenizer, make_text(seed + 1_000_003), scored_per_kind),
    )
