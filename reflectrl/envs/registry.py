"""Name -> text env. Each env registers a factory and a pydantic model of its options."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

from reflectrl.envs.base import TextEnv
from reflectrl.errors import ConfigError


@dataclass(frozen=True)
class EnvSpec:
    name: str
    options_model: type[BaseModel]  # extra="forbid": unknown option keys are config errors
    factory: Callable[[Any], TextEnv]  # called with a validated options_model instance
    # The config (sections of ReflectRLConfig, as a dict) a `scratch:<env>` tokenizer's corpus
    # plays the env with, given a cache folder for what it generates: for envs whose options
    # have no defaults (AutoExplore's tasks file) or whose prompts need other budgets.
    corpus_config: Callable[[Any], dict[str, Any]] | None = None
    corpus_episodes: int = 240  # expert episodes the corpus plays (fewer where steps are slow)


_REGISTRY: dict[str, EnvSpec] = {}


def register_env(spec: EnvSpec) -> None:
    _REGISTRY[spec.name] = spec


def env_names() -> list[str]:
    _load_builtin_envs()
    return sorted(_REGISTRY)


def get_env_spec(name: str) -> EnvSpec:
    _load_builtin_envs()
    if name not in _REGISTRY:
        raise ConfigError(f"env.name: unknown env {name!r}; valid: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]


def validate_env_options(name: str, options: dict[str, Any] | BaseModel) -> BaseModel:
    spec = get_env_spec(name)
    if isinstance(options, spec.options_model):
        return options
    raw = options.model_dump() if isinstance(options, BaseModel) else options
    try:
        return spec.options_model.model_validate(raw)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"env.options.{where}: {first['msg']}") from None


def env_splits(name: str) -> tuple[str, ...]:
    """The values the env's `split` option takes (read from its options model)."""
    field = get_env_spec(name).options_model.model_fields.get("split")
    return tuple(get_args(field.annotation)) if field is not None else ()


def make_text_env(name: str, options: dict[str, Any] | BaseModel | None = None) -> TextEnv:
    spec = get_env_spec(name)
    return spec.factory(validate_env_options(name, options or {}))


# Importing one of these modules registers its env(s); done lazily, on first lookup.
BUILTIN_ENV_MODULES = (
    "reflectrl.envs.taxi",
    "reflectrl.envs.auto_explore",
    "reflectrl.envs.alfworld.env",
)


def _load_builtin_envs() -> None:
    for module in BUILTIN_ENV_MODULES:
        importlib.import_module(module)
