"""RLlib adapter over `OptionPolicy` (the model math lives in reflectrl.models, Ray-free).

- action distribution inputs = the masked logits of the policy's action head (a Categorical
  over the K menu slots);
- rollouts (`forward_exploration` / `forward_inference`) run the LM only on live rows: the last
  observation of an episode (obs `live` = 0) gets placeholder logits, since NEXT_STEP autoreset
  ignores the action computed for it; they also return V(s) and the weights version;
- `compute_values` without embeddings is the GAE connector's call on the whole train batch: it
  reuses the rollout values of rows sampled with the current weights and runs the LM, without
  gradients and in micro-batches, only on the other rows (the bootstrap rows, mostly);
- the state RLlib syncs to EnvRunners and checkpoints is LoRA + value head + weights version:
  the base LM is frozen and reloaded from its directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypedDict

import numpy as np
import torch
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.apis import ValueFunctionAPI
from ray.rllib.core.rl_module.torch import TorchRLModule
from ray.rllib.utils.typing import StateDict

from reflectrl.cluster.node_files import Packed, local_copy, pack_dir
from reflectrl.config import PolicyConfig, ReflectRLConfig
from reflectrl.models.policy import MASKED_LOGIT, build_policy

# Per-row column of the rollout outputs: how many optimizer steps the sampling weights had.
WEIGHTS_VERSION = "weights_version"
POLICY_PREFIX = "policy."


class ModuleConfig(TypedDict):
    """The RLModule's `model_config`: the run's validated policy section and what the driver
    resolved from the config. JSON-able: RLlib ships it to every learner and worker."""

    policy: dict[str, Any]  # PolicyConfig.model_dump(mode="json")
    model_dir: str
    label_token_ids: list[int]
    seed: int
    critic: bool  # a value head (rl.advantage=gae); the critic-free estimators build none
    # The SFT adapter's files travel with the module: learners and workers on other nodes.
    init_adapter_files: Packed | None


def module_config(
    config: ReflectRLConfig, model_dir: Path, label_token_ids: list[int]
) -> ModuleConfig:
    adapter = config.policy.init_adapter
    return ModuleConfig(
        policy=config.policy.model_dump(mode="json"),
        model_dir=str(model_dir),
        label_token_ids=list(label_token_ids),
        seed=config.run.seed,
        critic=config.rl.critic,
        init_adapter_files=pack_dir(Path(adapter)) if adapter else None,
    )


class ReflectRLModule(TorchRLModule, ValueFunctionAPI):
    """model_config: a `ModuleConfig`."""

    def setup(self) -> None:
        cfg: ModuleConfig = self.model_config
        settings = PolicyConfig.model_validate(cfg["policy"])
        # Rollout workers build the module inference-only; the learner trains in float32.
        self.policy = build_policy(
            settings,
            Path(cfg["model_dir"]),
            cfg["label_token_ids"],
            cfg["seed"],
            for_rollouts=self.inference_only,
            critic=cfg["critic"],
        )
        if settings.init_adapter:  # then a checkpoint, if any, overrides it on restore
            adapter = settings.init_adapter
            if cfg["init_adapter_files"]:  # this node may not have the driver's path
                adapter = local_copy(adapter, cfg["init_adapter_files"])
            self.policy.load_sft_adapter(adapter)
        self.micro_batch_size = settings.micro_batch_size
        self.critic = cfg["critic"]
        self.values_from_rollouts = settings.values_from_rollouts and self.critic
        # Off only in benchmarks/rollout_sampling.py, to measure what skipping the episodes'
        # last observations saves.
        self.live_rows_only = True
        # Optimizer steps applied so far (the learner counts them; workers receive it with the
        # weights). Equal versions mean equal weights, so a rollout value is the learner's.
        self.weights_version = 0

    def _forward(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        logits, hidden = self.policy.logits_and_hidden(batch[Columns.OBS])
        return {Columns.ACTION_DIST_INPUTS: logits, Columns.EMBEDDINGS: hidden}

    def _forward_inference(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        obs = batch[Columns.OBS]
        option_mask = obs["option_mask"]
        n = option_mask.shape[0]
        # Placeholder for rows that are not live: uniform over the menu (the action is ignored).
        logits = torch.zeros_like(option_mask).masked_fill(option_mask <= 0, MASKED_LOGIT)
        values = torch.zeros(n, device=option_mask.device)
        live = _live_rows(obs) if self.live_rows_only else torch.arange(n)
        if live.numel():
            # Sampling never needs gradients: without no_grad every rollout step builds a graph.
            with torch.no_grad():
                live_obs = {key: obs[key][live] for key in obs if key != "live"}
                logits[live], hidden = self.policy.logits_and_hidden(live_obs)
                values[live] = self.policy.value(hidden)
        out: dict[str, Any] = {Columns.ACTION_DIST_INPUTS: logits}
        if self.values_from_rollouts:
            out[Columns.VF_PREDS] = values
            out[WEIGHTS_VERSION] = torch.full((n,), self.weights_version, dtype=torch.long)
        return out

    _forward_exploration = _forward_inference

    def compute_values(self, batch: dict[str, Any], embeddings: Any | None = None) -> torch.Tensor:
        if embeddings is not None:  # the PPO loss: reuse the forward pass, with gradients
            return self.policy.value(embeddings)
        obs = batch[Columns.OBS]
        values, fresh = self._rollout_values(batch)
        stale = torch.nonzero(~fresh, as_tuple=False)[:, 0]
        if stale.numel():
            values[stale] = self.policy.values_in_micro_batches(
                obs["input_ids"][stale], obs["attention_mask"][stale], self.micro_batch_size
            )
        return values

    def _rollout_values(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """(values, fresh): rollout values and which rows may use them. A bootstrap row
        (LOSS_MASK false) carries a copy of the previous row's outputs, so it is never fresh."""
        mask = batch[Columns.OBS]["attention_mask"]
        n = mask.shape[0]
        if not self.values_from_rollouts or Columns.VF_PREDS not in batch:
            return torch.zeros(n, device=mask.device), torch.zeros(n, dtype=torch.bool)
        version = torch.as_tensor(batch[WEIGHTS_VERSION]).reshape(n)
        fresh = version == self.weights_version
        if Columns.LOSS_MASK in batch:
            fresh &= torch.as_tensor(batch[Columns.LOSS_MASK]).reshape(n).bool()
        values = torch.as_tensor(batch[Columns.VF_PREDS], dtype=torch.float32).reshape(n)
        return values.clone().to(mask.device), fresh.cpu()

    def get_state(
        self,
        components: Any = None,
        *,
        not_components: Any = None,
        inference_only: bool = False,
        **kwargs: Any,
    ) -> StateDict:
        # Workers get the value head too (a few KB): they compute the rollout values for GAE.
        state = {
            f"{POLICY_PREFIX}{k}": v.detach().cpu().numpy()
            for k, v in self.policy.trainable_state().items()
        }
        state[WEIGHTS_VERSION] = np.asarray(self.weights_version, dtype=np.int64)
        return state

    def set_state(self, state: StateDict) -> None:
        unexpected = [k for k in state if k != WEIGHTS_VERSION and not k.startswith(POLICY_PREFIX)]
        if unexpected:
            raise ValueError(f"unexpected module state keys: {unexpected[:3]}")
        self.policy.load_trainable_state(
            {k[len(POLICY_PREFIX) :]: v for k, v in state.items() if k != WEIGHTS_VERSION}
        )
        if WEIGHTS_VERSION in state:
            self.weights_version = int(state[WEIGHTS_VERSION])


def _live_rows(obs: dict[str, Any]) -> torch.Tensor:
    n = obs["option_mask"].shape[0]
    if "live" not in obs:
        return torch.arange(n)
    return torch.nonzero(obs["live"].reshape(n) > 0, as_tuple=False)[:, 0]


def state_nbytes(state: StateDict) -> int:
    """Bytes of a module state as RLlib ships it (numpy arrays)."""
    return int(sum(getattr(v, "nbytes", 0) for v in state.values()))
