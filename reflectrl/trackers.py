"""Experiment trackers (`run.trackers`): MLflow and W&B runs that hold a whole launch.

One tracker run per run directory. Whoever opens the trackers first (the pipeline, or the RL
driver on its own) creates the runs, logs the config as params and config.yaml as an artifact,
and keeps their ids in RUN/trackers.json; every later opener attaches to those ids: the SFT
task of each player (another process, perhaps another node: it gets the ids passed in), the RL
driver, the final eval, and any `--resume`. Opened trackers are closed before the next stage
opens them again, so a run never has two writers at once (W&B cannot take that).

Metric names say where a figure comes from, each name with its own step axis:
    sft/<player>/<key>    TRL's log lines while training (step: the SFT step), and
                          completion_loss_train / completion_loss_eval before (step 0) and after
    rl/<key>              every number of an iteration's metrics.jsonl row (step: the iteration)
    eval/<split>/<decoding>/all/<key>, .../stages/<stage>/<key>
                          the final eval's figures (step: the RL iterations), and its JSON file

TensorBoard is not one of these: `MetricsSink` writes it (reflectrl/rl/metrics.py). Each
tracker's package is imported only when the config names it.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from reflectrl.atomic_files import write_json
from reflectrl.config import ReflectRLConfig
from reflectrl.errors import ConfigError
from reflectrl.run_dir import CONFIG_FILE, TRACKERS_FILE

# The module each tracker imports, and what installs it.
PACKAGES = {"mlflow": ("mlflow", "mlflow-skinny"), "wandb": ("wandb", "wandb")}
EXPERIMENT = "reflectrl"  # MLflow experiment / W&B project unless the environment names one
# A tracker's saved state in trackers.json: its run id and where the run lives.
Record = dict[str, str | None]


class Tracker(Protocol):
    def start(self, run_dir: Path, config: ReflectRLConfig, resume: Record | None) -> Record:
        """Create the run (`resume` None) or attach to the saved one; returns what to save."""
        ...

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None: ...

    def log_params(self, config: ReflectRLConfig) -> None: ...

    def log_artifact(self, path: Path) -> None: ...

    def close(self) -> None: ...


def check_trackers(config: ReflectRLConfig) -> None:
    """A one-line error, before anything starts, when a configured tracker's package is
    missing."""
    for name in config.run.trackers:
        if name in PACKAGES and not _installed(PACKAGES[name][0]):
            raise _missing(name)


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ValueError:  # sys.modules holds None for it: its import is blocked
        return False


def _require(name: str) -> Any:
    module, _ = PACKAGES[name]
    try:
        return importlib.import_module(module)
    except ImportError:
        raise _missing(name) from None


def _missing(name: str) -> ConfigError:
    module, package = PACKAGES[name]
    return ConfigError(
        f"run.trackers names {name}, but the {module} package is not installed: "
        f"pip install {package} (or pip install 'reflectrl[trackers]')"
    )


def flat_config(config: ReflectRLConfig) -> dict[str, str]:
    """The config as `section.key` -> value text (lists and mappings as JSON)."""
    flat: dict[str, str] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict) and value:
            for key, inner in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), inner)
        else:
            flat[prefix] = value if isinstance(value, str) else json.dumps(value)

    walk("", config.model_dump(mode="json"))
    return flat


def numbers(values: Mapping[str, Any], prefix: str) -> dict[str, float]:
    """The numeric entries of `values` (not bools), named `prefix + key`; those of a nested
    mapping `prefix + key/inner`."""
    found: dict[str, float] = {}
    for key, value in values.items():
        if isinstance(value, Mapping):
            found.update(numbers(value, f"{prefix}{key}/"))
        elif isinstance(value, int | float) and not isinstance(value, bool):
            found[prefix + key] = float(value)
    return found


class MLflowTracker:
    """A run in `MLFLOW_TRACKING_URI`, else in a file store at RUN/mlruns, through
    `MlflowClient` (no global active run: several processes log to it one after another)."""

    def __init__(self) -> None:
        self.client: Any = None
        self.run_id = ""

    def start(self, run_dir: Path, config: ReflectRLConfig, resume: Record | None) -> Record:
        _require("mlflow")
        from mlflow.tracking import MlflowClient

        # None: the default store under the run directory (found again if the folder moves).
        uri = resume["tracking_uri"] if resume else os.environ.get("MLFLOW_TRACKING_URI")
        if uri is None:
            # MLflow 3 refuses its file store unless told; it needs no server or database.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=uri or (run_dir / "mlruns").resolve().as_uri())
        if resume is not None and resume["run_id"]:
            self.run_id = resume["run_id"]
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            name = os.environ.get("MLFLOW_EXPERIMENT_NAME", EXPERIMENT)
            experiment = self.client.get_experiment_by_name(name)
            experiment_id = (
                experiment.experiment_id if experiment else self.client.create_experiment(name)
            )
            run = self.client.create_run(
                experiment_id, run_name=run_dir.name, tags={"reflectrl.run_dir": str(run_dir)}
            )
            self.run_id = run.info.run_id
        return {"run_id": self.run_id, "tracking_uri": uri}

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(key, value, now, step) for key, value in metrics.items()]
        for i in range(0, len(batch), 1000):  # MLflow's limit per batch
            self.client.log_batch(self.run_id, metrics=batch[i : i + 1000])

    def log_params(self, config: ReflectRLConfig) -> None:
        from mlflow.entities import Param

        params = [Param(key, value) for key, value in flat_config(config).items()]
        for i in range(0, len(params), 100):  # MLflow's limit per batch
            self.client.log_batch(self.run_id, params=params[i : i + 100])

    def log_artifact(self, path: Path) -> None:
        self.client.log_artifact(self.run_id, str(path))

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


class WandbTracker:
    """A W&B run with its files in RUN/wandb: offline unless `WANDB_MODE` or `WANDB_API_KEY`
    says otherwise (`wandb sync RUN/wandb/offline-run-*` uploads an offline run later)."""

    def __init__(self) -> None:
        self.run: Any = None
        self.axes: set[str] = set()

    def start(self, run_dir: Path, config: ReflectRLConfig, resume: Record | None) -> Record:
        wandb = _require("wandb")
        run_id = resume["run_id"] if resume and resume["run_id"] else uuid.uuid4().hex[:12]
        configured = "WANDB_MODE" in os.environ or "WANDB_API_KEY" in os.environ
        run_dir.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", EXPERIMENT),
            name=run_dir.name,
            id=run_id,
            resume="allow",
            dir=str(run_dir),  # W&B adds its wandb/ folder
            mode=None if configured else "offline",
        )
        return {"run_id": run_id}

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        # W&B keeps one global step that only grows (SFT steps, then RL iterations, again after
        # a resume): each name's own step goes in beside it, as `<prefix>/step`.
        steps: dict[str, int] = {}
        for key in metrics:
            axis = key.rsplit("/", 1)[0] if "/" in key else "step"
            if axis not in self.axes:
                self.run.define_metric(f"{axis}/step")
                self.run.define_metric(f"{axis}/*", step_metric=f"{axis}/step")
                self.axes.add(axis)
            steps[f"{axis}/step"] = step
        self.run.log({**metrics, **steps})

    def log_params(self, config: ReflectRLConfig) -> None:
        self.run.config.update(config.model_dump(mode="json"), allow_val_change=True)

    def log_artifact(self, path: Path) -> None:
        self.run.save(str(path), base_path=str(path.parent), policy="now")

    def close(self) -> None:
        self.run.finish()


TRACKERS: dict[str, Callable[[], Tracker]] = {"mlflow": MLflowTracker, "wandb": WandbTracker}


class Trackers:
    """The configured trackers of one run, opened together; `records` are their saved ids."""

    def __init__(self, opened: list[Tracker], records: dict[str, Record]) -> None:
        self.opened = opened
        self.records = records

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        if metrics:
            for tracker in self.opened:
                tracker.log_metrics(metrics, step)

    def log_artifact(self, path: Path) -> None:
        for tracker in self.opened:
            tracker.log_artifact(path)

    def close(self) -> None:
        for tracker in self.opened:
            tracker.close()
        self.opened = []

    def __enter__(self) -> Trackers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_trackers(
    run_dir: Path, config: ReflectRLConfig, records: dict[str, Record] | None = None
) -> Trackers:
    """The run's trackers, attached to the runs in RUN/trackers.json; one missing there is
    created (config as params, config.yaml as an artifact) and saved. `records`: the saved ids
    handed to a process that must not write the run directory (the SFT task)."""
    names = [name for name in config.run.trackers if name in TRACKERS]
    if not names:
        return Trackers([], {})
    path = run_dir / TRACKERS_FILE
    saved = records if records is not None else read_records(run_dir)
    opened: list[Tracker] = []
    found = dict(saved)
    try:
        for name in names:
            tracker = TRACKERS[name]()
            resume = saved.get(name)
            found[name] = tracker.start(run_dir, config, resume)
            opened.append(tracker)
            if resume is None:
                tracker.log_params(config)
                if (run_dir / CONFIG_FILE).is_file():
                    tracker.log_artifact(run_dir / CONFIG_FILE)
    except BaseException:
        Trackers(opened, found).close()
        raise
    if records is None and found != saved:
        write_json(path, found)
    return Trackers(opened, found)


def read_records(run_dir: Path) -> dict[str, Record]:
    path = run_dir / TRACKERS_FILE
    return json.loads(path.read_text()) if path.is_file() else {}
