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

Every row also records the step's `menu` (the valid actions in label order), the expert's and
the taken action's text, and flags. Output: `data.jsonl` (rows), `stats.json` (counts and
token lengths).
"""

from __future__ import annotations

import json
import os
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from reflectrl.atomic_files import atomic_path, write_json
from reflectrl.config import ReflectRLConfig
from reflectrl.console import say
from reflectrl.data.demos import demonstrator_for
from reflectrl.data.episodes import episode_steps
from reflectrl.data.scratch import resolve_or_build
from reflectrl.data.writers import ApiWriter, TemplateWriter
from reflectrl.envs.registry import make_text_env
from reflectrl.errors import ConfigError
from reflectrl.models.loading import load_tokenizer
from reflectrl.seeding import hash_seed
from reflectrl.text.rendering import PromptRenderer
from reflectrl.text.tokens import count_tokens

DATA_FILE = "data.jsonl"
STATS_FILE = "stats.json"
TARGETS = ("sft", "sft_reflection", "sft_policy")


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
    policy_dir = resolve_or_build(config.policy.model)
    reflection_dir = resolve_or_build(config.reflection.model)
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
    counts: Counter[str] = Counter()
    lengths: dict[str, list[int]] = defaultdict(list)
    with atomic_path(out / DATA_FILE) as tmp, tmp.open("w") as f:
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
                        "menu": list(step.menu),
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
                say(f"data: {e + 1}/{episodes} episodes, {counts['steps']} steps")
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
    write_json(out / STATS_FILE, stats)
    return stats
