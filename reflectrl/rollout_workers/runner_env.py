"""How an RLlib EnvRunner builds its env: the creator RLlib calls with the env config.

RLlib (gym_env_vectorize_mode="vector_entry_point") calls `make_vector_env(ctx)` with
`ctx["num_envs"]` set, once per EnvRunner; the tokenizer and the reflection client are made
here, inside the worker process, so nothing heavy crosses the object store.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from reflectrl.config import ReflectRLConfig
from reflectrl.models.loading import load_tokenizer, resolve_model
from reflectrl.rollout_workers.vector_env import ReflectRLVectorEnv

if TYPE_CHECKING:
    from reflectrl.reflection.client import ReflectionClient


def env_config_for(config: ReflectRLConfig, reflection_url: str | None) -> dict[str, Any]:
    """What the driver hands RLlib as `env_config` (plain JSON data)."""
    return {"reflectrl": config.model_dump(mode="json"), "reflection_url": reflection_url}


def make_reflection_client(
    config: ReflectRLConfig, url: str, worker_index: int
) -> ReflectionClient:
    from reflectrl.reflection.client import ReflectionClient

    r = config.reflection
    return ReflectionClient(
        base_url=url,
        model=r.served_model_name,
        max_tokens=r.max_tokens,
        temperature=r.temperature,
        timeout_s=r.timeout_s,
        max_retries=r.max_retries,
        seed=config.run.seed + worker_index,
    )


def make_vector_env(ctx: dict[str, Any]) -> ReflectRLVectorEnv:
    if "num_envs" not in ctx:
        raise RuntimeError(
            "reflectrl envs are vector envs: use gym_env_vectorize_mode='vector_entry_point'"
        )
    config = ReflectRLConfig.model_validate(ctx["reflectrl"])
    worker_index = int(getattr(ctx, "worker_index", 0))
    tokenizer = load_tokenizer(resolve_model(config.policy.model))
    reflector = None
    if config.reflection.enabled:
        reflector = make_reflection_client(config, ctx["reflection_url"], worker_index)
    return ReflectRLVectorEnv(
        config, tokenizer, reflector, num_envs=int(ctx["num_envs"]), worker_index=worker_index
    )
