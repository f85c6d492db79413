"""Where rollout workers send reflection requests, as plain data (it travels in RLlib's
env_config), and the API key a server requires. No Ray here."""

from __future__ import annotations

import os
import secrets
from dataclasses import asdict, dataclass, field
from typing import Any

from reflectrl.config import ReflectionConfig

LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class ReflectionEndpoint:
    """Where rollout workers send reflection requests (plain data: it travels in env_config).

    `actors` name the replica actors (same order as `urls`) in Ray namespace `namespace`; empty
    for an external server (`reflection.server: url`), which nothing restarts."""

    urls: list[str]
    actors: list[str] = field(default_factory=list)
    namespace: str | None = None
    api_key: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> ReflectionEndpoint | None:
        return None if data is None else cls(**data)

    @classmethod
    def external(cls, config: ReflectionConfig) -> ReflectionEndpoint:
        """`reflection.server: url`: that URL, with the key from `reflection.api_key_env`."""
        return cls(urls=[str(config.url)], api_key=os.environ.get(config.api_key_env) or None)


def api_key_for(config: ReflectionConfig) -> str | None:
    """The key a local server requires: none on loopback; off loopback the one in
    `reflection.api_key_env`, else a fresh one for this run."""
    if config.host in LOOPBACK:
        return os.environ.get(config.api_key_env) or None
    return os.environ.get(config.api_key_env) or secrets.token_urlsafe(24)
