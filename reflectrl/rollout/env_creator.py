"""How an RLlib EnvRunner builds its env: the creator RLlib calls with the env config.

RLlib (gym_env_vectorize_mode="vector_entry_point") calls `make_vector_env(ctx)` with
`ctx["num_envs"]` set, once per EnvRunner; the tokenizer and the reflection client are made
here, inside the worker process, so nothing heavy crosses the object store.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from reflectrl.config import ReflectRLConfig
from reflectrl.data.scratch import resolve_or_build
from reflectrl.models.loading import load_tokenizer
from reflectrl.reflection.endpoint import ReflectionEndpoint
from reflectrl.rollout.error_sink import error_reporter
from reflectrl.rollout.progress_board import board_reporter
from reflectrl.rollout.vector_env import ReflectRLVectorEnv

if TYPE_CHECKING:
    from reflectrl.reflection.client import ReflectionClient


def env_config_for(
    config: ReflectRLConfig,
    reflection: ReflectionEndpoint | None,
    error_sink: str | None = None,
    progress_board: str | None = None,
) -> dict[str, Any]:
    """What the driver hands RLlib as `env_config` (plain JSON data)."""
    return {
        "reflectrl": config.model_dump(mode="json"),
        "reflection": None if reflection is None else reflection.to_dict(),
        "error_sink": error_sink,  # the name of the run's ErrorSink actor
        "progress_board": progress_board,  # the name of its ProgressBoard (learners read it too)
    }


def make_reflection_client(
    config: ReflectRLConfig, endpoint: ReflectionEndpoint
) -> ReflectionClient:
    """A client of the reflection servers, on replica 0. A rollout worker's env re-seeds it and
    moves it to the worker's replica (`ReflectRLVectorEnv.set_worker_index`)."""
    from reflectrl.reflection.actor import ReplicaLocator
    from reflectrl.reflection.client import ReflectionClient

    r = config.reflection
    client = ReflectionClient(
        base_url=endpoint.urls,
        model=r.request_model,
        max_tokens=r.max_tokens,
        temperature=r.temperature,
        timeout_s=r.timeout_s,
        max_retries=r.max_retries,
        seed=config.run.seed,
        api_key=endpoint.api_key,
        locate=ReplicaLocator(endpoint, r.startup_timeout_s) if endpoint.actors else None,
        cache_size=r.cache_size,
    )
    return client


def make_vector_env(ctx: dict[str, Any]) -> ReflectRLVectorEnv:
    if "num_envs" not in ctx:
        raise RuntimeError(
            "reflectrl envs are vector envs: use gym_env_vectorize_mode='vector_entry_point'"
        )
    config = ReflectRLConfig.model_validate(ctx["reflectrl"])
    # RLlib's vector entry point passes a plain dict, without the worker index: the env starts
    # as worker 0, and the callback's on_environment_created calls `set_worker_index` before
    # the first reset (the one place a worker's seeds and replica are chosen).
    policy_dir = resolve_or_build(config.policy.model)
    tokenizer = load_tokenizer(policy_dir)
    reflector, reflection_tokenizer = None, None
    if config.reflection.enabled:
        endpoint = ReflectionEndpoint.from_dict(ctx["reflection"])
        assert endpoint is not None, "reflection is on but the driver sent no endpoint"
        reflector = make_reflection_client(config, endpoint)
        # Reflection prompts are measured in the reflection model's own tokens.
        reflection_dir = resolve_or_build(config.reflection.model)
        if reflection_dir != policy_dir:
            reflection_tokenizer = load_tokenizer(reflection_dir)
    return ReflectRLVectorEnv(
        config,
        tokenizer,
        reflector,
        num_envs=int(ctx["num_envs"]),
        reflection_tokenizer=reflection_tokenizer,
        report_error=error_reporter(ctx.get("error_sink")),
        report_progress=board_reporter(ctx.get("progress_board")),
    )
