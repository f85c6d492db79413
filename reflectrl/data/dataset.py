"""The SFT data set: expert episodes, some steps perturbed, rendered with RL's own prompts.

Per step of an expert episode, three rows (TRL's prompt/completion form; METHOD.md):
    sft             observation + menu               -> the expert's label
    sft_reflection  reflection prompt (no menu)      -> the reflection
    sft_policy      observation + reflection + menu  -> the expert's label
At a perturbed step (`data.negative_rate`) the episode takes a wrong but valid action instead
of the expert's; the rows of that state still teach the expert's label, and the next state's
reflection names the mistake and the recovery (those rows are `negative`). At
`data.wrong_hint_rate` of the steps the `sft_policy` row's reflection names a wrong next action
(`wrong_hint`; the label stays the expert's). Episodes come from the env's training split only,
spread over the curriculum stages; `data.eval_fraction` of them (whole episodes) are marked
`split: eval` for SFT's eval loss.

Output: `data.jsonl` (rows), `stats.json` (counts and token lengths).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from reflectrl.config import ReflectRLConfig
from reflectrl.data.demos import Demonstrator, demonstrator_for
from reflectrl.data.writers import ApiWriter, Facts, TemplateWriter
from reflectrl.envs.base import TextObservation
from reflectrl.envs.registry import make_text_env
from reflectrl.errors import ConfigError, ReflectRLError
from reflectrl.models.loading import load_tokenizer, resolve_model
from reflectrl.models.tokens import count_tokens
from reflectrl.rendering import PromptRenderer
from reflectrl.seeding import hash_seed

DATA_FILE = "data.jsonl"
STATS_FILE = "stats.json"
TARGETS = ("sft", "sft_reflection", "sft_policy")


@dataclass
class Step:
    """One state of an episode, as the rows need it."""

    reflection_prompt: str
    reflection: str
    plain_prompt: str
    policy_prompt: str
    label: str
    expert_action: str  # the label's action: what the expert does in this state
    taken_action: str  # what the episode did (a wrong action at a perturbed step)
    negative: bool
    perturbed: bool = False
    wrong_hint: bool = False  # the policy row's reflection names a wrong next action
    observation: str = ""  # `TextObservation.digest()` of the state the step was taken in


def make_writer(config: ReflectRLConfig) -> TemplateWriter | ApiWriter:
    w = config.data.writer
    if w.url is None:
        return TemplateWriter()
    writer = ApiWriter(
        w.url,
        w.model,
        config.reflection.max_tokens,
        api_key=os.environ.get(w.api_key_env, ""),
        timeout_s=w.timeout_s,
    )
    writer.check()
    return writer


def write_dataset(
    config: ReflectRLConfig,
    out: Path,
    *,
    episodes: int | None = None,
    seed: int | None = None,
    writer: TemplateWriter | ApiWriter | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Write `out/data.jsonl` and `out/stats.json`; returns the stats. Refuses a folder that
    already holds a data set (nothing written is ever overwritten)."""
    if (out / DATA_FILE).exists():
        raise ConfigError(f"--out {out} already holds {DATA_FILE}; choose another folder")
    episodes = episodes or config.data.episodes
    if seed is None:
        seed = config.run.seed if config.data.seed is None else config.data.seed
    demo = demonstrator_for(config.env.name, config.data.expert)
    writer = writer or make_writer(config)
    env = make_text_env(config.env.name, {**config.env.options, "split": demo.train_split})
    policy_dir = resolve_model(config.policy.model)
    reflection_dir = resolve_model(config.reflection.model)
    tokenizer = load_tokenizer(policy_dir)
    reflection_tokenizer = (
        tokenizer if reflection_dir == policy_dir else load_tokenizer(reflection_dir)
    )
    renderer = PromptRenderer(config, tokenizer, env.max_actions, reflection_tokenizer)
    stages = [s.name for s in config.curriculum.stages] or list(env.stages)
    rng = np.random.default_rng(seed)
    n_eval = round(episodes * config.data.eval_fraction)
    eval_episodes = set(rng.choice(episodes, size=n_eval, replace=False).tolist())
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{DATA_FILE}.tmp"
    counts: Counter[str] = Counter()
    lengths: dict[str, list[int]] = defaultdict(list)
    with tmp.open("w") as f:
        for e in range(episodes):
            stage = stages[e % len(stages)]
            env.set_stage(stage)
            obs, _ = env.reset(seed=hash_seed(seed, e))
            meta = {
                "env": config.env.name,
                "split": "eval" if e in eval_episodes else "train",
                "episode": e,
                "stage": stage,
                "task": demo.task_id(env),
            }
            steps = episode_steps(config, env, obs, demo, renderer, writer, rng)
            for t, step in enumerate(steps):
                rows = {
                    "sft": (step.plain_prompt, step.label),
                    "sft_reflection": (step.reflection_prompt, step.reflection),
                    "sft_policy": (step.policy_prompt, step.label),
                }
                for target, (prompt, completion) in rows.items():
                    row = {
                        "target": target,
                        "prompt": prompt,
                        "completion": completion,
                        **meta,
                        "step": t,
                        "negative": step.negative,
                        "perturbed": step.perturbed,
                        "wrong_hint": step.wrong_hint,
                        "expert_action": step.expert_action,
                        "taken_action": step.taken_action,
                        "observation": step.observation,
                    }
                    f.write(json.dumps(row) + "\n")
                    counts[f"rows_{target}"] += 1
                    lengths[f"{target}_prompt_tokens"].append(count_tokens(tokenizer, prompt))
                counts["steps"] += 1
                counts["negative_steps"] += int(step.negative)
                counts["perturbed_steps"] += int(step.perturbed)
                counts["wrong_hint_steps"] += int(step.wrong_hint)
                lengths["reflection_tokens"].append(
                    count_tokens(reflection_tokenizer, step.reflection)
                )
            counts["episodes"] += 1
            if progress and (e + 1) % max(1, episodes // 10) == 0:
                print(
                    f"data: {e + 1}/{episodes} episodes, {counts['steps']} steps", file=sys.stderr
                )
    tmp.replace(out / DATA_FILE)
    stats = {
        **dict(counts),
        "eval_episodes": n_eval,
        "expert": config.data.expert,
        "negative_rate": config.data.negative_rate,
        "wrong_hint_rate": config.data.wrong_hint_rate,
        "seed": seed,
        "stages": stages,
        "lengths": {
            k: {"mean": float(np.mean(v)), "max": int(max(v))} for k, v in lengths.items() if v
        },
    }
    (out / STATS_FILE).write_text(json.dumps(stats, indent=2) + "\n")
    return stats


def clip_tokens(tokenizer: Any, text: str, max_tokens: int) -> str:
    """`text` cut to `max_tokens` tokens: no longer than the served model may write it."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    return text if len(ids) <= max_tokens else str(tokenizer.decode(ids[:max_tokens])).strip()


def episode_steps(
    config: ReflectRLConfig,
    env: Any,
    obs: TextObservation,
    demo: Demonstrator,
    renderer: PromptRenderer,
    writer: TemplateWriter | ApiWriter,
    rng: np.random.Generator,
) -> Iterator[Step]:
    """Play one expert episode from `obs` (just reset) and yield each state's rows."""
    last: tuple[str, str, bool] | None = None  # (action, effect, helped)
    for _ in range(10_000):
        try:
            expert = demo.expert(env)
        except ReflectRLError:  # e.g. ALFWorld: the episode left the walkthrough for good
            return
        facts = Facts(
            observation=obs.observation,
            situation=demo.situation(env),
            last_action=None if last is None else last[0],
            effect="" if last is None else last[1],
            helped=True if last is None else last[2],
            next_action=obs.actions[expert],
        )
        reflection = clip_tokens(
            renderer.reflection_tokenizer, writer.write(facts, rng), config.reflection.max_tokens
        )
        order = list(range(len(obs.actions)))
        if config.env.shuffle_options:
            order = [int(j) for j in rng.permutation(len(obs.actions))]
        reflection_prompt = renderer.reflection_prompt(env, obs)
        plain = renderer.policy_prompt(env, obs, None, order)
        hint, wrong_hint = reflection, False
        # The policy's row may quote a wrong next action (a mistake the demonstrator would
        # make), still labelled with the expert's: a served reflection model is sometimes
        # wrong, and a policy that only ever saw right hints learns to copy them. No draw at
        # rate 0, so data sets made without the key stay identical.
        if config.data.wrong_hint_rate > 0 and rng.random() < config.data.wrong_hint_rate:
            wrong = demo.mistake(env, rng)
            if wrong is not None:
                misled = dataclasses.replace(facts, next_action=obs.actions[wrong])
                hint = clip_tokens(
                    renderer.reflection_tokenizer,
                    writer.write(misled, rng),
                    config.reflection.max_tokens,
                )
                wrong_hint = True
        policy = renderer.policy_prompt(
            env, reflection_prompt.observation, hint, order, reflection_prompt.level
        )
        take, perturbed = expert, False
        # Never two mistakes in a row: the step after a mistake is the expert's recovery.
        if (last is None or last[2]) and rng.random() < config.data.negative_rate:
            wrong = demo.mistake(env, rng)
            if wrong is not None:
                take, perturbed = wrong, True
        yield Step(
            reflection_prompt=reflection_prompt.text,
            reflection=reflection,
            plain_prompt=plain.text,
            policy_prompt=policy.text,
            label=renderer.label_of(order, expert),
            expert_action=obs.actions[expert],
            taken_action=obs.actions[take],
            negative=last is not None and not last[2],
            perturbed=perturbed,
            wrong_hint=wrong_hint,
            observation=obs.digest(),
        )
        before = demo.snapshot(env)
        action = obs.actions[take]
        obs, _, terminated, truncated, _ = env.step(take)
        last = (action, demo.describe(before, action, env), take == expert)
        if terminated or truncated:
            return
