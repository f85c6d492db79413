"""One expert episode, played and rendered state by state into what the SFT rows need (the
prompts RL uses, the reflection, the expert's label), with its mistakes and recoveries."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from reflectrl.config import ReflectRLConfig
from reflectrl.data.demos import Demonstrator
from reflectrl.data.writers import ApiWriter, Facts, TemplateWriter
from reflectrl.envs.base import TextObservation
from reflectrl.errors import ReflectRLError
from reflectrl.text.rendering import PromptRenderer


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
    menu: tuple[str, ...] = ()  # the valid actions in the menu's order (label i: menu[i])


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
            menu=tuple(obs.actions[j] for j in order),
        )
        before = demo.snapshot(env)
        action = obs.actions[take]
        obs, _, terminated, truncated, _ = env.step(take)
        last = (action, demo.describe(before, action, env), take == expert)
        if terminated or truncated:
            return
