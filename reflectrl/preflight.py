"""Everything a run checks before Ray or vLLM start: bad input fails here in one line."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from reflectrl.config import ReflectRLConfig
from reflectrl.data.scratch import resolve_or_build
from reflectrl.envs.registry import env_splits, make_text_env
from reflectrl.errors import ConfigError
from reflectrl.models.adapters import (
    check_adapter_fits,
    check_lora_settings,
    check_lora_targets,
    read_adapter_config,
)
from reflectrl.models.loading import load_tokenizer
from reflectrl.text import prompts
from reflectrl.text.tokens import label_token_ids


@dataclass(frozen=True)
class PolicySpec:
    """What the learner and every worker agree on: the model and the label tokens."""

    model_dir: Path
    label_token_ids: list[int]


def preflight(config: ReflectRLConfig) -> PolicySpec:
    """Everything that can fail on bad input, checked before Ray or vLLM start."""
    model_dir = resolve_or_build(config.policy.model)
    tokenizer = load_tokenizer(model_dir)
    env = make_text_env(config.env.name, config.env.options)
    config.curriculum.stages_of(env.stages)  # unknown stage names fail here
    splits = env_splits(config.env.name)
    for split in config.eval.extra_splits:
        if split not in splits:
            raise ConfigError(
                f"eval.extra_splits: {split!r} is not a split of env {config.env.name} "
                f"({', '.join(splits)})"
            )
    max_actions = env.max_actions
    if max_actions > len(config.policy.labels):
        raise ConfigError(
            f"policy.labels has {len(config.policy.labels)} labels but env {config.env.name!r} "
            f"shows up to {max_actions} actions; add labels"
        )
    labels = config.policy.labels[:max_actions]
    label_ids = label_token_ids(tokenizer, labels, prompts.ACTION_MARKER)
    if config.policy.action_head == "text" and tokenizer.eos_token_id is None:
        raise ConfigError(
            f"policy.action_head=text ends every action with EOS, but {model_dir} has no EOS "
            "token; use policy.action_head=label or a tokenizer with one"
        )
    check_lora_targets(model_dir, config.policy.lora.target_modules, "policy.lora.target_modules")
    if config.policy.init_adapter:
        key, lora, adapter = "policy.init_adapter", config.policy.lora, config.policy.init_adapter
        found = read_adapter_config(adapter, key)
        check_lora_settings(found, lora.r, lora.alpha, lora.target_modules, key, adapter)
        check_adapter_fits(adapter, model_dir, key)
    r = config.reflection
    if r.enabled and r.server == "local":
        reflection_dir = resolve_or_build(r.model)
        if r.adapter:
            check_adapter_fits(r.adapter, reflection_dir, "reflection.adapter")
    return PolicySpec(model_dir=model_dir, label_token_ids=label_ids)


def check_run(config: ReflectRLConfig, workers: int) -> PolicySpec:
    """`preflight` plus what RL needs: a batch shape that works, a reflection URL that answers."""
    spec = preflight(config)
    batch = config.ppo.batch_size(workers, config.env.envs_per_worker)  # a bad shape fails here
    learners = config.run.num_learners
    if learners > 1 and batch % learners:
        raise ConfigError(
            f"run.num_learners={learners} cannot split an iteration of {batch} env steps evenly; "
            "choose a number of learners that divides it (or change --workers)"
        )
    per_learner = batch // max(1, learners)
    if config.ppo.minibatch_size > per_learner:
        raise ConfigError(
            f"ppo.minibatch_size={config.ppo.minibatch_size} is more than the {per_learner} env "
            f"steps each learner gets per iteration ({batch} over {max(1, learners)}); lower "
            "ppo.minibatch_size or raise ppo.train_batch_size"
        )
    r = config.reflection
    if r.enabled and r.server == "url":
        from reflectrl.reflection.endpoint import ReflectionEndpoint
        from reflectrl.rollout.env_creator import make_reflection_client

        if not make_reflection_client(config, ReflectionEndpoint.external(r)).health():
            raise ConfigError(
                f"reflection.url {r.url} does not answer; start the server there or set "
                "reflection.server=local"
            )
    return spec
