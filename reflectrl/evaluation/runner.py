"""Held-out evaluation on Ray: actors (one per worker at most) play their share of each
(stage, decoding).

The actors build the same vector env as the rollout workers (prompts, reflections through the
same server) on the held-out split, and a policy loaded from a checkpoint adapter, an SFT
adapter, or the learner's live weights. They take no CPU from Ray's accounting: during RL
they run while the rollout workers wait.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch

from reflectrl.config import ReflectRLConfig
from reflectrl.console import say
from reflectrl.envs.registry import env_splits, make_text_env
from reflectrl.errors import ConfigError
from reflectrl.evaluation.episodes import deal, play, slot_quotas
from reflectrl.evaluation.report import EvalReport, GroupedReport, grouped
from reflectrl.reflection.endpoint import ReflectionEndpoint
from reflectrl.rollout.seams import EpisodeRecord
from reflectrl.run_dir import final_policy, rl_config

DECODINGS = ("greedy", "sampled")


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


class EvalWorker:
    def __init__(
        self, config: dict[str, Any], reflection: dict[str, Any] | None, index: int
    ) -> None:
        from reflectrl.data.scratch import resolve_or_build
        from reflectrl.models.policy import build_policy
        from reflectrl.rollout.env_creator import make_vector_env

        parsed = ReflectRLConfig.model_validate(config)
        ctx = {
            "reflectrl": config,
            "reflection": reflection,
            "num_envs": parsed.env.envs_per_worker,
        }
        self.env = make_vector_env(ctx)
        self.env.set_worker_index(index)
        self.env.record_observations = True  # for `unseen_states` in the report
        model_dir = resolve_or_build(parsed.policy.model)
        self.policy = build_policy(
            parsed.policy, model_dir, self.env.label_ids, parsed.run.seed, for_rollouts=True
        )
        self.seed = parsed.run.seed * 1000 + index

    def load(self, source: PolicySource) -> None:
        source.load_into(self.policy)

    def play(
        self, stage: str, episodes: int, greedy: bool, starts: list[str] | None = None
    ) -> list[EpisodeRecord]:
        self.env.set_stage(stage)
        self.seed += 1
        return play(self.policy, self.env, episodes, greedy, seed=self.seed, starts=starts)


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


class Evaluator:
    """Eval actors (`workers`, or fewer where fewer play every episode in one round of their
    envs), reused across evaluations (they hold a copy of the policy LM)."""

    def __init__(
        self,
        config: ReflectRLConfig,
        reflection: ReflectionEndpoint | None,
        workers: int,
        sft_seen: frozenset[str] | None = None,
    ) -> None:
        self.config, self.stages = eval_config(config)
        self.sft_seen = sft_seen  # `report.sft_observations` of the run, if it has SFT data
        remote = ray.remote(num_cpus=0)(EvalWorker)
        tree = self.config.model_dump(mode="json")
        where = None if reflection is None else reflection.to_dict()
        actors = min(workers, eval_actors_needed(self.config))
        self.actors = [remote.remote(tree, where, i + 1) for i in range(actors)]
        self.starts = {stage: held_out_starts(self.config, stage) for stage in self.stages}

    def run(self, source: PolicySource, progress: bool = False) -> EvalReport:
        ray.get([a.load.remote(source) for a in self.actors])
        episodes = self.config.eval.episodes
        by_decoding: dict[str, GroupedReport] = {}
        for decoding in DECODINGS:
            records: list[EpisodeRecord] = []
            for stage in self.stages:
                starts = self.starts[stage]
                jobs: list[tuple[int, list[str] | None]] = (
                    [(share, None) for share in slot_quotas(episodes, len(self.actors))]
                    if starts is None
                    else [(len(hand), hand) for hand in deal(starts, len(self.actors))]
                )
                calls = [
                    actor.play.remote(stage, n, decoding == "greedy", hand)
                    for actor, (n, hand) in zip(self.actors, jobs, strict=True)
                    if n
                ]
                records += [r for part in ray.get(calls) for r in part]
                if progress:
                    say(f"eval: {decoding} {stage}: {len(records)} episodes")
            by_decoding[decoding] = grouped(records, self.sft_seen)
        return EvalReport(
            split=self.config.env.options["split"],
            episodes_per_stage=episodes,
            seed=self.config.run.seed,
            greedy=by_decoding["greedy"],
            sampled=by_decoding["sampled"],
        )

    def close(self) -> None:
        for actor in self.actors:
            ray.kill(actor)
        self.actors = []


def run_policy(run_dir: Path, config: ReflectRLConfig) -> tuple[ReflectRLConfig, PolicySource]:
    """(the config to evaluate with, the PolicySource) of a run's final policy."""
    final = final_policy(run_dir, config)
    derived = rl_config(config, run_dir)
    if final.kind == "checkpoint_adapter":
        return derived, PolicySource(checkpoint_adapter=final.path)
    if final.kind == "sft_adapter":
        return derived, PolicySource(sft_adapter=final.path)
    return derived, PolicySource()  # full SFT: the model directory is the policy
