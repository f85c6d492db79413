"""The local reflection server as a Ray actor, so it is placed, watched and shown by Ray.

On a GPU cluster the actor asks for `reflection.num_gpus` and serves from that node; the URL
it returns is what every rollout worker's client talks to.
"""

from __future__ import annotations

from pathlib import Path

import ray

from reflectrl.config import ReflectionConfig
from reflectrl.errors import ReflectRLError
from reflectrl.models.adapters import read_adapter_config, vllm_max_lora_rank
from reflectrl.models.loading import resolve_model
from reflectrl.reflection.server import VLLMServer


class ReflectionServerActor:
    def __init__(self, config: dict, log_path: str) -> None:
        self.config = ReflectionConfig.model_validate(config)
        self.log_path = log_path
        self.server: VLLMServer | None = None

    def start(self) -> str:
        """Start vLLM and wait until it answers; returns the OpenAI base URL."""
        c = self.config
        lora_modules, max_rank = {}, 16
        if c.adapter:
            lora_modules = {c.request_model: c.adapter}
            rank = read_adapter_config(c.adapter, "reflection.adapter")["r"]
            max_rank = vllm_max_lora_rank(rank)
        self.server = VLLMServer(
            model_dir=resolve_model(c.model),
            served_model_name=c.served_model_name,
            log_path=Path(self.log_path),
            host=c.host,
            port=c.port,
            max_model_len=c.max_model_len,
            device=c.device,
            lora_modules=lora_modules,
            max_lora_rank=max_rank,
        )
        self.server.start()
        self.server.wait_ready(timeout_s=c.startup_timeout_s)
        url = self.server.url
        if c.host == "0.0.0.0":  # reachable from other nodes: advertise this node's address
            url = url.replace("0.0.0.0", ray.util.get_node_ip_address())
        return url

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


def start_reflection_actor(config: ReflectionConfig, log_path: Path) -> tuple[object, str]:
    """(actor handle, url). Raises ReflectionServerError (with the log tail) on failure."""
    actor_cls = ray.remote(num_cpus=0, num_gpus=config.num_gpus)(ReflectionServerActor)
    actor = actor_cls.options(name=None).remote(config.model_dump(mode="json"), str(log_path))
    try:
        url = ray.get(actor.start.remote())
    except ray.exceptions.RayTaskError as err:
        ray.kill(actor)
        cause = getattr(err, "cause", None)
        if isinstance(cause, ReflectRLError):  # e.g. vLLM died: its message holds the log tail
            raise cause from None
        raise
    return actor, url
