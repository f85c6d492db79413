"""The local reflection servers: `reflection.replicas` Ray actors named `reflection-0`, ...,
each running one vLLM server, so Ray places, watches, restarts and shows them.

- Each actor asks for `reflection.num_gpus` and serves from its node; it advertises the node's
  address when bound off loopback, and then requires an API key (one per run unless
  `reflection.api_key_env` names one).
- A replica that dies is brought back: when its vLLM process exits, the actor exits too, and
  Ray restarts it (up to `reflection.max_restarts` times); the new actor starts a new server
  (on a new port). Clients find the new address through `ReplicaLocator` and retry.
- Rollout worker i talks to replica (i - 1) mod R.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import ray

from reflectrl.atomic_files import write_text
from reflectrl.cluster.node_files import Packed, local_copy, pack_dir
from reflectrl.cluster.placement import reflection_actor_options
from reflectrl.config import ReflectionConfig
from reflectrl.errors import ReflectionServerError, ReflectRLError
from reflectrl.models.adapters import read_adapter_config, vllm_max_lora_rank
from reflectrl.models.model_dirs import ScratchBuilder, resolve_model
from reflectrl.reflection.endpoint import ReflectionEndpoint, api_key_for
from reflectrl.reflection.server import VLLMServer

WATCH_S = 1.0


class ReplicaLocator:
    """`locator(i)`: the current URL of replica i, waiting while Ray restarts it."""

    def __init__(self, endpoint: ReflectionEndpoint, timeout_s: float) -> None:
        self.actors, self.namespace, self.timeout_s = endpoint.actors, endpoint.namespace, timeout_s

    def __call__(self, replica: int) -> str:
        name = self.actors[replica]
        try:
            actor = ray.get_actor(name, namespace=self.namespace)
            return str(ray.get(actor.url.remote(), timeout=self.timeout_s))
        except (ValueError, ray.exceptions.RayError) as err:
            raise ReflectionServerError(
                f"reflection replica {name} is gone and was not restarted "
                f"({type(err).__name__}); see its log in the run directory"
            ) from None


def vllm_server(
    c: ReflectionConfig,
    log_path: Path,
    api_key: str | None,
    adapter: Path | None = None,
    build_scratch: ScratchBuilder | None = None,
) -> VLLMServer:
    """The (not yet started) server of one replica of `c`; `adapter` overrides the path of
    `c.adapter` (a copy of it on this node); `build_scratch` builds a scratch model that this
    node lacks (`reflectrl.data.scratch.build_model`, handed down from the stage that runs)."""
    lora_modules, max_rank = {}, 16
    if c.adapter:
        adapter = adapter or Path(c.adapter)
        lora_modules = {c.request_model: str(adapter)}
        max_rank = vllm_max_lora_rank(read_adapter_config(adapter, "reflection.adapter")["r"])
    return VLLMServer(
        model_dir=resolve_model(c.model, build_scratch=build_scratch),
        served_model_name=c.served_model_name,
        log_path=log_path,
        host=c.host,
        port=c.port,
        max_model_len=c.max_model_len,
        device=c.device,
        dtype=c.dtype,
        gpu_memory_utilization=c.gpu_memory_utilization,
        lora_modules=lora_modules,
        max_lora_rank=max_rank,
        api_key=api_key,
    )


class ReflectionServerActor:
    """One replica: starts its vLLM server on creation (also when Ray restarts it)."""

    def __init__(
        self,
        config: dict,
        log_path: str,
        api_key: str | None,
        adapter_files: Packed | None = None,
        build_scratch: ScratchBuilder | None = None,
        launch: str = "",
    ) -> None:
        c = self.config = ReflectionConfig.model_validate(config)
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)  # also on another node
        self.launch = launch
        self.starts = _record_start(self.log_path.with_suffix(".pgid"), launch)
        # The driver's adapter folder, or this node's copy of it.
        adapter = local_copy(c.adapter, adapter_files) if adapter_files and c.adapter else None
        self.server: VLLMServer | None = vllm_server(
            c, self.log_path, api_key, adapter, build_scratch
        ).start()
        _write_pgid(self.log_path.with_suffix(".pgid"), self.server.pgid, self.starts, launch)
        self._url: str | None = None

    def url(self) -> str:
        """The OpenAI base URL, once the server answers (ReflectionServerError with the log's
        tail if it dies or times out first). Clients ask again after a failed connection: if
        the server is dying, the actor dies at once so that Ray restarts it, and the call is
        retried on the new actor, which answers with the new address."""
        if self._url is not None:
            self._exit_if_server_died()
        else:
            assert self.server is not None, "the server was stopped"
            self.server.wait_ready(timeout_s=self.config.startup_timeout_s)
            url = self.server.url
            if self.config.host == "0.0.0.0":  # reachable from other nodes: this node's address
                url = url.replace("0.0.0.0", ray.util.get_node_ip_address())
            self._url = url
            if ray.is_initialized() and ray.get_runtime_context().get_actor_id():  # in an actor
                threading.Thread(target=self._exit_when_server_dies, daemon=True).start()
        return self._url

    def restarts(self) -> int:
        return self.starts - 1

    def _exit_if_server_died(self, wait_s: float = 5.0) -> None:
        server = self.server
        deadline = time.monotonic() + wait_s
        while server is not None and time.monotonic() < deadline:
            if server.healthy():
                return
            if not server.is_running():
                os._exit(1)  # restarted by Ray with a new server
            time.sleep(0.2)

    def server_pid(self) -> int | None:
        return self.server.pgid if self.server is not None else None

    def _exit_when_server_dies(self) -> None:
        while (server := self.server) is not None:
            if not server.is_running() and self.server is not None:
                # Ray restarts a dead actor, not a dead child process: die to be restarted.
                os._exit(1)
            time.sleep(WATCH_S)

    def stop(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            server.stop()


def _record_start(pgid_file: Path, launch: str) -> int:
    """Kill what a previous incarnation of this replica left on this node; return which
    start of this `launch` this is (1 = first). A server left by an earlier launch of the run
    (a killed driver, then --resume) is killed too, but its starts are not this launch's
    restarts."""
    starts = 0
    with contextlib.suppress(OSError, ValueError):
        pgid, recorded, *owner = pgid_file.read_text().split()
        starts = int(recorded) if owner == [launch or "-"] else 0
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(int(pgid), signal.SIGKILL)
    return starts + 1


def _write_pgid(pgid_file: Path, pgid: int | None, starts: int, launch: str) -> None:
    # Whole, or the next start cannot kill it.
    write_text(pgid_file, f"{pgid} {starts} {launch or '-'}\n")


def replica_log(log_path: Path, index: int) -> Path:
    return log_path if index == 0 else log_path.with_name(f"{log_path.stem}-{index}.log")


def start_reflection_servers(
    config: ReflectionConfig, log_path: Path, build_scratch: ScratchBuilder | None
) -> tuple[list[Any], ReflectionEndpoint]:
    """Start `config.replicas` replica actors and wait until every server answers.
    Raises ReflectionServerError (with the log tail) when one cannot start."""
    namespace = f"reflectrl-{uuid.uuid4().hex[:12]}"  # names stay free for the next run
    api_key = api_key_for(config)
    files = pack_dir(Path(config.adapter)) if config.adapter else None
    actor_cls = ray.remote(**reflection_actor_options(config))(ReflectionServerActor)
    names = [f"reflection-{i}" for i in range(config.replicas)]
    actors = [
        actor_cls.options(
            name=name,
            namespace=namespace,
            max_restarts=config.max_restarts,
            max_task_retries=-1,  # a call on a replica that died waits for its restart
        ).remote(
            config.model_dump(mode="json"),
            str(replica_log(log_path, i)),
            api_key,
            files,
            build_scratch,
            namespace,
        )
        for i, name in enumerate(names)
    ]
    try:
        urls = ray.get([actor.url.remote() for actor in actors])
    except ray.exceptions.RayTaskError as err:
        stop_reflection_servers(actors)
        cause = getattr(err, "cause", None)
        if isinstance(cause, ReflectRLError):  # e.g. vLLM died: its message holds the log tail
            raise cause from None
        raise
    return actors, ReflectionEndpoint(urls, names, namespace, api_key)


def stop_reflection_servers(actors: list[Any], timeout_s: float = 60) -> None:
    """Stop every server, then the actors (never restarted after this)."""
    refs = [actor.stop.remote() for actor in actors]
    with contextlib.suppress(ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
        ray.get(refs, timeout=timeout_s)
    for actor in actors:
        ray.kill(actor, no_restart=True)


class ReflectionServers:
    """A run's local replicas, started on first use and shared by the stages that need the
    same server (RL and the final evaluation serve one model: one start, not two)."""

    def __init__(self, build_scratch: ScratchBuilder | None) -> None:
        self.build_scratch = build_scratch
        self.actors: list[Any] = []
        self.endpoint: ReflectionEndpoint | None = None
        self._config: ReflectionConfig | None = None

    def start(self, config: ReflectionConfig, log_path: Path) -> ReflectionEndpoint:
        if self.endpoint is not None and config == self._config:
            return self.endpoint
        self.stop()
        self.actors, self.endpoint = start_reflection_servers(config, log_path, self.build_scratch)
        self._config = config
        return self.endpoint

    def restarts(self) -> int:
        """How many times Ray restarted one of the replicas."""
        return int(sum(ray.get([actor.restarts.remote() for actor in self.actors])))

    def stop(self) -> None:
        stop_reflection_servers(self.actors)
        self.actors, self.endpoint, self._config = [], None, None
