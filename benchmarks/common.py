"""Helpers shared by the benchmark scripts: the results folder and a plain-text table."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "machine": platform.machine()}


def write_results(name: str, payload: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({**machine(), **payload}, indent=2) + "\n")
    return path


def print_table(rows: list[dict[str, Any]], columns: list[str]) -> None:
    widths = {c: max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in columns}
    print("  ".join(c.ljust(widths[c]) for c in columns))
    for row in rows:
        print("  ".join(_fmt(row.get(c)).ljust(widths[c]) for c in columns))


def _fmt(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


# Policy trunks the supervised benchmarks compare (grid_reading, policy_copy): `recipe` is the
# config's own model as built; the others are random-init over the same vocabulary.
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
