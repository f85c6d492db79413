"""Held-out evaluation on Ray: actors (one per worker at most) play their share of each
(stage, decoding).

The actors build the same vector env as the rollout workers (prompts, reflections through the
same server) on the held-out split, and a policy loaded from a checkpoint adapter, an SFT
adapter, or the learner's live weights. They take no CPU from Ray's accounting: during RL
they run while the rollout workers wait.
"""

from __future__ import annotations

from typing import Any

import ray

from reflectrl.config import ReflectRLConfig
from reflectrl.console import say
from reflectrl.evaluation.episodes import deal, play, slot_quotas
from reflectrl.evaluation.held_out import (
    PolicySource,
    eval_actors_needed,
    eval_config,
    held_out_starts,
)
from reflectrl.evaluation.report import EvalReport, GroupedReport, grouped
from reflectrl.reflection.endpoint import ReflectionEndpoint
from reflectrl.rollout.seams import EpisodeRecord

DECODINGS = ("greedy", "sampled")


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
