"""Reflections for the SFT data, written from the true state.

A reflection says what the last action did, whether it helped, and what to do next, in one or
two sentences (METHOD.md). `TemplateWriter` words the facts with seeded templates, so the model
does not learn one fixed string; `ApiWriter` asks any OpenAI-compatible chat endpoint
(`data.writer.url`) to word them instead, for users with a strong model.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx
import numpy as np

from reflectrl.errors import ConfigError, ReflectionServerError


@dataclass(frozen=True)
class Facts:
    """What the reflection at one step is about (`last_action` is None at the first step)."""

    observation: str
    situation: str  # the task as it stands (used at the first step)
    last_action: str | None
    effect: str  # what the last action did
    helped: bool  # the last action was the expert's choice
    next_action: str  # the expert's action now


GOOD = (
    "{action} {effect}, which helps.",
    "Good: {action} {effect}.",
    "{action} {effect}; that was the right move.",
    "{action} {effect}, as planned.",
)
BAD = (
    "{action} {effect}; that was a mistake.",
    "Mistake: {action} {effect}.",
    "{action} did not help: it {effect}.",
    "{action} {effect}; it was wrong.",
)
NEXT = ('Next: "{next}".', 'Now do "{next}".', 'The next step is "{next}".', 'Then "{next}".')
RECOVER = (
    'To recover: "{next}".',
    'Fix it with "{next}".',
    'Get back on track: "{next}".',
    'Undo the detour: "{next}".',
)
FIRST = ('{situation} First: "{next}".', '{situation} Start with "{next}".')


class TemplateWriter:
    def write(self, facts: Facts, rng: np.random.Generator) -> str:
        def pick(options: tuple[str, ...]) -> str:
            return options[int(rng.integers(len(options)))]

        if facts.last_action is None:
            return pick(FIRST).format(situation=facts.situation, next=facts.next_action)
        verdict = pick(GOOD if facts.helped else BAD)
        action = f'"{facts.last_action}"'
        first = verdict.format(action=action, effect=facts.effect)
        then = pick(NEXT if facts.helped else RECOVER).format(next=facts.next_action)
        return f"{first[0].upper()}{first[1:]} {then}"


class ApiWriter:
    """Words the facts through an OpenAI-compatible `/chat/completions` endpoint."""

    def __init__(
        self, url: str, model: str, max_tokens: int, api_key: str = "", timeout_s: float = 60.0
    ) -> None:
        self.url = url.rstrip("/")
        self.model = model
        self.max_tokens = max_tokens
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(timeout=timeout_s, headers=headers)

    def check(self) -> None:
        """A one-line ConfigError unless the endpoint answers."""
        try:
            response = self.http.get(f"{self.url}/models", timeout=10)
            response.raise_for_status()
        except httpx.HTTPError as err:
            raise ConfigError(
                f"data.writer.url {self.url} does not answer ({type(err).__name__}); start the "
                "server or unset data.writer.url to use the built-in writer"
            ) from None

    def write(self, facts: Facts, rng: np.random.Generator) -> str:
        last = (
            "No action has been taken yet."
            if facts.last_action is None
            else f'The last action was "{facts.last_action}": it {facts.effect}; it '
            f"{'helped' if facts.helped else 'was a mistake'}."
        )
        content = (
            f"An agent sees this:\n{facts.observation}\n\n{last} The best next action is "
            f'"{facts.next_action}". In one or two short sentences, say what the last action '
            "did, whether it helped, and what to do next. Do not mention these instructions."
        )
        payload = {
            "model": self.model,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": self.max_tokens,
            "temperature": 0.7,
            "seed": int(rng.integers(2**31)),
        }
        try:
            response = self.http.post(f"{self.url}/chat/completions", json=payload)
            response.raise_for_status()
            text = response.json()["choices"][0]["message"]["content"]
        except (httpx.HTTPError, KeyError, IndexError, ValueError) as err:
            raise ReflectionServerError(
                f"data.writer.url {self.url} failed to write a reflection: {type(err).__name__}"
            ) from None
        return " ".join(str(text).split())
