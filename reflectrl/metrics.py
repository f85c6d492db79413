"""Where each iteration's figures go: metrics.jsonl, TensorBoard, and Ray's metrics endpoint
(gauges named reflectrl_*, shown on the Ray dashboard's metrics view)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# Figures exported as Ray gauges (numeric, one value per iteration).
GAUGES = (
    "env_steps",
    "episodes",
    "success_rate",
    "episode_return_mean",
    "reflection_calls",
    "env_steps_per_s",
    "weight_sync_bytes",
    "adapter_version",
    "restarted_workers",
)


class MetricsSink:
    def __init__(self, run_dir: Path, resume: bool = False) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.run_name = run_dir.name
        self.jsonl = (run_dir / "metrics.jsonl").open("a" if resume else "w")
        self.tensorboard = SummaryWriter(log_dir=str(run_dir / "tensorboard"))
        self.gauges = _make_gauges()

    def write(self, row: dict[str, Any]) -> None:
        self.jsonl.write(json.dumps(row) + "\n")
        self.jsonl.flush()  # a crash loses at most the iteration in progress
        step = int(row["iteration"])
        for key, value in row.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                self.tensorboard.add_scalar(f"reflectrl/{key}", value, step)
                if key in self.gauges:
                    self.gauges[key].set(float(value), tags={"run": self.run_name})
        self.tensorboard.flush()

    def close(self) -> None:
        self.jsonl.close()
        self.tensorboard.close()


def _make_gauges() -> dict[str, Any]:
    import ray
    from ray.util.metrics import Gauge

    if not ray.is_initialized():
        return {}
    return {
        key: Gauge(f"reflectrl_{key}", description=f"reflectrl {key}", tag_keys=("run",))
        for key in GAUGES
    }
