"""GPU placement of the GPU recipes, on a Ray cluster that advertises fake GPUs.

No CUDA call is made: each part's Ray request comes from the code that makes it (the
reflection replicas' actor options; RLlib's own resource bundles for the learner and the rollout
workers, from the algorithm config a run builds), and a probe actor with that request reports
the GPUs Ray gave it and its CUDA_VISIBLE_DEVICES.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from reflectrl.cluster.placement import check_gpus, gpu_requests, reflection_actor_options
from reflectrl.config import load_config
from reflectrl.errors import ConfigError
from reflectrl.text import prompts
from tests.helpers import run_cli

REPO = Path(__file__).resolve().parents[1]
WORKERS = 2
# The recipes' placement keys as they ship; the models are the tiny test model (no conversion).
TINY = ["policy.model=tiny", "reflection.model=tiny"]


def recipe(name: str) -> Any:
    return load_config(REPO / "configs" / f"{name}.yaml", TINY)


def ray_requests(config: Any, tiny_dir: Path, tokenizer: Any) -> list[dict[str, float]]:
    """RLlib's own resource bundles for this config (the first is the driver's)."""
    from reflectrl.preflight import PolicySpec
    from reflectrl.rl.ppo import build_ppo_config
    from reflectrl.text.tokens import label_token_ids

    labels = label_token_ids(tokenizer, config.policy.labels[:6], prompts.ACTION_MARKER)
    algo_config = build_ppo_config(config, PolicySpec(tiny_dir, labels), WORKERS, None)
    return list(algo_config.algo_class.default_resource_request(algo_config).bundles)


class Probe:
    def devices(self) -> tuple[list[str], str | None]:
        import ray

        return [str(i) for i in ray.get_gpu_ids()], os.environ.get("CUDA_VISIBLE_DEVICES")


def place(requests: list[dict[str, Any]]) -> list[tuple[list[str], str | None]]:
    """Start one probe per request, all at once, and return what each received."""
    import ray

    actors = [ray.remote(Probe).options(**request).remote() for request in requests]
    refs = [actor.devices.remote() for actor in actors]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=60)
    assert len(ready) == len(refs), f"only {len(ready)} of {len(refs)} parts were placed"
    return ray.get(refs)


@pytest.mark.parametrize(("name", "cluster_gpus"), [("gpu", 1), ("gpu_cluster", 3)])
def test_gpu_recipes_receive_the_gpus_they_ask_for(
    name: str, cluster_gpus: int, tiny_dir: Path, tokenizer: Any
) -> None:
    import ray

    config = recipe(name)
    run, r = config.run, config.reflection
    driver, *actors = ray_requests(config, tiny_dir, tokenizer)
    workers, learners = actors[:WORKERS], actors[WORKERS:]  # RLlib's order
    # RLlib asks for what the config says: the driver's learner, learner actors, workers.
    assert driver.get("GPU", 0) == (run.num_gpus_per_learner if run.num_learners == 0 else 0)
    assert [b.get("GPU", 0) for b in learners] == [run.num_gpus_per_learner] * run.num_learners
    assert [b.get("GPU", 0) for b in workers] == [run.num_gpus_per_worker] * WORKERS
    replica = reflection_actor_options(r)
    assert replica["num_gpus"] == r.num_gpus > 0 and r.device == "cuda"

    requests = [dict(replica) for _ in range(r.replicas)]
    requests += [{"num_cpus": 0, "num_gpus": b["GPU"]} for b in actors if b.get("GPU")]
    assert sum(q["num_gpus"] for q in requests) == gpu_requests(config, WORKERS).from_ray
    ray.init(address="local", num_cpus=8, num_gpus=cluster_gpus, include_dashboard=False)
    try:
        placed = place(requests)
        check_gpus(config, WORKERS, ray.cluster_resources()["GPU"], driver_gpus=1)
    finally:
        ray.shutdown()
    for request, (ids, visible) in zip(requests, placed, strict=True):
        assert ids, f"{request} got no GPU"
        assert visible == ",".join(ids), (request, ids, visible)
        if request["num_gpus"] >= 1:
            assert len(ids) == request["num_gpus"]
    whole = [ids[0] for (ids, _), q in zip(placed, requests, strict=True) if q["num_gpus"] >= 1]
    assert len(set(whole)) == len(whole), "two whole-GPU parts were given the same GPU"


def test_too_few_gpus_fail_in_one_line_naming_the_keys() -> None:
    config = recipe("gpu")
    with pytest.raises(ConfigError) as err:
        check_gpus(config, WORKERS, cluster_gpus=0, driver_gpus=0)
    line = str(err.value)
    assert "\n" not in line
    assert "asks for 1.5 GPUs" in line and "the Ray cluster has 0" in line
    for key in ("reflection.num_gpus", "run.num_gpus_per_learner", "run.num_gpus_per_worker"):
        assert key in line
    # The learner in the driver needs a CUDA device even where Ray has GPUs to give.
    with pytest.raises(ConfigError, match="this process sees 0 CUDA devices"):
        check_gpus(config, WORKERS, cluster_gpus=1, driver_gpus=0)
    # SFT trains each player as a Ray task with one learner's GPU, even with the learner in RL
    # in the driver.
    with pytest.raises(ConfigError, match=r"the Ray cluster has 0\.5"):
        check_gpus(config, WORKERS, cluster_gpus=0.5, driver_gpus=1)
    check_gpus(config, WORKERS, cluster_gpus=1, driver_gpus=1)
    cluster = recipe("gpu_cluster")
    with pytest.raises(ConfigError, match=r"asks for 3 GPUs .* the Ray cluster has 2"):
        check_gpus(cluster, WORKERS, cluster_gpus=2, driver_gpus=0)
    check_gpus(cluster, WORKERS, cluster_gpus=3, driver_gpus=0)
    check_gpus(recipe("cpu"), WORKERS, cluster_gpus=0, driver_gpus=0)


def test_a_cuda_reflection_server_needs_a_gpu_share() -> None:
    with pytest.raises(ConfigError, match=r"reflection\.num_gpus is 0"):
        load_config(REPO / "configs" / "gpu.yaml", [*TINY, "reflection.num_gpus=0"])


def test_gpu_recipe_without_gpus_stops_before_anything_starts(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ["launch", "--config", str(REPO / "configs" / "gpu.yaml"), "--output", str(out)]
    args += [f"--set={o}" for o in TINY]
    proc = run_cli(*args, timeout=300, extra_env={"CUDA_VISIBLE_DEVICES": ""})  # no GPU in view
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "asks for 1.5 GPUs" in lines[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert not out.exists()
