"""RLlib's PPO learner with gradient accumulation over length-sorted micro-batches.

RLlib runs one forward/backward per minibatch over every row, right-padded to
`env.max_prompt_tokens`, loss-masked bootstrap rows included. Here each minibatch's *loss rows*
go through the LM `policy.micro_batch_size` at a time, grouped by prompt length so each
micro-batch trims to nearly its own rows' width; bootstrap rows (LOSS_MASK false) never reach
the LM in the update (their values for GAE come from `compute_values`, once per iteration).

The loss is RLlib's own `compute_loss_for_module` on each micro-batch: a mean over the
micro-batch's rows, weighted by its share of the minibatch's loss rows, so the accumulated
gradient is the gradient of RLlib's whole-minibatch loss. Clipping and the optimizer step are
RLlib's too. After each step the module's `weights_version` goes up by one, which tells
`compute_values` which rollout values were computed with the current weights.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, TypedDict

import torch
from ray.rllib.algorithms.ppo.ppo import (
    LEARNER_RESULTS_KL_KEY,
    LEARNER_RESULTS_VF_EXPLAINED_VAR_KEY,
    LEARNER_RESULTS_VF_LOSS_UNCLIPPED_KEY,
)
from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner
from ray.rllib.core.columns import Columns
from ray.rllib.core.learner.learner import ENTROPY_KEY, POLICY_LOSS_KEY, VF_LOSS_KEY
from ray.rllib.evaluation.postprocessing import Postprocessing
from ray.rllib.utils.torch_utils import explained_variance

from reflectrl.config import TABLE_ESTIMATORS, RLStage
from reflectrl.models.policy import length_order
from reflectrl.rl.advantage_connector import AdvantageEstimation
from reflectrl.rl.advantages import AdvantageSettings
from reflectrl.rl.success_replay import REPLAY_COLUMN
from reflectrl.rollout.progress_board import board_reporter, take_learner_name

# Loss statistics RLlib logs per loss call; re-logged as means over the whole minibatch.
MEAN_STATS = (POLICY_LOSS_KEY, VF_LOSS_KEY, LEARNER_RESULTS_VF_LOSS_UNCLIPPED_KEY, ENTROPY_KEY)
CRITIC_STATS = (VF_LOSS_KEY, LEARNER_RESULTS_VF_LOSS_UNCLIPPED_KEY)
REPLAY_NLL = "success_replay_nll"  # mean -log pi(a|s) over the replayed rows
# The learner checkpoint state's key for the table of state_table and state_model
# (rl/advantage_connector.py).
STATE_TABLE = "advantage_state_table"


class AdvantageConfig(TypedDict):
    """`learner_config_dict["advantage"]`: the run's `rl` advantage settings (JSON-able)."""

    estimator: str
    step_advantage_weight: float
    scale_by_std: bool
    bootstrap_step_limit: bool
    normalise: bool


def advantage_config(rl: RLStage) -> AdvantageConfig:
    return AdvantageConfig(
        estimator=rl.advantage,
        step_advantage_weight=rl.step_advantage_weight,
        scale_by_std=rl.scale_by_std,
        bootstrap_step_limit=rl.bootstrap_step_limit,
        normalise=rl.normalise_advantages,
    )


