"""The run directory: where each file of a run lives, and what a run has done so far.

    RUN/config.yaml          the validated config (written first; `--resume` reads it)
    RUN/data/                the SFT data set (`reflectrl data`)
    RUN/sft/<player>/        the SFT players (`reflectrl sft`)
    RUN/metrics.jsonl        one row per RL iteration (appended; cut back on resume)
    RUN/checkpoints/         iter_<n>/ folders and `latest`, the name of the newest whole one;
                             the final policy is `latest`'s adapter/ (after RL), else sft/policy
    RUN/eval_*.json          held-out evaluations
    RUN/stages/<stage>.json  one marker per finished stage, with its summary
    RUN/trackers.json        the MLflow / W&B run ids of `run.trackers` (a resume continues them)
    RUN/launches.json        the software and CPU of each launch (reflectrl/provenance.py)
    RUN/mlruns/, RUN/wandb/  the local MLflow store and W&B's offline files (reflectrl/trackers.py)

Every file in it is written through reflectrl/atomic_files.py.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from reflectrl.config import ReflectRLConfig, load_config
from reflectrl.errors import ConfigError

CONFIG_FILE = "config.yaml"
DATA_DIR = "data"
SFT_DIR = "sft"
METRICS_FILE = "metrics.jsonl"
CHECKPOINTS_DIR = "checkpoints"
STAGES_DIR = "stages"
TRACKERS_FILE = "trackers.json"
LAUNCH_LOG = "launch.log"  # what Ray, RLlib and the libraries print in the driver
CHECKPOINT_STATE_FILE = "reflectrl_state.json"  # written last into a checkpoint's folder
LATEST_CHECKPOINT = "latest"  # in CHECKPOINTS_DIR: names the newest whole checkpoint
# What makes a folder a run (one of them is enough): `launch` refuses to start over it.
RUN_MARKERS = (CONFIG_FILE, METRICS_FILE, CHECKPOINTS_DIR, STAGES_DIR)


def stage_marker(run_dir: Path, stage: str) -> Path:
    return run_dir / STAGES_DIR / f"{stage}.json"


def latest_checkpoint(run_dir: Path) -> Path | None:
    pointer = run_dir / CHECKPOINTS_DIR / LATEST_CHECKPOINT
    if not pointer.is_file():
        return None
    path = run_dir / CHECKPOINTS_DIR / pointer.read_text().strip()
    if not (path / CHECKPOINT_STATE_FILE).is_file():
        raise ConfigError(f"checkpoint {path} is incomplete; point checkpoints/latest at another")
    return path


def enabled_stages(config: ReflectRLConfig) -> list[str]:
    stages = ["data", "sft"] if config.sft.enabled else []
    stages += ["rl"] if config.rl.enabled else []
    stages += ["eval"] if config.eval.enabled else []
    if not stages:
        raise ConfigError("sft.enabled, rl.enabled and eval.enabled are all false: nothing to run")
    return stages


def stage_done(run_dir: Path, stage: str) -> dict[str, Any] | None:
    marker = stage_marker(run_dir, stage)
    return json.loads(marker.read_text()) if marker.is_file() else None


def stages_to_run(config: ReflectRLConfig, run_dir: Path, stages: list[str]) -> list[str]:
    """The stages without a marker, and every stage after the first of them (their inputs
    change). RL is unfinished while it has fewer iterations than `run.iterations` (a resume
    with a larger `--iterations` continues it)."""
    for i, stage in enumerate(stages):
        done = stage_done(run_dir, stage)
        if done is None or (stage == "rl" and done["iterations"] < config.run.iterations):
            return stages[i:]
    return []


def sft_players(config: ReflectRLConfig) -> list[str]:
    """The players the sft stage trains: the reflection model only when RL serves it locally
    (a `reflection.server: url` model is the user's to train and name), the policy unless
    `sft.policy` is off (RL only)."""
    r = config.reflection
    reflection = ["reflection"] if r.enabled and r.server == "local" else []
    return reflection + (["policy"] if config.sft.policy else [])


def rl_config(config: ReflectRLConfig, run_dir: Path) -> ReflectRLConfig:
    """The config RL and eval run with: the players start from this run's SFT outputs."""
    if not config.sft.enabled:
        return config
    derived = config.model_copy(deep=True)
    sft = run_dir / SFT_DIR
    trained = sft_players(config)
    if config.sft.method == "lora":
        if "policy" in trained:
            derived.policy.init_adapter = str(sft / "policy")
        if "reflection" in trained:
            derived.reflection.adapter = str(sft / "reflection")
    else:  # full: the SFT'd models are the base models (RL puts a fresh LoRA on the policy)
        if "policy" in trained:
            derived.policy.model = str(sft / "policy")
        if "reflection" in trained:
            derived.reflection.model = str(sft / "reflection")
    return derived


@dataclass(frozen=True)
class FinalPolicy:
    """Where a finished run's policy is: the latest checkpoint's adapter (after RL), the SFT
    adapter (SFT only, LoRA), or the base model itself (SFT only, full, or a policy the sft
    stage left untrained: `path` is None, the run's derived config names the model)."""

    kind: Literal["checkpoint_adapter", "sft_adapter", "model"]
    path: Path | None


def final_policy(run_dir: Path, config: ReflectRLConfig) -> FinalPolicy:
    """A one-line error when the run has no finished policy yet."""
    final = "rl" if config.rl.enabled else "sft" if config.sft.enabled else None
    if final is None or stage_done(run_dir, final) is None:
        raise ConfigError(
            f"--run {run_dir}: no finished policy (stage {final or 'rl'} has not finished); "
            f"finish it with `reflectrl launch --resume {run_dir}` or pass --adapter"
        )
    if final == "rl":
        checkpoint = latest_checkpoint(run_dir)
        assert checkpoint is not None  # the rl stage ends with a checkpoint
        return FinalPolicy("checkpoint_adapter", checkpoint / "adapter")
    if config.sft.method == "lora" and config.sft.policy:
        return FinalPolicy("sft_adapter", run_dir / SFT_DIR / "policy")
    return FinalPolicy("model", None)


# -- a launch's run ---------------------------------------------------------------------------
@dataclass
class LaunchOptions:
    workers: int
    config_path: str | None = None
    output: str | None = None
    iterations: int | None = None
    overrides: list[str] = field(default_factory=list)
    address: str | None = None
    resume: str | None = None


def resolve_run(opts: LaunchOptions) -> tuple[ReflectRLConfig, Path, Path | None]:
    """(config, run dir, checkpoint to resume RL from). Refuses to overwrite an earlier run."""
    if opts.workers < 1:
        raise ConfigError(f"--workers {opts.workers}: need at least 1 rollout worker")
    overrides = list(opts.overrides)
    if opts.iterations is not None:
        overrides.append(f"run.iterations={opts.iterations}")
    if opts.resume:
        run_dir = Path(opts.resume)
        if not (run_dir / CONFIG_FILE).is_file():
            raise ConfigError(f"--resume {run_dir}: no {CONFIG_FILE} there; is it a run directory?")
        if opts.output and Path(opts.output).resolve() != run_dir.resolve():
            raise ConfigError("--resume continues in its own directory; drop --output")
        config = load_config(opts.config_path or run_dir / CONFIG_FILE, overrides)
        return config, run_dir, latest_checkpoint(run_dir)
    config = load_config(opts.config_path, overrides)
    run_dir = Path(opts.output or f"runs/{config.env.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    if run_dir.exists() and any((run_dir / m).exists() for m in RUN_MARKERS):
        raise ConfigError(
            f"--output {run_dir} holds an earlier run; pass --resume {run_dir} to continue it "
            "or choose another --output"
        )
    return config, run_dir, None
