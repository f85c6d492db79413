"""run.trackers: config checks, the missing-package line, the MLflow tracker against a real
local store, and the W&B tracker's settings (against a stand-in `wandb` module: the package
is not a dev dependency). A whole launch read back through MLflow: test_launch_e2e.py."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from reflectrl.config import dump_config, load_config
from reflectrl.errors import ConfigError
from reflectrl.trackers import check_trackers, open_trackers

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "configs" / "smoke.yaml"


def smoke(*overrides: str) -> Any:
    return load_config(SMOKE, list(overrides))


def test_tensorboard_is_the_default_and_unknown_names_are_refused() -> None:
    assert smoke().run.trackers == ["tensorboard"]
    assert smoke("run.trackers=[mlflow, wandb]").run.trackers == ["mlflow", "wandb"]
    with pytest.raises(ConfigError) as err:
        smoke("run.trackers=[tensorboard, neptune]")
    message = str(err.value)
    assert "run.trackers.1" in message and "'neptune'" in message and "\n" not in message


def test_a_missing_tracker_package_is_one_line_with_the_pip_command(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    config = smoke("run.trackers=[tensorboard, wandb]")
    with pytest.raises(ConfigError) as err:
        check_trackers(config)
    assert str(err.value) == (
        "run.trackers names wandb, but the wandb package is not installed: pip install wandb "
        "(or pip install 'reflectrl[trackers]')"
    )
    with pytest.raises(ConfigError, match="pip install wandb"):
        open_trackers(tmp_path, config)  # the same line where a stage opens it
    assert not (tmp_path / "trackers.json").exists()
    check_trackers(smoke())  # tensorboard alone needs neither package
    assert open_trackers(tmp_path, smoke()).records == {}
    assert not (tmp_path / "trackers.json").exists()


def test_mlflow_run_is_created_once_and_continued(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    run_dir = tmp_path / "run"
    config = smoke("run.trackers=[mlflow]")
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(dump_config(config))
    with open_trackers(run_dir, config) as trackers:
        trackers.log_metrics({"rl/success_rate": 0.25}, 1)
    saved = json.loads((run_dir / "trackers.json").read_text())
    with open_trackers(run_dir, config) as trackers:  # e.g. a later stage, or --resume
        trackers.log_metrics({"rl/success_rate": 0.5}, 2)
    assert json.loads((run_dir / "trackers.json").read_text()) == saved
    # Handed the saved ids, a process attaches without writing the run directory (SFT tasks).
    (run_dir / "trackers.json").unlink()
    with open_trackers(run_dir, config, saved) as trackers:
        trackers.log_metrics({"sft/policy/loss": 2.0}, 10)
    assert not (run_dir / "trackers.json").exists()

    client = MlflowClient((run_dir / "mlruns").resolve().as_uri())
    run_id = saved["mlflow"]["run_id"]
    run = client.get_run(run_id)
    assert run.info.run_name == "run" and run.info.status == "FINISHED"
    assert len(client.search_runs([run.info.experiment_id])) == 1
    history = client.get_metric_history(run_id, "rl/success_rate")
    assert [(m.step, m.value) for m in history] == [(1, 0.25), (2, 0.5)]
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "sft/policy/loss")] == [
        (10, 2.0)
    ]
    params = run.data.params
    assert params["run.trackers"] == '["mlflow"]' and params["sft.max_steps"] == "10"
    assert params["curriculum.stages"].startswith('[{"name": "pickup"')
    assert [a.path for a in client.list_artifacts(run_id)] == ["config.yaml"]


def test_mlflow_tracking_uri_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from mlflow.tracking import MlflowClient

    store = (tmp_path / "elsewhere").resolve().as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "taxi-sweep")
    run_dir = tmp_path / "run"
    config = smoke("run.trackers=[mlflow]")
    with open_trackers(run_dir, config) as trackers:
        trackers.log_metrics({"rl/success_rate": 1.0}, 3)
    saved = json.loads((run_dir / "trackers.json").read_text())["mlflow"]
    assert saved["tracking_uri"] == store and not (run_dir / "mlruns").exists()
    client = MlflowClient(store)
    experiment = client.get_experiment_by_name("taxi-sweep")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_id == saved["run_id"] and run.data.metrics["rl/success_rate"] == 1.0
    # A resume finds the run where it was made, whatever the environment says now.
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    with open_trackers(run_dir, config) as trackers:
        trackers.log_metrics({"rl/success_rate": 0.0}, 4)
    assert len(client.get_metric_history(saved["run_id"], "rl/success_rate")) == 2


class StandInRun:
    """What `wandb.init` returns, recording what the tracker hands it."""

    def __init__(self, **settings: Any) -> None:
        self.settings = settings
        self.logged: list[dict[str, Any]] = []
        self.axes: list[tuple[str, str | None]] = []
        self.config = types.SimpleNamespace(update=self.update_config)
        self.config_values: dict[str, Any] = {}
        self.saved: list[tuple[str, str]] = []
        self.finished = False

    def update_config(self, values: dict[str, Any], allow_val_change: bool = False) -> None:
        self.config_values.update(values)

    def define_metric(self, name: str, step_metric: str | None = None) -> None:
        self.axes.append((name, step_metric))

    def log(self, values: dict[str, Any]) -> None:
        self.logged.append(values)

    def save(self, path: str, base_path: str, policy: str) -> None:
        self.saved.append((path, policy))

    def finish(self) -> None:
        self.finished = True


@pytest.fixture
def wandb_runs(monkeypatch: pytest.MonkeyPatch) -> list[StandInRun]:
    runs: list[StandInRun] = []

    def init(**settings: Any) -> StandInRun:
        runs.append(StandInRun(**settings))
        return runs[-1]

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_PROJECT"):
        monkeypatch.delenv(name, raising=False)
    return runs


def test_wandb_is_offline_in_the_run_dir_and_resumes_its_run(
    wandb_runs: list[StandInRun], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    config = smoke("run.trackers=[tensorboard, wandb]")
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(dump_config(config))
    with open_trackers(run_dir, config) as trackers:
        trackers.log_metrics({"rl/success_rate": 0.5, "rl/env_steps": 64.0}, 1)
        trackers.log_metrics({"rl/success_rate": 0.75}, 2)
    first = wandb_runs[0]
    run_id = json.loads((run_dir / "trackers.json").read_text())["wandb"]["run_id"]
    assert first.settings == {
        "project": "reflectrl",
        "name": "run",
        "id": run_id,
        "resume": "allow",
        "dir": str(run_dir),
        "mode": "offline",
    }
    # W&B's own step only grows: each metric is plotted against its prefix's step instead.
    assert first.axes == [("rl/step", None), ("rl/*", "rl/step")]
    assert first.logged == [
        {"rl/success_rate": 0.5, "rl/env_steps": 64.0, "rl/step": 1},
        {"rl/success_rate": 0.75, "rl/step": 2},
    ]
    assert first.config_values["ppo"]["lr"] == 0.001
    assert first.saved == [(str(run_dir / "config.yaml"), "now")] and first.finished

    monkeypatch.setenv("WANDB_MODE", "online")  # the user's choice is left to W&B
    with open_trackers(run_dir, config):
        pass
    second = wandb_runs[1]
    assert second.settings["id"] == run_id and second.settings["mode"] is None
    assert second.config_values == {} and second.saved == []  # logged when it was created
