"""SFT rows -> token ids with the loss on the completion only (no TRL, no torch).

The ids are built here rather than by TRL's tokenizer so they are exactly what each player
reads at run time: the policy's prompt is encoded as the vector env encodes it (no special
tokens; at most `env.max_prompt_tokens`) and its completion is the one label token, or with
the text action head the chosen action's own tokens as that head scores them; the reflection
prompt is encoded as the server receives it and its completion is the reflection. Every
completion ends with EOS (where generation stops; the text head scores it too).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from reflectrl.data.dataset import DATA_FILE, STATS_FILE
from reflectrl.errors import ConfigError
from reflectrl.text.prompts import ACTION_MARKER, MENU_HEADER
from reflectrl.text.tokens import action_text_ids

Player = Literal["reflection", "policy"]
PLAYERS: tuple[Player, ...] = ("reflection", "policy")
IGNORE = -100  # label of a token outside the loss (PyTorch's cross-entropy ignore_index)


def target_of(player: Player, reflection_enabled: bool) -> str:
    """The data set target a player learns: the policy reads a reflection only if RL gives it
    one."""
    if player == "reflection":
        return "sft_reflection"
    return "sft_policy" if reflection_enabled else "sft"


def check_data_dir(data_dir: Path) -> None:
    for name in (DATA_FILE, STATS_FILE):
        if not (data_dir / name).is_file():
            raise ConfigError(
                f"--data {data_dir}: no {name}; write a data set there with "
                f"`reflectrl data --out {data_dir}`"
            )


def load_rows(data_dir: Path, target: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train rows, eval rows) of `target` from `data_dir/data.jsonl`."""
    check_data_dir(data_dir)
    train: list[dict[str, Any]] = []
    held: list[dict[str, Any]] = []
    with (data_dir / DATA_FILE).open() as f:
        for n, line in enumerate(f, 1):
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                raise ConfigError(f"{data_dir / DATA_FILE}: line {n} is not JSON") from None
            if row.get("target") == target:
                (held if row.get("split") == "eval" else train).append(row)
    if not train:
        raise ConfigError(f"{data_dir / DATA_FILE}: no training rows of target {target!r}")
    return train, held


@dataclass
class Encoded:
    # {"input_ids", "labels"} per row, and "loss_weights" (one per label) when weighed
    examples: list[dict[str, Any]]
    skipped: int  # rows whose prompt exceeds the player's budget


def quoted_command_span(tokenizer: Any, completion: str, command: str) -> tuple[int, int] | None:
    """Where, among the ids of `completion`, the last `"command"` it quotes sits: the tokens
    between the quotes, as (start, end). None when it quotes none, or when the command's first
    or last token also holds a character outside it (then no token is the command's alone)."""
    quoted = f'"{command}"'
    at = completion.rfind(quoted)
    if at < 0 or not command:
        return None
    ids = tokenizer.encode(completion, add_special_tokens=False)
    before = tokenizer.encode(completion[: at + 1], add_special_tokens=False)
    upto = tokenizer.encode(completion[: at + len(quoted) - 1], add_special_tokens=False)
    if ids[: len(upto)] != upto or upto[: len(before)] != before or len(upto) == len(before):
        return None
    return len(before), len(upto)


def menu_action(prompt: str, label: str) -> str:
    """The action the menu of a policy prompt shows under `label`."""
    menu = prompt.rsplit(MENU_HEADER, 1)[-1].removesuffix(ACTION_MARKER)
    for line in menu.split("\n"):
        if line.startswith(f"{label}. "):
            return line[len(label) + 2 :]
    raise ConfigError(f"completion {label!r} is not a label on its prompt's menu")


def taught_action(row: dict[str, Any]) -> str:
    """The action text a policy row teaches: its menu's line under the row's label, or the
    expert's action the data recorded when the prompt leaves the menu out
    (`policy.show_menu: false`)."""
    if MENU_HEADER in row["prompt"]:
        return menu_action(row["prompt"], row["completion"])
    return str(row["expert_action"])


def encode_rows(
    rows: list[dict[str, Any]],
    tokenizer: Any,
    max_prompt_tokens: int,
    single_token: bool,
    action_max_tokens: int | None = None,
    command_weight: float = 1.0,
) -> Encoded:
    """Prompt ids + completion ids + EOS; labels are IGNORE over the prompt.

    `single_token`: the completion must be one token (a menu label), as the label head scores
    it. `action_max_tokens` (the text action head): the completion is the labelled action's
    text, as the head scores it (EOS included, at most this many tokens). `command_weight` (the
    reflection) != 1: each row also gets `loss_weights`, 1 per completion token and this much
    on the tokens of the expert's command that the completion quotes last.
    """
    if tokenizer.eos_token_id is None:
        raise ConfigError("the tokenizer has no EOS token; SFT needs one to end completions")
    examples: list[dict[str, list[int]]] = []
    skipped = 0
    for row in rows:
        prompt = tokenizer.encode(row["prompt"], add_special_tokens=False)
        if action_max_tokens is not None:
            action = taught_action(row)
            completion = action_text_ids(tokenizer, action, action_max_tokens)
        else:
            completion = tokenizer.encode(row["completion"], add_special_tokens=False)
        if single_token and action_max_tokens is None and len(completion) != 1:
            raise ConfigError(
                f"completion {row['completion']!r} is {len(completion)} tokens for this "
                "tokenizer; policy labels must be single tokens (policy.labels)"
            )
        if len(prompt) > max_prompt_tokens:
            skipped += 1
            continue
        if action_max_tokens is None:  # action_text_ids ends with EOS already
            completion = [*completion, int(tokenizer.eos_token_id)]
        example: dict[str, Any] = {
            "input_ids": prompt + completion,
            "labels": [IGNORE] * len(prompt) + completion,
        }
        if command_weight != 1.0:
            weights = [0.0] * len(prompt) + [1.0] * len(completion)
            span = quoted_command_span(tokenizer, row["completion"], str(row["expert_action"]))
            if span is not None:
                start, end = span
                weights[len(prompt) + start : len(prompt) + end] = [command_weight] * (end - start)
            example["loss_weights"] = weights
        examples.append(example)
    return Encoded(examples, skipped)
