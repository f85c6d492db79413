"""The learner connector that puts advantages and value targets in the train batch, in place
of RLlib's `GeneralAdvantageEstimation` (the math is rl/advantages.py's).

The train batch holds, per episode chunk, its T steps and one bootstrap row
(`AddOneTsToEpisodesAndTruncate`, LOSS_MASK false). RLlib's GAE standardises the advantages over
every row, bootstrap rows included, so the rows that carry loss were not centred (their mean
sat at -0.10 to -0.15 std on Taxi). Here the advantages are standardised over the loss rows only
and a bootstrap row's advantage is 0.

Success replay's episodes (rl/success_replay.py) take no part in the advantages: their rows
leave LOSS_MASK and are marked in the `success_replay` column for the learner's
self-imitation term.

What it logs per module (into the learner's results, then `metrics.jsonl`): the raw advantages'
mean and std before standardising, the episodes compared with the whole batch for want of a
group, and the steps gigpo anchored (or whose prompt the table of state_table or state_model
had seen before).

The table of `state_table` and `state_model` lives here, across iterations; the learner puts it
in its checkpoint state (rl/learner.py).
"""

from __future__ import annotations

import hashlib
import itertools
from typing import Any

import numpy as np
import torch
from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.core.columns import Columns
from ray.rllib.evaluation.postprocessing import Postprocessing

from reflectrl.config import CRITIC_FREE, DIGEST_ESTIMATORS
from reflectrl.rl.advantages import AdvantageSettings, Episode, StateTable, estimate, standardise
from reflectrl.rl.success_replay import REPLAY_COLUMN, is_replay

RAW_MEAN = "advantage_raw_mean"
RAW_STD = "advantage_raw_std"
FALLBACK_EPISODES = "advantage_batch_baseline_episodes"
ANCHOR_STEPS = "advantage_anchor_steps"


class AdvantageEstimation(ConnectorV2):
    def __init__(
        self,
        input_observation_space: Any = None,
        input_action_space: Any = None,
        *,
        settings: AdvantageSettings,
        normalise: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(input_observation_space, input_action_space, **kwargs)
        self.settings = settings
        self.normalise = normalise
        self.table = StateTable()  # the table critics' memory; empty and unused otherwise

    def __call__(
        self,
        *,
        rl_module: Any,
        episodes: list[Any],
        batch: dict[str, Any],
        metrics: Any = None,
        **kwargs: Any,
    ) -> Any:
        chunks = list(self.single_agent_episode_iterator(episodes, agents_that_stepped_only=False))
        for module_id, module_batch in batch.items():
            module = rl_module[module_id].unwrapped()  # DDP wraps it on learner actors
            mine = [e for e in chunks if e.module_id in (None, module_id)]
            lengths = [len(e) for e in mine]  # steps + the bootstrap row
            replayed = np.repeat([is_replay(e) for e in mine], lengths)
            device = module_batch[Columns.REWARDS].device
            if replayed.any():  # success replay's rows: the self-imitation term, not PPO's
                loss = _numpy(module_batch[Columns.LOSS_MASK]).astype(bool)
                module_batch[REPLAY_COLUMN] = torch.as_tensor(loss & replayed, device=device)
                module_batch[Columns.LOSS_MASK] = torch.as_tensor(loss & ~replayed, device=device)
            advantages, targets, stats = self.compute(module, module_batch, mine, lengths)
            module_batch[Postprocessing.ADVANTAGES] = torch.as_tensor(advantages, device=device)
            module_batch[Postprocessing.VALUE_TARGETS] = torch.as_tensor(targets, device=device)
            if metrics is not None:
                metrics.log_dict(stats, key=module_id, window=1)
        return batch

    def compute(
        self, module: Any, module_batch: dict[str, Any], chunks: list[Any], lengths: list[int]
    ) -> tuple[np.ndarray, np.ndarray, dict[str, float]]:
        """(advantages, value targets, stats) for every row of one module's batch."""
        rows = int(sum(lengths))
        rewards = _numpy(module_batch[Columns.REWARDS])
        terminateds = _numpy(module_batch[Columns.TERMINATEDS]).astype(bool)
        loss = _numpy(module_batch[Columns.LOSS_MASK]).astype(bool)
        if rewards.shape[0] != rows:
            raise ValueError(f"train batch has {rewards.shape[0]} rows, its episodes {rows}")
        critic = self.settings.estimator not in CRITIC_FREE
        values = _numpy(module.compute_values(module_batch)) if critic else None
        digests = _digests(module_batch) if self.settings.estimator in DIGEST_ESTIMATORS else None
        starts = np.cumsum([0, *lengths])
        pairs = zip(itertools.pairwise(starts), chunks, strict=True)
        learned = [(span, chunk) for span, chunk in pairs if not is_replay(chunk)]
        spans = [span for span, _ in learned]
        found = []
        for (start, end), chunk in learned:
            last = end - 2  # the chunk's last real step; `end - 1` is its bootstrap row
            found.append(
                Episode(
                    rewards=rewards[start : end - 1],
                    terminated=bool(terminateds[last]),
                    group=_group(chunk),
                    values=None if values is None else values[start:end],
                    digests=None if digests is None else digests[start : end - 1],
                    # the bootstrap row holds the observation after the last step
                    bootstrap_digest=None if digests is None else digests[end - 1],
                )
            )
        result = estimate(found, self.settings, self.table)
        advantages = np.zeros(rows, dtype=np.float32)
        targets = np.zeros(rows, dtype=np.float32) if values is None else values.copy()
        for k, (start, end) in enumerate(spans):
            advantages[start : end - 1] = result.advantages[k]
            if result.value_targets is not None:
                targets[start : end - 1] = result.value_targets[k]
        raw = advantages[loss]
        stats = {
            RAW_MEAN: float(raw.mean()) if raw.size else 0.0,
            RAW_STD: float(raw.std()) if raw.size else 0.0,
            FALLBACK_EPISODES: float(result.fallback_episodes),
            ANCHOR_STEPS: float(result.anchor_steps),
        }
        if self.normalise:
            advantages[loss] = standardise(raw)
        advantages[~loss] = 0.0
        return advantages, targets, stats


def _numpy(value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    return np.asarray(value)


def _digests(module_batch: dict[str, Any]) -> list[str]:
    """A digest of each row's policy prompt (its real tokens): GiGPO's anchor-state key. Same
    prompt, same digest; the prompt holds the observation, its reflection and the stage's
    instruction."""
    obs = module_batch[Columns.OBS]
    ids = _numpy(obs["input_ids"]).astype(np.int64)
    lengths = _numpy(obs["attention_mask"]).sum(axis=1).astype(int)
    return [
        hashlib.blake2b(row[:n].tobytes(), digest_size=16).hexdigest()
        for row, n in zip(ids, lengths, strict=True)
    ]


def _group(episode: Any) -> tuple[str, str] | None:
    """The episode's group (rl.group_size): its start draw and its stage; None without one."""
    info = episode.get_infos(-1)
    group = str(info.get("group", ""))
    return (group, str(info.get("stage", ""))) if group else None
