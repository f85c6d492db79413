"""Reflection servers that die mid-run: Ray restarts the replica, clients find it at its new
address, the run goes on. Real Ray, RLlib and vLLM (tiny models). Also how workers spread
over replicas and the API key a server bound off loopback requires."""

from __future__ import annotations

import itertools
import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from reflectrl.config import load_config
from reflectrl.reflection.server import child_pids, group_members
from tests.test_reflection_server import needs_vllm

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "configs" / "smoke.yaml"


XDIST_SPREAD = True  # no module fixtures: its tests may run in different test processes


def wait_gone(pgid: int, timeout_s: float = 30) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.5)
    return group_members(pgid)


@needs_vllm
@pytest.mark.integration
def test_a_killed_vllm_process_and_a_killed_replica_actor_are_restarted(
    tmp_path: Path,
) -> None:
    """SIGKILL the vLLM API process, then (separately) the replica's actor: each time Ray
    brings the replica back on a new port, the worker's client finds it, every iteration
    still samples with reflections, `reflection_restarts` counts both, and nothing of the
    killed servers is left running. The server is bound off loopback, so it requires the
    run's API key (the same key after each restart)."""
    import ray

    from reflectrl.rl.driver import Run

    config = load_config(
        SMOKE,
        [
            "curriculum.enabled=false",
            "run.checkpoint_every=100",
            "reflection.max_retries=2",
            "reflection.host=0.0.0.0",
        ],
    )
    ray.init(address="local", num_cpus=3, include_dashboard=False, log_to_driver=False)
    run = Run(config, tmp_path / "run", workers=1)
    rows, old_groups = [], []
    try:
        run.start()
        (actor,) = run.servers.actors
        first_url, key = run.reflection.urls[0], run.reflection.api_key
        without_key = httpx.post(f"{first_url}/completions", json={"prompt": "x"}).status_code
        wrong_key = httpx.get(
            f"{first_url}/models", headers={"Authorization": "Bearer nope"}
        ).status_code
        rows.append(run.train_iteration())

        # 1. The vLLM API process dies (the guard's child); the actor notices and is restarted.
        pgid = ray.get(actor.server_pid.remote())
        old_groups.append(pgid)
        (api_server,) = child_pids(pgid)
        os.kill(api_server, signal.SIGKILL)
        rows.append(run.train_iteration())

        # 2. The actor process itself dies; Ray restarts it, the guard took its server down.
        pgid = ray.get(actor.server_pid.remote())
        old_groups.append(pgid)
        actor_pid = ray.get(actor.__ray_call__.remote(lambda self: os.getpid()))
        os.kill(actor_pid, signal.SIGKILL)
        rows.append(run.train_iteration())
        url_now = ray.get(actor.url.remote())
        live_group = ray.get(actor.server_pid.remote())
    finally:
        run.close()
        ray.shutdown()
    assert key and len(key) >= 24 and "0.0.0.0" not in first_url
    assert without_key == 401 and wrong_key == 401
    assert [r["iteration"] for r in rows] == [1, 2, 3]
    calls = [rows[0]["reflection_calls"]] + [
        b["reflection_calls"] - a["reflection_calls"] for a, b in itertools.pairwise(rows)
    ]
    assert all(c > 0 for c in calls), calls  # every iteration sampled with reflections
    assert rows[0]["reflection_restarts"] == 0
    assert rows[1]["reflection_restarts"] == 1 and rows[2]["reflection_restarts"] == 2
    assert url_now != first_url and live_group not in old_groups
    for pgid in old_groups:
        assert wait_gone(pgid) == [], f"process group {pgid} of a killed server is still alive"
    assert wait_gone(live_group) == []  # close() stopped the last one too


def test_workers_spread_over_replicas_and_follow_a_moved_one(server: Any) -> None:
    """Worker i asks replica i - 1 (mod R); a replica found at a new address is used from
    then on (the locator stands in for Ray here; the HTTP server is real)."""
    from reflectrl.reflection.client import ReflectionClient

    dead = "http://127.0.0.1:9/v1"  # discard port: nothing listens
    moved_to: list[int] = []

    def locate(replica: int) -> str:
        moved_to.append(replica)
        return server.url

    client = ReflectionClient([server.url, dead, server.url], model="reflector", locate=locate)
    client.use_replica(4)
    assert client.base_url == dead and client.replica == 1
    assert client.reflect(["p"]) and moved_to == [1]
    assert client.urls[1] == server.url and client.relocations == 1
    client.use_replica(1)
    assert client.base_url == server.url
