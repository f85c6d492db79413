"""Starting or joining Ray: a local single-user cluster on loopback, or an existing cluster."""

from __future__ import annotations

import os
import socket
from typing import Any

import ray

from reflectrl.cluster.placement import check_gpus
from reflectrl.config import ReflectRLConfig
from reflectrl.errors import ConfigError


def init_ray(address: str | None, config: ReflectRLConfig, workers: int) -> str | None:
    """Join `address` (or RAY_ADDRESS), else start a local Ray; returns the dashboard URL."""
    import torch

    address = address or os.environ.get("RAY_ADDRESS")
    runtime_env = {"env_vars": {"HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1")}}
    # The GPUs the config asks for must be there before anything starts (Ray would wait for
    # them forever): a cluster's once joined, a local Ray's (this machine's) before it starts.
    cuda_devices = torch.cuda.device_count()
    if address:
        _check_reachable(address)
        try:
            ctx = ray.init(address=address, runtime_env=runtime_env, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as err:
            raise ConfigError(
                f"cannot reach Ray at {address!r} ({str(err).splitlines()[0][:160]}); start it "
                "with `ray start --head` or drop --address/RAY_ADDRESS for a local Ray"
            ) from None
        try:
            check_gpus(config, workers, ray.cluster_resources().get("GPU", 0.0), cuda_devices)
        except ConfigError:
            ray.shutdown()
            raise
    else:
        check_gpus(config, workers, cuda_devices, cuda_devices)
        # A local single-user cluster on loopback: token auth off, dashboard on 127.0.0.1.
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        ctx = _start_local(config, workers, runtime_env)
    url = getattr(ctx, "dashboard_url", None)
    return f"http://{url}" if url and not url.startswith("http") else url


def _start_local(config: ReflectRLConfig, workers: int, runtime_env: dict[str, Any]) -> Any:
    host = config.run.dashboard_host
    port = _free_port(host, config.run.dashboard_port)
    for attempt in range(3):
        try:
            return ray.init(
                # A new local Ray even when `ray start` runs one on this machine (which a bare
                # ray.init() would join, and then refuse num_cpus).
                address="local",
                _node_ip_address="127.0.0.1",  # Ray's servers on loopback, where Ray lets us
                # One CPU per rollout worker and learner actor, one for the driver.
                num_cpus=max(os.cpu_count() or 1, workers + config.run.num_learners + 1),
                include_dashboard=True,
                dashboard_host=host,
                dashboard_port=port,
                runtime_env=runtime_env,
                log_to_driver=False,
            )
        except Exception as err:  # Ray raises ValueError or a bare Exception for this
            # Another run on this machine took the port between our check and Ray's bind.
            taken = ("already occupied", "valid port for dashboard")
            if not any(text in str(err) for text in taken) or attempt == 2:
                raise
            ray.shutdown()
            port = _free_port(host, 0)
    raise AssertionError("unreachable")


def _check_reachable(address: str) -> None:
    """Fail in seconds on a dead `host:port` (ray.init would retry for minutes)."""
    if "://" in address or address == "auto":
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"--address {address!r}: expected HOST:PORT, ray://HOST:PORT or auto")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as err:
        raise ConfigError(
            f"cannot reach Ray at {address!r} ({err.strerror or err}); start it with "
            "`ray start --head` or drop --address/RAY_ADDRESS for a local Ray"
        ) from None


def _free_port(host: str, preferred: int) -> int:
    """`preferred` if nothing listens there, else any free port (two runs on one machine)."""
    for port in (preferred, 0):
        with socket.socket() as probe:
            try:
                probe.bind((host, port))
            except OSError:
                continue
            return int(probe.getsockname()[1])
    raise ConfigError(f"run.dashboard_host {host!r}: cannot bind any port there")
