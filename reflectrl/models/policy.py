"""The policy: a causal LM + LoRA that scores the menu, plus a value head (no Ray).

With the label head (policy.action_head=label, the paper's), one forward pass reads the whole
right-padded prompt; at the last real token it takes
  - the next-token logits restricted to the label tokens, masked to the labels valid now
    (the published code did not mask), and
  - the final hidden state, which a linear value head maps to V(s) (the published critic
    saw only the last ~20 prompt tokens).
Only the label rows of the LM head are multiplied, so no [batch, length, vocab] tensor is
ever built. Dropout is 0 everywhere so rollout (eval) and update (train) probabilities agree.
With `trim_padding` each forward runs only up to the batch's longest real row: exact, since
rows are right-padded and attention is causal (nothing real attends to the padding after it).
With `share_prefix` the tokens every row of a batch starts with (the task header) go through the
LM once, and every row attends to that one copy of their keys and values: the same attention,
computed once (gradients flow back through the shared copy).
With the text head (policy.action_head=text), each valid action is scored by its own tokens
after the prompt (models/action_text.py); the value head reads the same last prompt token.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, get_peft_model, set_peft_model_state_dict
from torch import nn
from transformers.pytorch_utils import Conv1D

from reflectrl.config import PolicyConfig
from reflectrl.models.action_text import action_log_probs, action_scores
from reflectrl.models.loading import load_causal_lm

# Logit of a label that is not on the menu now: exp() of it underflows to exactly 0, and
# unlike -inf it keeps the entropy finite (0 * log 0 terms stay 0).
MASKED_LOGIT = -1e9
# A shared prefix shorter than this is run with the rest (a second LM call costs more).
MIN_SHARED_PREFIX = 8
# Beside a checkpoint's adapter, with policy.rl_trainable=full: the LM's weights as RL left them.
BASE_WEIGHTS = "base_weights.safetensors"


class OptionPolicy(nn.Module):
    def __init__(
        self,
        model_dir: Path,
        label_token_ids: Sequence[int],
        lora_r: int = 8,
        lora_alpha: int = 16,
        lora_target_modules: Sequence[str] = ("q_proj", "v_proj"),
        seed: int = 0,
        gradient_checkpointing: bool = False,
        trim_padding: bool = True,
        dtype: torch.dtype = torch.float32,
        share_prefix: bool = True,
        value_head: bool = True,
        train_base: bool = False,
        action_head: str = "label",
        text_normalisation: str = "token",
    ) -> None:
        super().__init__()
        self.action_head = action_head
        self.text_normalisation = text_normalisation
        self.train_base = train_base
        self.trim_padding = trim_padding
        self.share_prefix = share_prefix
        self.checkpointing = gradient_checkpointing
        # LoRA init is seeded from the config, but on a forked stream: RLlib seeds each rollout
        # worker's global torch stream differently *before* building this module, and actions
        # are sampled from that stream (a global manual_seed here made every worker sample the
        # same actions).
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self._build(model_dir, lora_r, lora_alpha, lora_target_modules, gradient_checkpointing)
        if not value_head:  # a critic-free estimator (rl.advantage): nothing to train or sync
            self.value_head = None
        if train_base:  # policy.rl_trainable=full: every LM weight learns, beside the LoRA
            for param in self.lm.parameters():
                param.requires_grad_(True)
        # Rollout copies may run in half precision; LoRA and value head follow the LM.
        self.to(dtype)
        self.register_buffer(
            "label_ids", torch.tensor(list(label_token_ids), dtype=torch.long), persistent=False
        )

    def _build(
        self,
        model_dir: Path,
        lora_r: int,
        lora_alpha: int,
        lora_target_modules: Sequence[str],
        gradient_checkpointing: bool,
    ) -> None:
        base = load_causal_lm(model_dir)
        for param in base.parameters():
            param.requires_grad_(False)
        lora = lora_config(lora_r, lora_alpha, lora_target_modules)
        # GPT-2 keeps its weights transposed (Conv1D); peft would fix the flag with a warning.
        lora.fan_in_fan_out = any(isinstance(m, Conv1D) for m in base.modules())
        if gradient_checkpointing:
            # Only in train mode (the PPO update): keeps one layer's activations instead of all
            # of them; with dropout 0 the recomputation is exact. Rollouts (eval) are unaffected.
            base.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        self.lm = get_peft_model(base, lora)
        # Zero init: V = 0 everywhere at first. A random init gave values near +-2 on some
        # prompts, larger than most returns here, and the first updates chased that noise.
        self.value_head: nn.Linear | None = nn.Linear(base.config.hidden_size, 1)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    @property
    def num_labels(self) -> int:
        return int(self.label_ids.numel())

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Final hidden state at the last real token of each right-padded row: [B, H]."""
        lengths = attention_mask.long().sum(dim=1)
        if bool((lengths < 1).any()):
            raise ValueError("an observation has an empty attention mask")
        if self.trim_padding:
            width = int(lengths.max())
            input_ids, attention_mask = input_ids[:, :width], attention_mask[:, :width]
        causal_lm = self.lm.get_base_model()
        trunk = causal_lm.base_model  # the decoder stack, without the LM head
        rows = torch.arange(input_ids.shape[0], device=input_ids.device)
        # Checkpointed layers would recompute (and append to) the prefix's cache in backward.
        share = self.share_prefix and not (self.training and self.checkpointing)
        shared = shared_prefix_length(input_ids, lengths) if share else 0
        if shared < MIN_SHARED_PREFIX:
            out = trunk(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
            return out.last_hidden_state[rows, lengths - 1]
        # The prefix once (one row), its keys and values repeated for every row; then each
        # row's own tokens, at positions shared.., attending to the prefix and to themselves.
        cache = trunk(input_ids=input_ids[:1, :shared], use_cache=True).past_key_values
        cache.batch_repeat_interleave(input_ids.shape[0])
        out = trunk(
            input_ids=input_ids[:, shared:],
            attention_mask=attention_mask,
            past_key_values=cache,
            use_cache=True,
        )
        return out.last_hidden_state[rows, lengths - 1 - shared]

    def label_logits(self, hidden: torch.Tensor, option_mask: torch.Tensor) -> torch.Tensor:
        """Masked logits over the K labels: [B, K]."""
        head = self.lm.get_base_model().get_output_embeddings()
        logits = hidden @ head.weight[self.label_ids].T
        if getattr(head, "bias", None) is not None:
            logits = logits + head.bias[self.label_ids]
        # float32 whatever the LM's dtype: MASKED_LOGIT overflows float16 to -inf.
        return logits.float().masked_fill(option_mask <= 0, MASKED_LOGIT)

    def text_logits(self, obs: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """The text head: masked logits over the K actions [B, K] (each action's log-probability
        of its own tokens, normalised), and the prompt's last hidden state [B, H]."""
        causal_lm = self.lm.get_base_model()
        log_probs, hidden = action_log_probs(
            causal_lm.base_model,
            causal_lm.get_output_embeddings(),
            obs["input_ids"],
            obs["attention_mask"],
            obs["action_ids"],
            obs["action_mask"],
        )
        logits = action_scores(
            log_probs,
            obs["action_mask"],
            obs["action_words"],
            obs["option_mask"],
            self.text_normalisation,  # type: ignore[arg-type]
        )
        return logits, hidden

    def logits_and_hidden(
        self, obs: Mapping[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Masked logits over the menu [B, K] by this policy's action head, and the hidden
        state the value head reads [B, H], from an observation batch of the vector env."""
        if self.action_head == "text":
            return self.text_logits(obs)
        hidden = self.encode(obs["input_ids"], obs["attention_mask"])
        return self.label_logits(hidden, obs["option_mask"]), hidden

    def value(self, hidden: torch.Tensor) -> torch.Tensor:
        """V(s); 0 everywhere without a value head (critic-free estimators)."""
        if self.value_head is None:
            return torch.zeros(hidden.shape[0], device=hidden.device)
        return self.value_head(hidden).squeeze(-1).float()

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, option_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(label logits, V(s)): the label head only; `logits_and_hidden` serves both heads."""
        hidden = self.encode(input_ids, attention_mask)
        return self.label_logits(hidden, option_mask), self.value(hidden)

    @torch.no_grad()
    def values_in_micro_batches(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, micro_batch: int
    ) -> torch.Tensor:
        """V(s) of every row, without gradients, `micro_batch` rows of similar length at a
        time (memory stays bounded; trimming cuts more when lengths are alike)."""
        values = torch.zeros(input_ids.shape[0], device=input_ids.device)
        for rows in length_order(attention_mask).split(micro_batch):
            values[rows] = self.value(self.encode(input_ids[rows], attention_mask[rows]))
        return values

    # --- the trainable state: what is synced to rollout workers and checkpointed -------------

    def lora_state(self) -> dict[str, torch.Tensor]:
        """The LoRA tensors only, keyed as in `state_dict()` (what rollout workers need)."""
        return {k: v for k, v in self.state_dict().items() if "lora_" in k}

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """Everything that changes in training: LoRA + value head, and with `train_base` every
        LM weight (otherwise the base LM is frozen and reloaded from its directory)."""
        if self.train_base:
            state = {k: v for k, v in self.state_dict().items() if k.startswith("lm.")}
        else:
            state = self.lora_state()
        if self.value_head is not None:
            state.update({f"value_head.{k}": v for k, v in self.value_head.state_dict().items()})
        return state

    def load_trainable_state(self, state: dict[str, Any]) -> None:
        own = self.state_dict()
        unknown = [k for k in state if k not in own]
        if unknown:
            raise ValueError(f"state has keys this policy does not have: {unknown[:3]}")
        self.load_state_dict({k: torch.tensor(v) for k, v in state.items()}, strict=False)

    def save_adapter(self, directory: Path) -> None:
        """The LoRA adapter in peft format (loadable with PeftModel.from_pretrained / vLLM)."""
        save_adapter_state(self.trainable_state(), self.lm.peft_config["default"], directory)

    def load_sft_adapter(self, directory: str | Path, key: str = "policy.init_adapter") -> None:
        """Start from a LoRA adapter of `reflectrl sft` (the value head stays at zero).

        It must be the LoRA this policy has (rank, alpha, modules, shapes): PPO goes on
        training it, and an alpha that differs would silently rescale what SFT learned."""
        from peft import get_peft_model_state_dict

        from reflectrl.models.adapters import (
            adapter_weights,
            check_lora_settings,
            check_lora_shapes,
            read_adapter_config,
        )

        found = read_adapter_config(directory, key)
        own = self.lm.peft_config["default"]
        hint = check_lora_settings(found, own.r, own.lora_alpha, own.target_modules, key, directory)
        weights = adapter_weights(directory, key)
        check_lora_shapes(weights, get_peft_model_state_dict(self.lm), key, hint)
        set_peft_model_state_dict(self.lm, weights)

    def load_adapter(self, directory: Path) -> None:
        from peft.utils import load_peft_weights

        set_peft_model_state_dict(self.lm, load_peft_weights(str(directory)))
        base = Path(directory) / BASE_WEIGHTS
        if base.is_file():  # policy.rl_trainable=full: the LM's own weights changed too
            from safetensors.torch import load_file

            self.load_state_dict(load_file(str(base)), strict=False)
        head = torch.load(Path(directory) / "value_head.pt")
        if self.value_head is not None and head:  # a critic-free run saved no head
            self.value_head.load_state_dict(head)


def build_policy(
    settings: PolicyConfig,
    model_dir: Path,
    label_token_ids: Sequence[int],
    seed: int,
    *,
    for_rollouts: bool,
    critic: bool = True,
) -> OptionPolicy:
    """The policy `settings` describe (the one place it is built from the config): the
    learner's copy trains in float32; a rollout copy (sampling, evaluation) runs in
    `settings.dtype`. Both start from the same seeded LoRA init. `critic`: build a value
    head (false for the critic-free advantage estimators)."""
    return OptionPolicy(
        model_dir,
        label_token_ids,
        lora_r=settings.lora.r,
        lora_alpha=settings.lora.alpha,
        lora_target_modules=settings.lora.target_modules,
        seed=seed,
        gradient_checkpointing=settings.gradient_checkpointing,
        trim_padding=settings.trim_padding,
        share_prefix=settings.share_prefix,
        dtype=getattr(torch, settings.dtype) if for_rollouts else torch.float32,
        value_head=critic,
        train_base=settings.rl_trainable == "full",
        action_head=settings.action_head,
        text_normalisation=settings.text_normalisation,
    )


def lora_config(
    r: int, alpha: int, target_modules: Sequence[str], base_model_dir: Path | None = None
) -> LoraConfig:
    """The policy's LoRA (dropout 0: rollout and update probabilities agree)."""
    return LoraConfig(
        r=r,
        lora_alpha=alpha,
        target_modules=list(target_modules),
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
        base_model_name_or_path=None if base_model_dir is None else str(base_model_dir),
    )


def save_adapter_state(state: dict[str, Any], lora: LoraConfig, directory: Path) -> None:
    """Write a `trainable_state()` as a peft adapter folder + `value_head.pt`, the files
    `PeftModel.from_pretrained`, vLLM and `load_adapter` read. Needs no model: the driver
    writes checkpoints from the state it reads off learner actors on other nodes."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    saved = copy.copy(lora)
    saved.inference_mode = True  # as peft's own save_pretrained writes it
    saved.save_pretrained(str(directory))
    # OptionPolicy's names `lm.<peft name with the adapter name>.weight`; peft saves them
    # without `lm.` and without the adapter name (`.default`).
    weights = {
        k.removeprefix("lm.").replace(".default.", "."): torch.as_tensor(v).contiguous()
        for k, v in state.items()
        if "lora_" in k
    }
    save_file(weights, str(directory / "adapter_model.safetensors"), metadata={"format": "pt"})
    base = {
        k: torch.as_tensor(v).clone()  # tied weights share storage; safetensors refuses that
        for k, v in state.items()
        if k.startswith("lm.") and "lora_" not in k
    }
    if base:
        save_file(base, str(directory / BASE_WEIGHTS), metadata={"format": "pt"})
    head = {
        k.removeprefix("value_head."): torch.as_tensor(v)
        for k, v in state.items()
        if k.startswith("value_head.")
    }
    torch.save(head, directory / "value_head.pt")


def shared_prefix_length(input_ids: torch.Tensor, lengths: torch.Tensor) -> int:
    """How many leading tokens every row has in common, short of each row's last real token
    (the rows' own hidden states must come from the second pass)."""
    if input_ids.shape[0] < 2:
        return 0
    same = (input_ids == input_ids[:1]).all(dim=0)
    common = int(same.int().cumprod(dim=0).sum())
    return min(common, int(lengths.min()) - 1)


def length_order(attention_mask: torch.Tensor) -> torch.Tensor:
    """Row indices sorted by real length (stable): neighbours trim to nearly the same width."""
    return torch.argsort(attention_mask.long().sum(dim=1), stable=True)
