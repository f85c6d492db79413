"""RLlib adapter over `OptionPolicy` (the model math lives in reflectrl.models, Ray-free).

- action distribution inputs = masked label logits (a Categorical over K labels);
- `compute_values` without embeddings is the GAE connector's call on the whole train batch:
  it runs without gradients and in micro-batches, or a real LM runs out of memory;
- the state RLlib syncs to EnvRunners (`inference_only=True`) is the LoRA tensors only, and
  checkpoints hold LoRA + value head: the base LM is frozen and reloaded from its directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.apis import ValueFunctionAPI
from ray.rllib.core.rl_module.torch import TorchRLModule
from ray.rllib.utils.typing import StateDict

from reflectrl.models.policy import OptionPolicy

OBS_KEYS = ("input_ids", "attention_mask", "option_mask")


class ReflectRLModule(TorchRLModule, ValueFunctionAPI):
    """model_config keys: model_dir, label_token_ids, lora_r, lora_alpha,
    lora_target_modules, seed, value_micro_batch."""

    def setup(self) -> None:
        cfg = self.model_config
        self.policy = OptionPolicy(
            model_dir=Path(cfg["model_dir"]),
            label_token_ids=cfg["label_token_ids"],
            lora_r=cfg["lora_r"],
            lora_alpha=cfg["lora_alpha"],
            lora_target_modules=cfg["lora_target_modules"],
            seed=cfg["seed"],
            gradient_checkpointing=cfg.get("gradient_checkpointing", True),
        )
        self.value_micro_batch = int(cfg["value_micro_batch"])

    def _forward(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        obs = batch[Columns.OBS]
        hidden = self.policy.encode(obs["input_ids"], obs["attention_mask"])
        return {
            Columns.ACTION_DIST_INPUTS: self.policy.label_logits(hidden, obs["option_mask"]),
            Columns.EMBEDDINGS: hidden,
        }

    def _forward_inference(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        # Sampling never needs gradients: without no_grad every rollout step builds a graph.
        with torch.no_grad():
            out = self._forward(batch)
        out.pop(Columns.EMBEDDINGS)
        return out

    _forward_exploration = _forward_inference

    def compute_values(self, batch: dict[str, Any], embeddings: Any | None = None) -> torch.Tensor:
        if embeddings is not None:  # the PPO loss: reuse the forward pass, with gradients
            return self.policy.value(embeddings)
        obs = batch[Columns.OBS]
        values = []
        with torch.no_grad():
            n = obs["input_ids"].shape[0]
            for start in range(0, n, self.value_micro_batch):
                part = slice(start, start + self.value_micro_batch)
                hidden = self.policy.encode(obs["input_ids"][part], obs["attention_mask"][part])
                values.append(self.policy.value(hidden))
        return torch.cat(values) if values else torch.zeros(0)

    def get_state(
        self,
        components: Any = None,
        *,
        not_components: Any = None,
        inference_only: bool = False,
        **kwargs: Any,
    ) -> StateDict:
        state = self.policy.lora_state() if inference_only else self.policy.trainable_state()
        return {f"policy.{k}": v.detach().cpu().numpy() for k, v in state.items()}

    def set_state(self, state: StateDict) -> None:
        prefix = "policy."
        unexpected = [k for k in state if not k.startswith(prefix)]
        if unexpected:
            raise ValueError(f"unexpected module state keys: {unexpected[:3]}")
        self.policy.load_trainable_state({k[len(prefix) :]: v for k, v in state.items()})


def state_nbytes(state: StateDict) -> int:
    """Bytes of a module state as RLlib ships it (numpy arrays)."""
    return int(sum(getattr(v, "nbytes", 0) for v in state.values()))