class ReflectRLPPOLearner(PPOTorchLearner):
    _report: Callable[[str, int], None] | None = None
    _advantages: AdvantageEstimation | None = None  # set in build

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # As a Ray actor it is listed as `learner-0`, `learner-1`, ... (the dashboard's and
        # the state API's repr name; RLlib creates learner actors without names).
        self.name = take_learner_name((self.config.env_config or {}).get("progress_board"))

    def __repr__(self) -> str:
        return self.name

    def build(self) -> None:
        """RLlib's PPO learner, with rl/advantage_connector.py in place of RLlib's GAE step:
        the estimator of `rl.advantage`, standardised over the loss rows only."""
        super().build()
        if self._learner_connector is None:
            return
        settings: AdvantageConfig = self.config.learner_config_dict["advantage"]
        self._learner_connector.remove("GeneralAdvantageEstimation")
        self._advantages = AdvantageEstimation(
            settings=AdvantageSettings(
                estimator=settings["estimator"],
                gamma=self.config.gamma,
                lambda_=self.config.lambda_,
                step_advantage_weight=settings["step_advantage_weight"],
                scale_by_std=settings["scale_by_std"],
                bootstrap_step_limit=settings["bootstrap_step_limit"],
            ),
            normalise=settings["normalise"],
        )
        self._learner_connector.append(self._advantages)

    def get_state(
        self, components: Any = None, *, not_components: Any = None, **kwargs: Any
    ) -> dict[str, Any]:
        """RLlib's learner state, plus the table of state_table or state_model (a checkpoint
        pickles it with the optimizer state; a weight sync, asking for the module only, leaves
        it out)."""
        state = super().get_state(components, not_components=not_components, **kwargs)
        table = self._advantages is not None and self._advantages.settings.estimator
        if table in TABLE_ESTIMATORS and self._check_component(
            STATE_TABLE, components, not_components
        ):
            state[STATE_TABLE] = self._advantages.table.state()
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)
        if STATE_TABLE in state and self._advantages is not None:
            self._advantages.table.load(state[STATE_TABLE])

    def update(self, *args: Any, **kwargs: Any) -> Any:
        """RLlib's update, telling the run's heartbeat that learning started (and how many
        minibatches to expect: epochs x ceil(rows / minibatch), bootstrap rows aside)."""
        report = self._progress()
        if report is not None:
            rows = self.config.train_batch_size_per_learner
            size = kwargs.get("minibatch_size") or rows
            report("learning", int(kwargs.get("num_epochs", 1)) * -(-rows // size))
        return super().update(*args, **kwargs)

    def _uncompiled_update(self, batch: dict[str, Any], **kwargs: Any) -> tuple[Any, Any, Any]:
        self._compute_off_policyness(batch)
        loss_per_module = self.accumulate_gradients(batch)
        gradients = {pid: p.grad for pid, p in self._params.items()}
        self.apply_gradients(self.postprocess_gradients(gradients))
        for module_id in loss_per_module:
            self.module[module_id].unwrapped().weights_version += 1
        if (report := self._progress()) is not None:
            report("minibatch", 1)
        return {}, loss_per_module, {}

    def _progress(self) -> Callable[[str, int], None] | None:
        if self._report is None:
            name = (self.config.env_config or {}).get("progress_board")
            self._report = board_reporter(name)
        return self._report

    def accumulate_gradients(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        """Zero the gradients, then accumulate d(loss)/d(params) over micro-batches of the loss
        rows (and success replay's rows) of every module's minibatch; returns each module's
        (detached) total loss."""
        for optimizer in self._optimizer_parameters:
            optimizer.zero_grad(set_to_none=True)
        losses: dict[str, torch.Tensor] = {}
        for module_id, module_batch in batch.items():
            rows, replayed = loss_rows(module_batch), replay_rows(module_batch)
            if rows.numel() or replayed.numel():
                losses[module_id] = self._accumulate_module(module_id, module_batch, rows, replayed)
        return losses

    def _accumulate_module(
        self,
        module_id: str,
        module_batch: dict[str, Any],
        rows: torch.Tensor,
        replayed: torch.Tensor,
    ) -> torch.Tensor:
        module = self.module[module_id]
        width = module.unwrapped().micro_batch_size
        lengths = module_batch[Columns.OBS]["attention_mask"]
        # (rows, is replay): PPO's micro-batches, then success replay's.
        parts = [(chunk, False) for chunk in _micro_batches(rows, lengths, width)]
        parts += [(chunk, True) for chunk in _micro_batches(replayed, lengths, width)]
        total = torch.zeros(())
        stats = dict.fromkeys((*MEAN_STATS, LEARNER_RESULTS_KL_KEY), 0.0)
        values, targets = [], []
        replay_nll = 0.0
        for k, (chunk, is_replay) in enumerate(parts):
            part = take_rows(module_batch, chunk)
            # Under DDP, gradients are all-reduced once, after the last micro-batch.
            defer_sync = k < len(parts) - 1 and hasattr(module, "no_sync")
            with module.no_sync() if defer_sync else contextlib.nullcontext():
                fwd_out = module.forward_train(part)
                if is_replay:  # self-imitation: weight x mean -log pi(a|s) over replayed rows
                    dist = module.unwrapped().get_train_action_dist_cls()
                    logits = fwd_out[Columns.ACTION_DIST_INPUTS]
                    nll = -dist.from_logits(logits).logp(part[Columns.ACTIONS]).sum()
                    loss = self.replay_weight * nll / replayed.numel()
                    loss.backward()
                    total = total + loss.detach()
                    replay_nll += float(nll.detach()) / replayed.numel()
                    continue
                weight = chunk.numel() / rows.numel()
                loss = self.compute_losses(fwd_out={module_id: fwd_out}, batch={module_id: part})
                (loss[module_id] * weight).backward()
            total = total + loss[module_id].detach() * weight
            for key in stats:
                stats[key] += _number(self.metrics.peek((module_id, key))) * weight
            if self.config.use_critic:
                embeddings = fwd_out[Columns.EMBEDDINGS].detach()
                values.append(module.unwrapped().compute_values(part, embeddings=embeddings))
                targets.append(part[Postprocessing.VALUE_TARGETS])
        if replayed.numel():
            stats[REPLAY_NLL] = replay_nll
        if not self.config.use_critic or not values:  # no critic: no value figures
            for key in (*CRITIC_STATS, LEARNER_RESULTS_VF_EXPLAINED_VAR_KEY):
                stats.pop(key, None)
                self.metrics.delete(module_id, key, key_error=False)  # RLlib's loss logs zeros
        else:
            stats[LEARNER_RESULTS_VF_EXPLAINED_VAR_KEY] = _number(
                explained_variance(torch.cat(targets), torch.cat(values))
            )
        self.metrics.log_dict(stats, key=module_id, window=1)
        return total

    @property
    def replay_weight(self) -> float:
        return float(self.config.learner_config_dict.get("replay_weight", 0.0))


def _micro_batches(rows: torch.Tensor, lengths: torch.Tensor, width: int) -> list[torch.Tensor]:
    """`rows` sorted by prompt length, cut into near-equal micro-batches of <= width rows."""
    if not rows.numel():
        return []
    ordered = rows[length_order(lengths[rows])]
    return list(ordered.tensor_split(-(-ordered.numel() // width)))


def replay_rows(module_batch: dict[str, Any]) -> torch.Tensor:
    """Indices of success replay's rows (rl/success_replay.py); none without replay."""
    mask = module_batch.get(REPLAY_COLUMN)
    if mask is None:
        return torch.zeros(0, dtype=torch.long)
    return torch.nonzero(torch.as_tensor(mask), as_tuple=False)[:, 0]


def _number(value: Any) -> float:
    return float(value.detach()) if isinstance(value, torch.Tensor) else float(value)


def loss_rows(module_batch: dict[str, Any]) -> torch.Tensor:
    """Indices of the rows that carry loss (all rows when there is no LOSS_MASK)."""
    mask = module_batch.get(Columns.LOSS_MASK)
    if mask is None:
        n = module_batch[Columns.OBS]["attention_mask"].shape[0]
        return torch.arange(n)
    return torch.nonzero(torch.as_tensor(mask), as_tuple=False)[:, 0]


def take_rows(tree: Any, rows: torch.Tensor) -> Any:
    """The same nested dict of tensors, with only `rows` (of the leading axis)."""
    if isinstance(tree, dict):
        return {key: take_rows(value, rows) for key, value in tree.items()}
    if isinstance(tree, torch.Tensor):
        return tree[rows.to(tree.device)]
    return tree
