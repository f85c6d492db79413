"""One iteration's figures as a typed row (one line of `metrics.jsonl`), built from what RLlib's
`Algorithm.train()` returns: the coordinator's report, the learner's losses, the timings."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, TypedDict

from ray.rllib.core import DEFAULT_MODULE_ID

from reflectrl.rl.advantage_connector import ANCHOR_STEPS, FALLBACK_EPISODES, RAW_MEAN, RAW_STD
from reflectrl.rl.coordinator import CoordinatorReport
from reflectrl.rl.learner import REPLAY_NLL


class HeldOutFigures(TypedDict, total=False):
    """Held-out success of the learner's weights (every `eval.every` iterations)."""

    eval_success_rate: float  # greedy
    eval_success_rate_sampled: float
    eval_return_mean: float
    eval_length_mean: float


class IterationRow(HeldOutFigures):
    iteration: int
    env_steps: int  # run total
    episodes: int
    earlier_stage_episodes: int
    success_rate: float  # over the curriculum's window
    episode_return_mean: float | None
    episode_len_mean: float | None
    failure_share: float | None  # episodes that ended in failure (Taxi: danger)
    step_limit_share: float | None
    stage: str  # the stage played
    next_stage: str
    reflection_calls: int  # run totals
    reflection_cache_hits: int
    env_steps_per_s: float
    iteration_s: float
    # What binds: sampling (rollout workers, reflections) vs the update (learners).
    sample_s: float
    update_s: float
    weight_sync_bytes: int
    adapter_version: int  # policy updates so far: what the workers sample with from now on
    updated: bool
    # Policy updates between the weights that sampled this batch and the learner's.
    staleness: int
    restarted_workers: int  # run total
    reflection_restarts: int
    # Worker-seconds of this iteration's sampling, by what they were spent on.
    env_worker_s: float
    reflection_worker_s: float
    policy_worker_s: float
    truncated_prompts: int  # run totals
    clipped_reflection_prompts: int
    policy_loss: float | None
    vf_loss: float | None  # None without a critic (rl.advantage other than gae)
    vf_explained_var: float | None
    entropy: float | None
    # The advantages of the loss rows before they are standardised (rl/advantage_connector.py).
    advantage_raw_mean: float | None
    advantage_raw_std: float | None
    # Episodes alone in their group, compared with the whole batch instead (rloo/grpo/gigpo).
    advantage_batch_baseline_episodes: int | None
    # gigpo: steps sharing their prompt with another step of the batch; state_table and
    # state_model: steps whose prompt the table had seen before.
    advantage_anchor_steps: int | None
    # rl.success_replay: episodes in the buffer, and the replayed steps' mean -log pi(a|s).
    success_replay_episodes: int
    success_replay_nll: float | None


@dataclass
class IterationTiming:
    seconds: float  # the whole of `Algorithm.train()`
    sampling_s: float  # from its start to the first minibatch (the progress board's)


@dataclass
class IterationRows:
    """Builds each iteration's row; keeps what runs across iterations (checkpointed)."""

    adapter_version: int = 0
    restarts_seen: int = 0

    def build(
        self,
        iteration: int,
        result: dict[str, Any],
        timing: IterationTiming,
        *,
        updated: bool,
        staleness: int,
        weight_sync_bytes: int,
        reflection_restarts: int,
        replay_episodes: int = 0,
    ) -> tuple[IterationRow, int]:
        """(the row, how many workers RLlib restarted since the last row)."""
        ours: CoordinatorReport = result["reflectrl"]
        counts, totals = ours["iteration_counts"], ours["totals"]
        # Without an update (every worker crashed) RLlib still reports the last update's stats.
        learner = result.get("learners", {}).get(DEFAULT_MODULE_ID, {}) if updated else {}
        self.adapter_version += int(updated)
        restarted = ours["restarted_workers"] - self.restarts_seen
        self.restarts_seen = ours["restarted_workers"]
        seconds = timing.seconds
        row = IterationRow(
            iteration=iteration,
            env_steps=totals["env_steps"],
            episodes=ours["episodes"],
            earlier_stage_episodes=ours["earlier_stage_episodes"],
            success_rate=ours["success_rate"],
            episode_return_mean=ours["episode_return_mean"],
            episode_len_mean=ours["episode_len_mean"],
            failure_share=ours["failure_share"],
            step_limit_share=ours["step_limit_share"],
            stage=ours["stage"],
            next_stage=ours["next_stage"],
            reflection_calls=totals["reflection_calls"],
            reflection_cache_hits=totals["reflection_cache_hits"],
            env_steps_per_s=counts["env_steps"] / seconds if seconds > 0 else 0.0,
            iteration_s=seconds,
            sample_s=timing.sampling_s,
            update_s=seconds - timing.sampling_s,
            weight_sync_bytes=weight_sync_bytes,
            adapter_version=self.adapter_version,
            updated=updated,
            staleness=staleness,
            restarted_workers=ours["restarted_workers"],
            reflection_restarts=reflection_restarts,
            env_worker_s=counts["env_ms"] / 1000,
            reflection_worker_s=counts["reflection_ms"] / 1000,
            policy_worker_s=counts["policy_ms"] / 1000,
            truncated_prompts=totals["truncated_prompts"],
            clipped_reflection_prompts=totals["clipped_reflection_prompts"],
            policy_loss=_scalar(learner.get("policy_loss")),
            vf_loss=_scalar(learner.get("vf_loss")),
            vf_explained_var=_scalar(learner.get("vf_explained_var")),
            entropy=_scalar(learner.get("entropy")),
            advantage_raw_mean=_scalar(learner.get(RAW_MEAN)),
            advantage_raw_std=_scalar(learner.get(RAW_STD)),
            advantage_batch_baseline_episodes=_count(learner.get(FALLBACK_EPISODES)),
            advantage_anchor_steps=_count(learner.get(ANCHOR_STEPS)),
            success_replay_episodes=replay_episodes,
            # RLlib reports NaN for a stat an update did not log (no replayed rows this time).
            success_replay_nll=_finite(learner.get(REPLAY_NLL)),
        )
        return row, restarted


def _scalar(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _count(value: Any) -> int | None:
    number = _scalar(value)
    return None if number is None else int(number)


def _finite(value: Any) -> float | None:
    number = _scalar(value)
    return number if number is not None and math.isfinite(number) else None
