"""Running on a cluster: placement on the nodes the config asks for (a head and two worker
nodes as separate raylets on this machine), and a run submitted as a Ray Job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reflectrl.config import load_config
from tests.helpers import cli_env
from tests.test_reflection_server import needs_vllm

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "configs" / "smoke.yaml"

pytestmark = pytest.mark.integration
XDIST_SPREAD = True  # no module fixtures: its tests may run in different test processes


# What `reflectrl launch` without --address does about Ray (cluster/ray_init.py): prints the
# GCS address it got, the dashboard URL and the number of nodes.
JOIN_OR_START_RAY = """
import sys, ray
from reflectrl.cluster.ray_init import init_ray
from reflectrl.config import load_config
url = init_ray(None, load_config(sys.argv[1]), workers=1)
print(ray.get_runtime_context().gcs_address, url, len(ray.nodes()))
ray.shutdown()
"""


@needs_vllm
def test_actors_land_on_the_nodes_the_config_asks_for(tmp_path: Path) -> None:
    """SFT tasks, the learner actor and two reflection replicas on the `trainer` node,
    rollout workers on the `rollout` node (each asking its own replica), the driver on the
    head: the data goes to the trainer node and the adapters come back, RL starts from them
    and one iteration completes."""
    import ray
    from ray.cluster_utils import Cluster

    from reflectrl.pipeline import StageContext, data_stage, sft_stage
    from reflectrl.rl.driver import Run
    from reflectrl.run_dir import rl_config

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "include_dashboard": False},
    )
    rollout = cluster.add_node(num_cpus=2, resources={"rollout": 2})
    trainer = cluster.add_node(num_cpus=1, resources={"trainer": 3})
    config = load_config(
        SMOKE,
        [
            "curriculum.enabled=false",
            "sft.max_steps=2",
            "run.num_learners=1",
            "run.worker_resources={rollout: 1}",
            "run.learner_resources={trainer: 1}",
            "reflection.resources={trainer: 1}",
            "reflection.replicas=2",
        ],
    )
    ray.init(address=cluster.address, log_to_driver=False)
    run_dir = tmp_path / "run"
    run = None
    try:
        ctx = StageContext(config, run_dir, workers=2, resume_from=None)
        data_stage(ctx)
        sft = sft_stage(ctx)
        run = Run(rl_config(config, run_dir), run_dir, workers=2)
        run.start()
        row = run.train_iteration()
        workers = run.algo.env_runner_group.foreach_env_runner(
            lambda runner: ray.get_runtime_context().get_node_id(), local_env_runner=False
        )
        learners = [
            r.get()
            for r in run.algo.learner_group.foreach_learner(
                lambda learner: ray.get_runtime_context().get_node_id()
            )
        ]
        server_nodes = ray.get(
            [
                server.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id())
                for server in run.servers.actors
            ]
        )
        # Worker i asks replica i - 1: each of the two workers its own server.
        asked = run.algo.env_runner_group.foreach_env_runner(
            lambda runner: runner.env.unwrapped.reflector.base_url, local_env_runner=False
        )
        urls = run.reflection.urls
        driver = ray.get_runtime_context().get_node_id()
        run.close()
        run = None
        # Without --address, a launch starts its own local Ray even while another cluster runs
        # on this machine (a bare ray.init() would join that one).
        local = subprocess.run(
            [sys.executable, "-c", JOIN_OR_START_RAY, str(SMOKE)],
            capture_output=True, text=True, timeout=300, cwd=REPO, env=cli_env(),
        )  # fmt: skip
    finally:
        if run is not None:
            run.close()
        ray.shutdown()
        cluster.shutdown()
    assert sft["policy"]["node"] == sft["reflection"]["node"] == trainer.node_id
    assert (run_dir / "sft" / "policy" / "adapter_config.json").is_file()  # came back
    assert (run_dir / "sft" / "reflection" / "sft_result.json").is_file()
    assert workers == [rollout.node_id, rollout.node_id]
    assert learners == [trainer.node_id] and server_nodes == [trainer.node_id] * 2
    assert asked == urls and len(set(urls)) == 2
    assert driver not in (rollout.node_id, trainer.node_id)
    assert row["updated"] and row["reflection_calls"] > 0
    assert local.returncode == 0, local.stderr[-2000:]
    gcs, dashboard, nodes = local.stdout.split()
    assert gcs != cluster.address and nodes == "1" and dashboard.startswith("http://127.0.0.1:")


def test_a_smoke_run_submitted_as_a_ray_job_succeeds(tmp_path: Path) -> None:
    """`ray job submit --address http://127.0.0.1:PORT --working-dir . -- python -m
    reflectrl.cli launch ...` against a running head with a dashboard (the job server)."""
    from ray.cluster_utils import Cluster

    from reflectrl.reflection.server import free_port

    out = tmp_path / "job-run"
    # The job's entrypoint runs in a shell on the head: the venv's python must come first.
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    dashboard = free_port()
    # Its own agent port: the default one may be held by another Ray on this machine, and a
    # head whose agent cannot listen takes no jobs ("No available agent to submit job").
    head = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 3,
            "include_dashboard": True,
            "dashboard_host": "127.0.0.1",
            "dashboard_port": dashboard,
            "dashboard_agent_listen_port": free_port(),
        },
    )
    address = f"http://127.0.0.1:{dashboard}"
    ray_cli = str(Path(sys.executable).parent / "ray")
    job_id = f"reflectrl-test-{os.getpid()}"
    try:
        # The job server takes submissions once the node's dashboard agent is up.
        deadline = time.monotonic() + 120
        while True:
            submitted = subprocess.run(
                [
                    ray_cli, "job", "submit", "--address", address, "--working-dir", str(REPO),
                    "--no-wait", "--submission-id", job_id, "--",
                    "python", "-m", "reflectrl.cli", "launch", "--workers", "1",
                    "--config", "configs/smoke.yaml", "--iterations", "1", "--output", str(out),
                    "--set", "sft.enabled=false", "--set", "eval.enabled=false",
                    "--set", "reflection.enabled=false",
                ],
                capture_output=True, text=True, timeout=300, cwd=REPO,
            )  # fmt: skip
            agent_not_up = "No available agent to submit job" in submitted.stderr
            if not agent_not_up or time.monotonic() > deadline:
                break
            time.sleep(2)
        assert submitted.returncode == 0, submitted.stderr[-2000:]
        status = wait_for_job(address, job_id, timeout_s=600)
        logs = subprocess.run(
            [ray_cli, "job", "logs", "--address", address, job_id],
            capture_output=True, text=True, timeout=60,
        ).stdout  # fmt: skip
    finally:
        head.shutdown()
    assert status == "SUCCEEDED", logs[-3000:]
    assert "iter    1/1" in logs
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [1] and rows[0]["updated"]


def wait_for_job(address: str, job_id: str, timeout_s: float) -> str:
    from ray.job_submission import JobStatus, JobSubmissionClient

    client = JobSubmissionClient(address)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = client.get_job_status(job_id)
        if status in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
            return str(status.value)
        time.sleep(2)
    return "TIMEOUT"


def test_a_folder_missing_on_a_node_is_unpacked_once_into_its_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from reflectrl.cluster import node_files

    monkeypatch.setattr(node_files, "default_cache_dir", lambda: tmp_path / "cache")
    adapter = tmp_path / "driver" / "sft" / "policy"
    (adapter / "sub").mkdir(parents=True)
    (adapter / "adapter_config.json").write_text('{"r": 8}')
    (adapter / "sub" / "weights.bin").write_bytes(bytes(range(256)))
    files = node_files.pack_dir(adapter)
    assert node_files.local_copy(adapter, files) == adapter  # this node has it: used as is

    elsewhere = tmp_path / "other-node" / "sft" / "policy"  # the path does not exist here
    copy = node_files.local_copy(elsewhere, files)
    assert copy.parent == tmp_path / "cache" / "node_files" and copy.name.startswith("policy-")
    assert node_files.pack_dir(copy) == files
    (copy / "marker").write_text("x")  # a second call reuses the copy, does not rebuild it
    assert node_files.local_copy(elsewhere, files) == copy and (copy / "marker").is_file()
    changed = {**files, "adapter_config.json": b'{"r": 16}'}
    assert node_files.local_copy(elsewhere, changed) != copy  # other contents: another copy


def test_a_dashboard_port_taken_at_the_last_moment_is_retried_on_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two runs starting on one machine (e.g. `experiment --parallel`) can both find 8265
    free; the one that loses the race starts on another port instead of failing."""
    import socket

    import ray

    from reflectrl.cluster import ray_init

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    real = ray_init._free_port
    answers = iter([port])  # the first check says the taken port is free
    monkeypatch.setattr(ray_init, "_free_port", lambda h, p: next(answers, None) or real(h, p))
    try:
        url = ray_init.init_ray(None, load_config(SMOKE), workers=1)
    finally:
        ray.shutdown()
        taken.close()
    assert url is not None and url.startswith("http://127.0.0.1:")
    assert not url.endswith(f":{port}")
