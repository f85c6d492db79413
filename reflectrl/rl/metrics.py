"""Where each iteration's figures go: metrics.jsonl, TensorBoard, Ray's metrics endpoint
(gauges named reflectrl_*, shown on the Ray dashboard's metrics view), the MLflow / W&B run of
`run.trackers` (reflectrl/trackers.py) and the console line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from reflectrl.atomic_files import write_text
from reflectrl.run_dir import METRICS_FILE
from reflectrl.trackers import Trackers, numbers

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
    "reflection_restarts",
    "sample_s",
    "update_s",
)


class MetricsSink:
    """`resume_from`: the iteration of the checkpoint a resumed run continues from. Rows (and
    TensorBoard points) after it were written by iterations the resume repeats: dropped. An
    MLflow / W&B run cannot drop points: it gets the repeated iterations' figures again (MLflow
    keeps both values of such a step). `tensorboard`: whether `run.trackers` names it;
    `trackers`: the run's opened MLflow / W&B trackers, closed by `close`."""

    def __init__(
        self,
        run_dir: Path,
        resume_from: int | None = None,
        tensorboard: bool = True,
        trackers: Trackers | None = None,
    ) -> None:
        self.run_name = run_dir.name
        path = run_dir / METRICS_FILE
        if resume_from is not None:
            keep_rows_up_to(path, resume_from)
        self.jsonl = path.open("a" if resume_from is not None else "w")
        self.tensorboard: Any = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            purge = None if resume_from is None else resume_from + 1
            self.tensorboard = SummaryWriter(log_dir=str(run_dir / "tensorboard"), purge_step=purge)
        self.trackers = trackers if trackers is not None else Trackers([], {})
        self.gauges = _make_gauges()

    def write(self, row: dict[str, Any]) -> None:
        self.jsonl.write(json.dumps(row) + "\n")
        self.jsonl.flush()  # a crash loses at most the iteration in progress
        step = int(row["iteration"])
        figures = numbers(row, "")
        for key, value in figures.items():
            if self.tensorboard is not None:
                self.tensorboard.add_scalar(f"reflectrl/{key}", row[key], step)
            if key in self.gauges:
                self.gauges[key].set(value, tags={"run": self.run_name})
        if self.tensorboard is not None:
            self.tensorboard.flush()
        self.trackers.log_metrics({f"rl/{key}": value for key, value in figures.items()}, step)

    def close(self) -> None:
        self.jsonl.close()
        if self.tensorboard is not None:
            self.tensorboard.close()
        self.trackers.close()


def format_progress(row: dict[str, Any], total: int, eta_s: float | None = None) -> str:
    ret = row["episode_return_mean"]
    eta = "" if eta_s is None else f"  ETA {format_duration(eta_s)}"
    line = (
        f"iter {row['iteration']:>4}/{total}{eta}  env_steps {row['env_steps']:>7}  "
        f"success {row['success_rate']:.2f}  stage {row['stage']}  "
        f"return {'n/a' if ret is None else f'{ret:+.3f}'}  "
        f"steps/s {row['env_steps_per_s']:.1f}  reflections {row['reflection_calls']}"
    )
    if "eval_success_rate" in row:
        line += (
            f"  held-out success {row['eval_success_rate']:.2f} greedy / "
            f"{row['eval_success_rate_sampled']:.2f} sampled"
        )
    if not row["updated"]:  # e.g. no samples arrived within run.sample_timeout_s
        line += "  NO POLICY UPDATE this iteration"
    if row["restarted_workers"]:  # RLlib restarts crashed workers silently: say so
        line += f"  RESTARTED WORKERS {row['restarted_workers']} (see the Ray logs)"
    if row.get("reflection_restarts"):
        line += f"  REFLECTION SERVER RESTARTS {row['reflection_restarts']} (see its log)"
    return line


def format_duration(seconds: float) -> str:
    """`1h02m`, `4m05s` or `12s`."""
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def keep_rows_up_to(path: Path, iteration: int) -> None:
    """Drop the rows of iterations after `iteration`; the file is replaced atomically."""
    if not path.is_file():
        return
    lines = path.read_text().splitlines()
    kept = [line for line in lines if _iteration_of(line) <= iteration]
    if len(kept) == len(lines):
        return
    write_text(path, "".join(f"{line}\n" for line in kept))


def _iteration_of(line: str) -> float:
    """A row's iteration; a line cut short by a crash counts as after every checkpoint."""
    try:
        return int(json.loads(line)["iteration"])
    except (ValueError, KeyError, TypeError):
        return float("inf")


def _make_gauges() -> dict[str, Any]:
    import ray
    from ray.util.metrics import Gauge

    if not ray.is_initialized():
        return {}
    return {
        key: Gauge(f"reflectrl_{key}", description=f"reflectrl {key}", tag_keys=("run",))
        for key in GAUGES
    }
