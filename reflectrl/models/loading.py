"""Load tokenizers and causal LMs from a local HF directory, and write seeded random-init
models of a given shape. Which directory a model spec names (and building it when needed) is
reflectrl/models/model_dirs.py's.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from reflectrl.errors import ModelLoadError

# Config attributes that hold a dropout probability, across model families (llama
# `attention_dropout`, gpt2 `resid_pdrop`/`embd_pdrop`/`attn_pdrop`, bert-style
# `hidden_dropout_prob`, `classifier_dropout`, `layerdrop`, ...).
_DROPOUT_KEY = re.compile(r"(dropout|pdrop|layerdrop)", re.IGNORECASE)


def load_tokenizer(model_dir: Path) -> Any:
    """The tokenizer of `model_dir`; a missing pad token falls back to EOS (prompts are padded)."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(one_line(f"cannot load tokenizer from {model_dir}: {exc}")) from exc
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_causal_lm(model_dir: Path, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """The causal LM of `model_dir` with every dropout probability 0, in eval mode.

    Dropout must be off even when RLlib later calls `train()` for the PPO update: the
    rollout and the update must see the same distribution, or the PPO ratios are biased.
    """
    from safetensors import SafetensorError
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    try:
        config = AutoConfig.from_pretrained(str(model_dir))
        zero_dropout_config(config)
        # No "Loading weights" bar: every worker loads the model, and a CLI error after a load
        # must stay one line.
        hf_logging.disable_progress_bar()
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), config=config, dtype=dtype)
    except (OSError, ValueError, KeyError, SafetensorError) as exc:
        raise ModelLoadError(one_line(f"cannot load model from {model_dir}: {exc}")) from exc
    finally:
        hf_logging.enable_progress_bar()
    # Some architectures hard-code a rate in a module instead of reading the config.
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    model.eval()
    return model


def zero_dropout_config(config: Any) -> list[str]:
    """Set every dropout probability of `config` and its sub-configs to 0; return the names."""
    changed: list[str] = []
    for key, value in list(vars(config).items()):
        if hasattr(value, "to_dict") and hasattr(value, "model_type"):  # a nested PretrainedConfig
            changed += [f"{key}.{name}" for name in zero_dropout_config(value)]
        elif (
            _DROPOUT_KEY.search(key)
            and isinstance(value, int | float)
            and not isinstance(value, bool)
            and value != 0
        ):
            setattr(config, key, 0.0)
            changed.append(key)
    return changed


# --- building and caching -------------------------------------------------------------------


def save_random_llama(tokenizer: Any, out: Path) -> None:
    """Write `tokenizer` and a seeded random-init Llama (2 layers x 128) over its vocabulary.

    head_dim = 128 / 2 = 64 is one of the head sizes vLLM's CPU attention supports.
    """
    from transformers import LlamaConfig

    _save_seeded(
        LlamaConfig,
        tokenizer,
        out,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        attention_dropout=0.0,
    )


def save_random_gpt2(tokenizer: Any, out: Path) -> None:
    """Write `tokenizer` and a seeded random-init GPT-2 of the Llama's size (2 layers x 128,
    MLP 256; learned absolute positions, up to 1024)."""
    from transformers import GPT2Config

    _save_seeded(
        GPT2Config,
        tokenizer,
        out,
        n_embd=128,
        n_layer=2,
        n_head=2,
        n_inner=256,
        n_positions=1024,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )


def _save_seeded(config_class: Any, tokenizer: Any, out: Path, **shape: Any) -> None:
    """A model of `config_class` and `shape` over `tokenizer`'s vocabulary and special ids."""
    from transformers import AutoModelForCausalLM

    config = config_class(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **shape,
    )
    # Seeded on a private generator state so the weights are the same on every machine
    # and the caller's global RNG is left untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))


# --- external specs ---------------------------------------------------------------------------


def one_line(text: str, limit: int = 400) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."
