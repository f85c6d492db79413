"""Helpers shared by the diagnostics: their results folder, the policy trunks the supervised
ones train, and the text action head over token-id prompts. `print_table` and `write_results`
come from benchmarks/common.py; a diagnostic passes `RESULTS` to `write_results`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"

# Policy trunks the supervised diagnostics compare (grid_reading, policy_copy, menu_lookup):
# `recipe` is the config's own model as built; the others are random-init over the same vocabulary.
TRUNK_SHAPES: dict[str, dict[str, Any]] = {
    "gpt2": {"layers": 2, "heads": 2, "width": 128},  # learned absolute positions
    "llama_2x128": {"layers": 2, "heads": 2, "width": 128},  # the recipe's shape, seed 0
    "llama_2x128_4h": {"layers": 2, "heads": 4, "width": 128},
    "llama_4x128": {"layers": 4, "heads": 2, "width": 128},
    "llama_4x256": {"layers": 4, "heads": 4, "width": 256},
}


def build_trunk(name: str, model_dir: Path, vocab: int, positions: int = 1024) -> Any:
    """Trunk `name` ("recipe" or a TRUNK_SHAPES key), seeded; MLPs are twice the width."""
    import torch
    from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig

    from reflectrl.models.loading import load_causal_lm

    if name == "recipe":
        return load_causal_lm(model_dir)
    shape = TRUNK_SHAPES[name]
    layers, heads, width = shape["layers"], shape["heads"], shape["width"]
    if name == "gpt2":
        config: Any = GPT2Config(
            vocab_size=vocab, n_embd=width, n_layer=layers, n_head=heads, n_inner=2 * width,
            n_positions=positions, resid_pdrop=0, embd_pdrop=0, attn_pdrop=0, bos_token_id=None,
            eos_token_id=None,
        )  # fmt: skip
    else:
        config = LlamaConfig(
            vocab_size=vocab, hidden_size=width, intermediate_size=2 * width,
            num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
            tie_word_embeddings=True, max_position_embeddings=max(positions, 2048),
        )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(config)


def add_head_arguments(parser: Any) -> None:
    """`--head` and `--text-loss`, for the diagnostics that train a trunk to pick from a menu."""
    parser.add_argument("--head", choices=("label", "text"), default="label",
                        help="label: one logit per menu label (the paper's); text: each action "
                        "scored by its own tokens' log-probability, per token")  # fmt: skip
    parser.add_argument("--text-loss", choices=("tokens", "choice"), default="tokens",
                        help="with --head text: tokens = the taught action's negative "
                        "log-likelihood (SFT's loss); choice = cross-entropy over the "
                        "menu")  # fmt: skip


# The text head reads at most this many tokens of an action (EOS included).
TEXT_TOKENS = 24


def text_head_scores(
    model: Any, tokenizer: Any, prompts: list[list[int]], menus: list[list[str]]
) -> tuple[Any, Any]:
    """The text head (reflectrl/models/action_text.py) over token-id prompts: each menu action
    scored by the log-probability of its own tokens, per token ([B, longest menu], short menus
    masked); and each action's summed log-probability (SFT's loss is the taught one's)."""
    import torch

    from reflectrl.models.action_text import action_log_probs, action_scores
    from reflectrl.text.tokens import encode_action_texts

    pad = tokenizer.pad_token_id
    x = torch.full((len(prompts), max(map(len, prompts))), pad)
    for i, row in enumerate(prompts):
        x[i, : len(row)] = torch.tensor(row)
    encoded = encode_action_texts(tokenizer, menus, max(map(len, menus)), TEXT_TOKENS)
    actions, mask, words = (torch.as_tensor(a) for a in encoded)
    log_probs, _ = action_log_probs(model.base_model, model.get_output_embeddings(), x,
                                    (x != pad).long(), actions, mask)  # fmt: skip
    return action_scores(log_probs, mask, words, mask[:, :, 0], "token"), log_probs
