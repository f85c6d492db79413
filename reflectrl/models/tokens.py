"""Prompt -> fixed-shape token arrays, and the label-token check (no Ray, no torch modules)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from reflectrl.errors import ModelLoadError


def label_token_ids(tokenizer: Any, labels: Sequence[str], context: str) -> list[int]:
    """Token id of each label as the policy would emit it right after `context`.

    Fails unless every label is exactly one token *in context* (the tokenization of
    context + label is the tokenization of context plus one token), and all are distinct.
    """
    base = tokenizer.encode(context, add_special_tokens=False)
    ids: list[int] = []
    for label in labels:
        full = tokenizer.encode(context + label, add_special_tokens=False)
        if len(full) != len(base) + 1 or full[: len(base)] != base:
            raise ModelLoadError(
                f"policy.labels: label {label!r} is not a single token after {context!r} for "
                "this tokenizer; choose labels that are (e.g. digits or capital letters)"
            )
        ids.append(full[-1])
    if len(set(ids)) != len(ids):
        raise ModelLoadError("policy.labels: two labels map to the same token; make them distinct")
    return ids


def encode_prompt(
    tokenizer: Any, head: str, prompt: str, max_tokens: int
) -> tuple[np.ndarray, np.ndarray, int]:
    """Right-padded (input_ids, attention_mask, n_dropped) of length `max_tokens`.

    `prompt` must start with `head` (the task header). When the prompt is too long the
    tokens right after the head are dropped (the oldest part of the observation), so the
    header, the latest state, the menu and the action marker all survive; the published
    code truncated from the left and lost the task.
    """
    if not prompt.startswith(head):
        raise ValueError("prompt does not start with its head")
    head_ids = tokenizer.encode(head, add_special_tokens=False)
    body_ids = tokenizer.encode(prompt[len(head) :], add_special_tokens=False)
    room = max_tokens - len(head_ids)
    if room < min(len(body_ids), 16):
        raise ValueError(
            f"env.max_prompt_tokens={max_tokens} leaves no room after a {len(head_ids)}-token "
            "task header; raise env.max_prompt_tokens"
        )
    dropped = max(0, len(body_ids) - room)
    ids = head_ids + body_ids[dropped:]
    input_ids = np.full(max_tokens, _pad_id(tokenizer), dtype=np.int64)
    input_ids[: len(ids)] = ids
    attention_mask = np.zeros(max_tokens, dtype=np.int64)
    attention_mask[: len(ids)] = 1
    return input_ids, attention_mask, dropped


def _pad_id(tokenizer: Any) -> int:
    for candidate in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if candidate is not None:
            return int(candidate)
    return 0
