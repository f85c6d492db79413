"""Prompt -> fixed-shape token arrays, and the label-token check (no Ray, no torch modules)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from reflectrl.errors import ModelLoadError
from reflectrl.text.prompts import Prompt


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


def count_tokens(tokenizer: Any, text: str) -> int:
    return len(tokenizer.encode(text, add_special_tokens=False))


def fit_tokens(tokenizer: Any, prompt: Prompt, max_tokens: int) -> tuple[list[int], int]:
    """(token ids, n_dropped): the whole prompt when it fits, else head + the start of the body
    + tail, dropping the *end* of the body (the env has already trimmed what it could; the start
    of the body is the current state, the head the task, the tail the menu and markers)."""
    ids = tokenizer.encode(prompt.text, add_special_tokens=False)
    if len(ids) <= max_tokens:
        return ids, 0
    head = tokenizer.encode(prompt.head, add_special_tokens=False)
    body = tokenizer.encode(prompt.body, add_special_tokens=False)
    tail = tokenizer.encode(prompt.tail, add_special_tokens=False)
    room = max_tokens - len(head) - len(tail)
    if room < min(len(body), 16):
        raise ValueError(
            f"a token budget of {max_tokens} leaves no room for the observation after a "
            f"{len(head)}-token task header and a {len(tail)}-token menu; raise "
            "env.max_prompt_tokens (policy) or reflection.max_model_len (reflection)"
        )
    kept = body[: max(room, 0)]
    return head + kept + tail, len(body) - len(kept)


def pad_tokens(tokenizer: Any, ids: list[int], length: int) -> tuple[np.ndarray, np.ndarray]:
    """Right-padded (input_ids, attention_mask) of `length`."""
    if len(ids) > length:
        raise ValueError(f"{len(ids)} tokens do not fit {length}")
    input_ids = np.full(length, _pad_id(tokenizer), dtype=np.int64)
    input_ids[: len(ids)] = ids
    attention_mask = np.zeros(length, dtype=np.int64)
    attention_mask[: len(ids)] = 1
    return input_ids, attention_mask


def _pad_id(tokenizer: Any) -> int:
    for candidate in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if candidate is not None:
            return int(candidate)
    return 0


def action_text_ids(tokenizer: Any, text: str, longest: int) -> list[int]:
    """The tokens the text action head scores for an action (policy.action_head=text), and
    what SFT trains as its completion: ` <text>` as the answer continues the prompt, then
    EOS (so an action that is a prefix of another does not outscore it), cut to `longest`."""
    ids = tokenizer.encode(" " + text, add_special_tokens=False)
    return [*ids, int(tokenizer.eos_token_id)][:longest]


def encode_action_texts(
    tokenizer: Any,
    rows: Sequence[Sequence[str]],
    width: int,
    longest: int,
    known: dict[str, list[int]] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(action_ids int64 [B, width, longest], action_mask int64 [B, width, longest],
    action_words float32 [B, width]) of rows of action texts, each row padded to `width`
    actions (empty slots: no tokens, 0 words). `known`: a cache of texts already tokenized
    (the vector env keeps one: menus repeat from step to step)."""
    ids = np.full((len(rows), width, longest), _pad_id(tokenizer), dtype=np.int64)
    mask = np.zeros((len(rows), width, longest), dtype=np.int64)
    words = np.zeros((len(rows), width), dtype=np.float32)
    for i, row in enumerate(rows):
        if len(row) > width:
            raise ValueError(f"{len(row)} actions do not fit {width} slots")
        for k, text in enumerate(row):
            if known is None:
                tokens = action_text_ids(tokenizer, text, longest)
            elif text in known:
                tokens = known[text]
            else:
                tokens = known[text] = action_text_ids(tokenizer, text, longest)
            ids[i, k, : len(tokens)] = tokens
            mask[i, k, : len(tokens)] = 1
            words[i, k] = len(text.split())
    return ids, mask, words
