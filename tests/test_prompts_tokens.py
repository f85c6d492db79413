from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from reflectrl.envs.base import TextObservation
from reflectrl.errors import ModelLoadError
from reflectrl.text import prompts
from reflectrl.text.tokens import fit_tokens, label_token_ids, pad_tokens

OBS = TextObservation(
    instruction="Deliver the passenger.",
    observation="grid here",
    actions=("go north", "go south", "pick up passenger"),
)


def encode_prompt(tokenizer: Any, prompt: prompts.Prompt, max_tokens: int) -> tuple:
    """Right-padded (input_ids, attention_mask, n_dropped), as the vector env encodes."""
    ids, dropped = fit_tokens(tokenizer, prompt, max_tokens)
    input_ids, attention_mask = pad_tokens(tokenizer, ids, max_tokens)
    return input_ids, attention_mask, dropped


def test_layouts_follow_the_method() -> None:
    refl = prompts.reflection_parts(OBS).text
    assert refl == "Deliver the passenger.\ngrid here # Analyze:\n"
    policy = prompts.policy_parts(OBS, " Go north first. ", "123", [0, 1, 2]).text
    assert policy.startswith(refl + "Go north first.")
    assert policy.endswith("1. go north\n2. go south\n3. pick up passenger # Action:\n")
    plain = prompts.no_reflection_parts(OBS, "123", [0, 1, 2]).text
    assert "# Analyze" not in plain and plain.endswith(" # Action:\n")
    assert plain.startswith(prompts.prompt_head(OBS))


def test_menu_order_maps_labels_to_actions() -> None:
    menu = prompts.render_menu(OBS.actions, "ABC", [2, 0, 1])
    assert menu.splitlines() == ["A. pick up passenger", "B. go north", "C. go south"]
    with pytest.raises(ValueError):
        prompts.render_menu(OBS.actions, "AB", [0, 1, 2])


def test_labels_are_single_tokens_in_context(tokenizer: Any) -> None:
    ids = label_token_ids(tokenizer, "123ABC", prompts.ACTION_MARKER)
    assert len(set(ids)) == 6
    for label, token in zip("123ABC", ids, strict=True):
        assert tokenizer.decode([token]) == label
    # "10" is two digit tokens for SmolLM2's tokenizer: the start-up check must refuse it.
    with pytest.raises(ModelLoadError, match="'10' is not a single token"):
        label_token_ids(tokenizer, ["1", "10"], prompts.ACTION_MARKER)
    with pytest.raises(ModelLoadError, match="same token"):
        label_token_ids(tokenizer, ["A", "A"], prompts.ACTION_MARKER)


def test_encode_pads_right_and_masks(tokenizer: Any) -> None:
    prompt = prompts.no_reflection_parts(OBS, "123", [0, 1, 2])
    ids, mask, dropped = encode_prompt(tokenizer, prompt, 128)
    n = int(mask.sum())
    assert dropped == 0 and ids.shape == mask.shape == (128,)
    assert mask[:n].all() and not mask[n:].any()
    assert tokenizer.decode(ids[:n]) == prompt.text
    # A prompt that fits is tokenized whole, exactly as a tokenizer call on its text.
    assert list(ids[:n]) == tokenizer.encode(prompt.text, add_special_tokens=False)


def test_every_prompt_is_head_body_tail() -> None:
    reflection = prompts.reflection_parts(OBS)
    policy = prompts.policy_parts(OBS, "Go north.", "123", [0, 1, 2])
    plain = prompts.no_reflection_parts(OBS, "123", [0, 1, 2])
    for parts in (reflection, policy, plain):
        assert parts.head == prompts.prompt_head(OBS) and parts.body == OBS.observation
    assert policy.text.startswith(reflection.text)  # the method's layout: policy extends it


def test_last_resort_cut_keeps_header_current_state_and_menu(tokenizer: Any) -> None:
    # The body starts with the current state and ends with the oldest/least useful text; when
    # the env could not shorten it enough, its *end* is cut, never its start.
    long_obs = TextObservation(
        instruction="TASK HEADER: deliver.",
        observation="CURRENT STATE here\n" + " ".join(f"line{i}" for i in range(400)),
        actions=OBS.actions,
    )
    prompt = prompts.policy_parts(long_obs, "REFLECTION text.", "123", [0, 1, 2])
    ids, mask, dropped = encode_prompt(tokenizer, prompt, 96)
    text = tokenizer.decode(ids[mask.astype(bool)])
    assert dropped > 0 and int(mask.sum()) <= 96
    assert text.startswith("TASK HEADER: deliver.\nCURRENT STATE here")
    assert text.endswith(
        "REFLECTION text.\nValid actions:\n1. go north\n2. go south\n"
        "3. pick up passenger # Action:\n"
    )
    assert "line0 " in text and "line399" not in text


def test_too_short_a_budget_is_an_error(tokenizer: Any) -> None:
    prompt = prompts.Prompt("word " * 60 + "\n", "x" * 50, " # Action:\n")
    with pytest.raises(ValueError, match="max_prompt_tokens"):
        encode_prompt(tokenizer, prompt, 64)


def test_pad_value_is_masked_out(tokenizer: Any) -> None:
    ids, mask, _ = encode_prompt(tokenizer, prompts.Prompt("a\n", "b", ""), 16)
    assert np.all(ids[mask == 0] == tokenizer.pad_token_id)
