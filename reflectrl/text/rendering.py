"""From an env's observation to the exact prompts both players read, fitted to their budgets.

The rollout workers (RL, evaluation) and the SFT data writer render through this one class, so
SFT trains on byte-for-byte the prompts RL samples with.

- The reflection prompt must fit the server: `reflection.max_model_len - reflection.max_tokens`
  (minus a margin), counted in the reflection model's tokens; the policy prompt must leave room
  for a reflection of `reflection.max_tokens` tokens.
- The policy prompt must fit `env.max_prompt_tokens`, counted in the policy's tokens.
Prompts that do not fit ask the env for a shorter observation (`TextEnv.shorter_observation`,
which trims history, never the current state); only if that is not enough is the end of the
observation cut (`truncated` / `clipped` in the results, counted by the caller).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from reflectrl.config import REFLECTION_MARGIN, ReflectRLConfig
from reflectrl.envs.base import TextEnv, TextObservation
from reflectrl.text import prompts
from reflectrl.text.tokens import count_tokens, fit_tokens, label_token_ids


@dataclass(frozen=True)
class ReflectionPrompt:
    observation: TextObservation  # as shortened to fit
    level: int  # how many times the env shortened it
    text: str
    clipped: bool  # the end of the observation had to be cut


@dataclass(frozen=True)
class PolicyPrompt:
    observation: TextObservation
    text: str
    ids: list[int]  # the policy's tokens, at most env.max_prompt_tokens
    truncated: bool


class PromptRenderer:
    def __init__(
        self,
        config: ReflectRLConfig,
        tokenizer: Any,
        max_actions: int,
        reflection_tokenizer: Any = None,
    ) -> None:
        labels = config.policy.labels
        if max_actions > len(labels):
            raise ValueError(
                f"env {config.env.name!r} shows up to {max_actions} actions but "
                f"policy.labels has only {len(labels)}; add labels"
            )
        self.labels = labels[:max_actions]
        self.label_ids = label_token_ids(tokenizer, self.labels, prompts.ACTION_MARKER)
        self.tokenizer = tokenizer
        # Counts the reflection model's tokens; the policy's tokenizer when none is given.
        self.reflection_tokenizer = reflection_tokenizer or tokenizer
        r = config.reflection
        self.reflection_budget = r.max_model_len - r.max_tokens - REFLECTION_MARGIN
        self.reflection_room = config.env.max_prompt_tokens - r.max_tokens
        self.max_prompt_tokens = config.env.max_prompt_tokens
        self.show_menu = config.policy.show_menu

    def reflection_prompt(self, env: TextEnv, obs: TextObservation) -> ReflectionPrompt:
        """The prompt the reflection model reads for `obs` (env's current state)."""
        shortened, level = shorten(env, obs, 0, self._fits_before_reflection)
        parts = prompts.reflection_parts(shortened)
        ids, dropped = fit_tokens(self.reflection_tokenizer, parts, self.reflection_budget)
        text = parts.text if not dropped else str(self.reflection_tokenizer.decode(ids))
        return ReflectionPrompt(shortened, level, text, clipped=dropped > 0)

    def policy_prompt(
        self,
        env: TextEnv,
        obs: TextObservation,
        reflection: str | None,
        order: Sequence[int],
        level: int = 0,
    ) -> PolicyPrompt:
        """The policy's prompt: the no-reflection layout when `reflection` is None. `level` is
        where the reflection prompt's shortening stopped (the policy prompt extends it)."""
        while True:  # one tokenization when the prompt fits (the usual case)
            parts = self._policy_parts(obs, reflection, order)
            ids, dropped = fit_tokens(self.tokenizer, parts, self.max_prompt_tokens)
            shorter = env.shorter_observation(level + 1) if dropped else None
            if shorter is None:
                return PolicyPrompt(obs, parts.text, ids, truncated=dropped > 0)
            obs, level = shorter, level + 1

    def label_of(self, order: Sequence[int], action: int) -> str:
        """The label the policy answers with to take env action `action` under `order`."""
        return self.labels[list(order).index(action)]

    def _policy_parts(
        self, obs: TextObservation, reflection: str | None, order: Sequence[int]
    ) -> prompts.Prompt:
        if reflection is None:
            return prompts.no_reflection_parts(obs, self.labels, order, self.show_menu)
        return prompts.policy_parts(obs, reflection, self.labels, order, self.show_menu)

    def _fits_before_reflection(self, obs: TextObservation) -> bool:
        """Before the reflection is known: the reflection prompt fits the server, and the policy
        prompt leaves room for a reflection of `reflection.max_tokens` tokens."""
        text = prompts.reflection_parts(obs).text
        if count_tokens(self.reflection_tokenizer, text) > self.reflection_budget:
            return False
        order = list(range(len(obs.actions)))
        policy = self._policy_parts(obs, "", order).text
        return count_tokens(self.tokenizer, policy) <= self.reflection_room


def shorten(
    env: TextEnv, obs: TextObservation, level: int, fits: Callable[[TextObservation], bool]
) -> tuple[TextObservation, int]:
    """The least-trimmed observation (from `level` on) for which `fits` holds, or the shortest
    the env can make."""
    while not fits(obs):
        shorter = env.shorter_observation(level + 1)
        if shorter is None:
            break
        obs, level = shorter, level + 1
    return obs, level
