"""The GPUs a run asks for, and the check that the machine or cluster has them.

Three parts of RL can hold a GPU: the reflection replicas (Ray actors, `reflection.num_gpus` each),
the learner (in the driver when `run.num_learners` is 0, else that many Learner actors with
`run.num_gpus_per_learner` each) and the rollout workers (`run.num_gpus_per_worker` each).
Fractions share a GPU: Ray packs them and sets each actor's `CUDA_VISIBLE_DEVICES`. A learner
in the driver is outside Ray's accounting: it needs a CUDA device in this process. Before RL,
the SFT stage trains each player as a Ray task with one learner's GPUs.

`check_gpus` runs as soon as Ray is up, before any server, worker or learner starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

from reflectrl.config import ReflectionConfig, ReflectRLConfig
from reflectrl.errors import ConfigError


class ActorOptions(TypedDict):
    """`ray.remote` resource options of one actor."""

    num_cpus: float
    num_gpus: float
    resources: dict[str, float]


def reflection_actor_options(config: ReflectionConfig) -> ActorOptions:
    """What each local reflection replica asks Ray for (its server's own CPU threads are not
    counted: vLLM's engine runs in child processes of the actor)."""
    return ActorOptions(num_cpus=0, num_gpus=config.num_gpus, resources=dict(config.resources))


@dataclass(frozen=True)
class GpuRequests:
    """GPUs by part, for `workers` rollout workers."""

    reflection_replicas: int
    gpus_per_replica: float
    learners: int  # Learner actors; 0: the learner runs in the driver
    gpus_per_learner: float
    workers: int
    gpus_per_worker: float

    @property
    def from_ray(self) -> float:
        """What Ray's scheduler must find on the cluster."""
        return (
            self.reflection_replicas * self.gpus_per_replica
            + self.learners * self.gpus_per_learner
            + self.workers * self.gpus_per_worker
        )

    @property
    def in_driver(self) -> float:
        """What the learner in the driver process uses (it must see a CUDA device)."""
        return self.gpus_per_learner if self.learners == 0 else 0.0

    def describe(self) -> str:
        learner = (
            f"{self.learners} learner actors x {self.gpus_per_learner:g}"
            if self.learners
            else f"the learner in this process {self.gpus_per_learner:g}"
        )
        return (
            f"reflection {self.reflection_replicas} x {self.gpus_per_replica:g}, {learner}, "
            f"rollout workers {self.workers} x {self.gpus_per_worker:g}"
        )


def gpu_requests(config: ReflectRLConfig, workers: int) -> GpuRequests:
    r, run = config.reflection, config.run
    local_servers = r.enabled and r.server == "local"
    return GpuRequests(
        reflection_replicas=r.replicas if local_servers else 0,
        gpus_per_replica=r.num_gpus if local_servers else 0.0,
        learners=run.num_learners,
        gpus_per_learner=run.num_gpus_per_learner,
        workers=workers,
        gpus_per_worker=run.num_gpus_per_worker,
    )


def check_gpus(
    config: ReflectRLConfig, workers: int, cluster_gpus: float, driver_gpus: int
) -> None:
    """ConfigError (one line) when the run asks for more GPUs than Ray's cluster has
    (`cluster_gpus`) or its learner-in-the-driver for a GPU this process cannot see."""
    asked = gpu_requests(config, workers)
    # The SFT stage runs each player as a Ray task with one learner's GPUs, before RL starts.
    sft = asked.gpus_per_learner if config.sft.enabled else 0.0
    short_of_ray = max(asked.from_ray, sft) > cluster_gpus + 1e-9
    short_in_driver = asked.in_driver > 0 and driver_gpus < 1
    if not (short_of_ray or short_in_driver):
        return
    total = asked.from_ray + asked.in_driver
    raise ConfigError(
        f"the config asks for {total:g} GPUs ({asked.describe()}) but the Ray cluster has "
        f"{cluster_gpus:g} and this process sees {driver_gpus} CUDA devices; lower "
        "reflection.num_gpus, run.num_gpus_per_learner and run.num_gpus_per_worker (with "
        "reflection.device=cpu), or use configs/cpu.yaml"
    )
