"""Peft LoRA adapters from SFT: check that one fits a model before anything loads it.

The policy continues training the SFT adapter, so it must have the shapes `policy.lora` makes;
the reflection server serves its adapter as it is, so it must only fit the base model.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reflectrl.errors import ModelLoadError

if TYPE_CHECKING:  # torch loads in seconds; reading an adapter's config needs none of it
    import torch

ADAPTER_CONFIG = "adapter_config.json"
# The ranks vLLM accepts for `--max-lora-rank` (vllm.config.lora.MaxLoRARanks).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def read_adapter_config(directory: str | Path, key: str) -> dict[str, Any]:
    """The adapter's peft config; a one-line error when `directory` is not a LoRA adapter."""
    path = Path(directory)
    config_file = path / ADAPTER_CONFIG
    if not config_file.is_file():
        raise ModelLoadError(
            f"{key} {path}: not a peft adapter (no {ADAPTER_CONFIG}); pass a folder written by "
            "`reflectrl sft` (OUT/policy or OUT/reflection)"
        )
    try:
        config = json.loads(config_file.read_text())
    except json.JSONDecodeError:
        raise ModelLoadError(f"{key} {path}: {ADAPTER_CONFIG} is not JSON") from None
    if config.get("peft_type") != "LORA":
        raise ModelLoadError(
            f"{key} {path}: a {config.get('peft_type')} adapter; only LoRA adapters are supported"
        )
    return config


def adapter_weights(directory: str | Path, key: str) -> dict[str, torch.Tensor]:
    from peft.utils import load_peft_weights

    try:
        return load_peft_weights(str(directory), device="cpu")
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"{key} {directory}: cannot read the adapter weights: {err}") from None


def check_lora_settings(
    found: dict[str, Any],
    r: int,
    alpha: int,
    target_modules: Iterable[str],
    key: str,
    directory: str | Path,
) -> str:
    """The adapter config `found` must be the LoRA the policy trains (rank, alpha, modules):
    PPO goes on training it, and another alpha would silently rescale what SFT learned.
    Returns the hint for later errors."""
    hint = (
        f"set policy.lora.r={found['r']}, policy.lora.alpha={found['lora_alpha']} and "
        f"policy.lora.target_modules={sorted(found['target_modules'])} as in the adapter"
    )
    if (found["r"], found["lora_alpha"], sorted(found["target_modules"])) != (
        r,
        alpha,
        sorted(target_modules),
    ):
        raise ModelLoadError(
            f"{key} {directory}: the adapter has LoRA r={found['r']}, alpha={found['lora_alpha']}, "
            f"modules {sorted(found['target_modules'])} but policy.lora has r={r}, "
            f"alpha={alpha}, modules {sorted(target_modules)}; {hint}"
        )
    return hint


def check_lora_shapes(
    found: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], key: str, hint: str
) -> None:
    """The adapter's tensors (peft's saved names) must be exactly `expected`'s, shape by shape."""
    missing = sorted(set(expected) - set(found))
    extra = sorted(set(found) - set(expected))
    if extra or missing:
        name = (extra or missing)[0]
        where = "the adapter has" if extra else "the model needs"
        raise ModelLoadError(
            f"{key}: {where} {name} and the other does not; the adapter was trained for "
            f"another model or other LoRA target modules ({hint})"
        )
    for name, tensor in expected.items():
        if found[name].shape != tensor.shape:
            raise ModelLoadError(
                f"{key}: {name} has shape {list(found[name].shape)} in the adapter but "
                f"{list(tensor.shape)} in the model; {hint}"
            )


def check_adapter_fits(directory: str | Path, model_dir: Path, key: str) -> dict[str, Any]:
    """Build the adapter's own LoRA over `model_dir` and compare shapes; returns its config."""
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict

    from reflectrl.models.loading import load_causal_lm

    config = read_adapter_config(directory, key)
    lora = LoraConfig(
        r=config["r"],
        lora_alpha=config["lora_alpha"],
        target_modules=config["target_modules"],
        task_type="CAUSAL_LM",
    )
    try:
        model = get_peft_model(load_causal_lm(model_dir), lora)
    except ValueError as err:  # a target module the model does not have
        raise ModelLoadError(f"{key} {directory}: does not fit {model_dir}: {err}") from None
    expected = get_peft_model_state_dict(model)
    hint = f"train the adapter on {model_dir}"
    check_lora_shapes(adapter_weights(directory, key), expected, key, hint)
    return config


def vllm_max_lora_rank(rank: int) -> int:
    """The smallest `--max-lora-rank` vLLM accepts that holds an adapter of `rank`."""
    for allowed in VLLM_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ModelLoadError(f"LoRA rank {rank} exceeds vLLM's largest ({VLLM_LORA_RANKS[-1]})")


def check_lora_targets(model_dir: Path, targets: Iterable[str], key: str) -> None:
    """Every LoRA target names a layer of the model (peft's rule: the module's name, or its
    last dotted parts). The names differ by architecture (Llama `q_proj`, GPT-2 `c_attn`), so
    a wrong one fails here in one line, before anything trains, instead of inside peft."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.pytorch_utils import Conv1D

    config = AutoConfig.from_pretrained(str(model_dir))
    with torch.device("meta"):  # the module tree without allocating any weights
        model = AutoModelForCausalLM.from_config(config)
    layers = {
        name
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear | Conv1D) and name
    }
    suffixes = {".".join(name.split(".")[-k:]) for name in layers for k in (1, 2)}
    unknown = [t for t in targets if t not in layers and t not in suffixes]
    if unknown:
        available = sorted({name.split(".")[-1] for name in layers} - {"lm_head"})
        raise ModelLoadError(
            f"{key}={list(targets)}: {unknown[0]!r} is no layer of {model_dir.name} "
            f"({config.model_type}); its layers are {', '.join(available)}: set {key} to some "
            "of them"
        )
