"""Text environments (no models, Ray or RLlib here)."""

from reflectrl.envs.base import StepInfo, TextEnv, TextObservation
from reflectrl.envs.registry import EnvSpec, env_names, get_env_spec, make_text_env, register_env

__all__ = [
    "EnvSpec",
    "StepInfo",
    "TextEnv",
    "TextObservation",
    "env_names",
    "get_env_spec",
    "make_text_env",
    "register_env",
]
