"""What a held-out evaluation plays, light enough for the CLI to check before anything starts:
the eval config (held-out split, eval seed, stages), the starts of each stage, how many actors
play them, and where the evaluated weights come from. Playing them on Ray:
reflectrl/evaluation/runner.py."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from reflectrl.config import ReflectRLConfig
from reflectrl.envs.registry import env_splits, make_text_env
from reflectrl.errors import ConfigError
from reflectrl.run_dir import final_policy, rl_config

if TYPE_CHECKING:
    import torch


def eval_config(config: ReflectRLConfig) -> tuple[ReflectRLConfig, list[str]]:
    """(the config the eval envs run with: held-out split, eval seed; the stages to play)."""
    env = make_text_env(config.env.name, config.env.options)
    split = config.eval.split or env.held_out_split
    splits = env_splits(config.env.name)
    if split not in splits:
        raise ConfigError(
            f"eval split {split!r}: env {config.env.name} has splits {', '.join(splits)}"
        )
    stages = config.eval.stages or [s.name for s in config.curriculum.stages] or list(env.stages)
    unknown = [s for s in stages if s not in env.stages]
    if unknown:
        raise ConfigError(f"eval.stages: {unknown[0]!r} is not a stage of {config.env.name}")
    tree = config.model_dump(mode="json")
    tree["env"]["options"].update(env.held_out_options, split=split)
    tree["run"]["seed"] = config.run.seed if config.eval.seed is None else config.eval.seed
    return ReflectRLConfig.model_validate(tree), stages


def held_out_starts(config: ReflectRLConfig, stage: str) -> list[str] | None:
    """The starts of `stage` an eval config plays once each: all of its split's, or a seeded
    sample of `eval.episodes` when there are more; None where the env cannot list them."""
    env = make_text_env(config.env.name, config.env.options)
    starts = env.start_ids(stage)
    env.close()
    if starts is None or len(starts) <= config.eval.episodes:
        return starts
    rng = np.random.default_rng([config.run.seed, len(starts)])
    chosen = sorted(rng.choice(len(starts), config.eval.episodes, replace=False))
    return [starts[int(i)] for i in chosen]


def eval_actors_needed(config: ReflectRLConfig) -> int:
    """Actors that play a stage's episodes in one round of their envs: more would not finish
    sooner, and each loads its own copy of the policy LM."""
    return max(1, math.ceil(config.eval.episodes / config.env.envs_per_worker))


class PolicySource:
    """Where the evaluated weights come from: exactly one of the three."""

    def __init__(
        self,
        checkpoint_adapter: Path | None = None,
        sft_adapter: Path | None = None,
        state: dict[str, torch.Tensor] | None = None,
    ) -> None:
        self.checkpoint_adapter = checkpoint_adapter
        self.sft_adapter = sft_adapter
        self.state = state

    def load_into(self, policy: Any) -> None:
        if self.checkpoint_adapter is not None:
            policy.load_adapter(self.checkpoint_adapter)
        elif self.sft_adapter is not None:
            policy.load_sft_adapter(self.sft_adapter, key="--adapter")
        elif self.state is not None:
            policy.load_trainable_state(self.state)


def run_policy(run_dir: Path, config: ReflectRLConfig) -> tuple[ReflectRLConfig, PolicySource]:
    """(the config to evaluate with, the PolicySource) of a run's final policy."""
    final = final_policy(run_dir, config)
    derived = rl_config(config, run_dir)
    if final.kind == "checkpoint_adapter":
        return derived, PolicySource(checkpoint_adapter=final.path)
    if final.kind == "sft_adapter":
        return derived, PolicySource(sft_adapter=final.path)
    return derived, PolicySource()  # full SFT: the model directory is the policy
