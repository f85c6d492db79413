"""How an RLlib EnvRunner builds its env: the creator RLlib calls with the env config.

RLlib (gym_env_vectorize_mode="vector_entry_point") calls `make_vector_env(ctx)` with
`ctx["num_envs"]` set, once per EnvRunner; the tokenizer and the reflection client are made
here, inside the worker process, so nothing heavy crosses the object store.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from reflectrl.config import ReflectRLConfig
from reflectrl.models.loading import load_tokenizer, resolve_model
from reflectrl.rollout_workers.error_sink import error_reporter
from reflectrl.rollout_workers.vector_env import ReflectRLVectorEnv

if TYPE_CHECKING:
    from reflectrl.reflection.client import ReflectionClient


def env_config_for(
    config: ReflectRLConfig, reflection_url: str | None, error_sink: str | None = None
) -> dict[str, Any]:
    """What the driver hands RLlib as `env_config` (plain JSON data)."""
    return {
        "reflectrl": config.model_dump(mode="json"),
        "reflection_url": reflection_url,
        "error_sink": error_sink,  # the name of the run's ErrorSink actor
    }


def make_reflection_client(
    config: ReflectRLConfig, url: str, worker_index: int
) -> ReflectionClient:
    from reflectrl.reflection.client import ReflectionClient

    r = config.reflection
    return ReflectionClient(
        base_url=url,
        model=r.request_model,
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
    # RLlib passes a plain dict here (no worker index): the callback's on_environment_created
    # calls `set_worker_index` before the first reset.
    worker_index = int(getattr(ctx, "worker_index", 0))
    policy_dir = resolve_model(config.policy.model)
    tokenizer = load_tokenizer(policy_dir)
    reflector, reflection_tokenizer = None, None
    if config.reflection.enabled:
        reflector = make_reflection_client(config, ctx["reflection_url"], worker_index)
        # Reflection prompts are measured in the reflection model's own tokens.
        reflection_dir = resolve_model(config.reflection.model)
        if reflection_dir != policy_dir:
            reflection_tokenizer = load_tokenizer(reflection_dir)
    return ReflectRLVectorEnv(
        config,
        tokenizer,
        reflector,
        num_envs=int(ctx["num_envs"]),
        worker_index=worker_index,
        reflection_tokenizer=reflection_tokenizer,
        report_error=error_reporter(ctx.get("error_sink")),
    )
