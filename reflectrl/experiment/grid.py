"""`reflectrl experiment FILE`: every variant x seed of an ablation grid as its own
`reflectrl launch` run, then one report over them.

An experiment file (YAML):

    base: configs/cpu.yaml          # a config file (relative to the working directory)
    set: [run.iterations=20]        # overrides for every run (optional)
    seeds: [0, 1, 2]                # run.seed of each repetition
    variants:                       # name -> its own overrides
      reflect_rl: []
      no_reflection: [reflection.enabled=false]

Each run is a child `reflectrl launch` process (a crash or leak in one run cannot take the
others down) in `OUTPUT/<variant>-seed<seed>/`, its output in `OUTPUT/logs/`. A finished run
is skipped, a half-finished one resumes (`launch --resume`); a run directory made from other
settings than the file now gives is refused, never overwritten. Runs go one after the other,
or `--parallel N` at a time on a cluster with room for N. Runs whose data and SFT settings are
the same (e.g. SFT-only and Reflect-RL of one seed) share them: the later one starts from a
copy of the earlier one's (`share_warm_start`; `--no-share` trains each run's own).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from reflectrl.atomic_files import write_json, write_text
from reflectrl.config import ReflectRLConfig, dump_config, load_config
from reflectrl.errors import ConfigError
from reflectrl.experiment.results import git_commit
from reflectrl.run_dir import CONFIG_FILE, enabled_stages, stage_done, stage_marker, stages_to_run


class ExperimentSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    base: str
    set: list[str] = Field(default_factory=list)
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)
    variants: dict[str, list[str]] = Field(min_length=1)

    @field_validator("variants")
    @classmethod
    def _names_are_folder_names(cls, variants: dict[str, list[str]]) -> dict[str, list[str]]:
        for name in variants:
            if not name.replace("_", "").replace("-", "").isalnum():
                raise ValueError(f"variant name {name!r}: use letters, digits, '_' or '-'")
        return variants


@dataclass(frozen=True)
class PlannedRun:
    variant: str
    seed: int
    dir: Path
    overrides: list[str]

    @property
    def name(self) -> str:
        return self.dir.name


def load_spec(path: Path) -> ExperimentSpec:
    if not path.is_file():
        raise ConfigError(f"experiment file {path} does not exist; pass an existing YAML file")
    try:
        spec = ExperimentSpec.model_validate(yaml.safe_load(path.read_text()) or {})
    except yaml.YAMLError as err:
        raise ConfigError(
            f"experiment file {path} is not valid YAML: {err}".splitlines()[0]
        ) from err
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise ConfigError(f"experiment file {path}: {where}: {first['msg']}") from err
    if not Path(spec.base).is_file():
        raise ConfigError(
            f"experiment file {path}: base {spec.base} does not exist (paths are relative to "
            "the working directory); run from the repository root or give an absolute path"
        )
    return spec


def plan(spec: ExperimentSpec, output: Path) -> list[PlannedRun]:
    """Every variant x seed, each config validated now (a typo fails before any run starts)."""
    runs = []
    for variant, variant_set in spec.variants.items():
        for seed in spec.seeds:
            overrides = [*spec.set, *variant_set, f"run.seed={seed}"]
            load_config(spec.base, overrides)
            runs.append(PlannedRun(variant, seed, output / f"{variant}-seed{seed}", overrides))
    return runs


def status(run: PlannedRun, base: str) -> str:
    """'new', 'resume' or 'finished'; a run dir of other settings is a one-line error."""

    saved = run.dir / CONFIG_FILE
    if not saved.is_file():
        return "new"
    config = load_config(base, run.overrides)
    # Compared as validated configs: a key added since the run, at its default, is no change.
    if dump_config(load_config(saved, [])) != dump_config(config):
        raise ConfigError(
            f"{run.dir} was run with other settings than the experiment file now gives; move "
            "it away or pass another --output (nothing was changed)"
        )
    return "resume" if stages_to_run(config, run.dir, enabled_stages(config)) else "finished"


# What only RL and eval read: runs equal in everything else have the same data and SFT.
RL_ONLY_SECTIONS = ("ppo", "rl", "eval")
RL_ONLY_CURRICULUM = ("enabled", "window", "min_episodes", "review")


def warm_start_key(config: ReflectRLConfig) -> str | None:
    """The settings the data and sft stages depend on (None without those stages)."""
    if not config.sft.enabled:
        return None
    tree = config.model_dump(mode="json")
    for section in RL_ONLY_SECTIONS:
        tree.pop(section)
    for key in RL_ONLY_CURRICULUM:
        tree["curriculum"].pop(key)
    # The data spreads its episodes over the stages by name; a stage's bar and cap are RL's.
    tree["curriculum"]["stages"] = [stage["name"] for stage in tree["curriculum"]["stages"]]
    tree["run"] = {"seed": tree["run"]["seed"]}
    tree["policy"].pop("rl_trainable")  # what RL trains
    if config.sft.method == "full":  # full SFT trains every weight: policy.lora is RL's alone
        tree["policy"].pop("lora")
    return json.dumps(tree, sort_keys=True)


def share_warm_start(runs: list[PlannedRun], run: PlannedRun, base: str) -> PlannedRun | None:
    """Start `run` from the data and SFT of a finished run with the same warm-start settings
    (e.g. SFT-only and Reflect-RL of one seed): copies them with their stage markers, so the
    run resumes after them. Returns the donor, or None when there is none."""

    config = load_config(base, run.overrides)
    key = warm_start_key(config)
    for donor in runs:
        if key is None or donor == run:
            continue
        if not all(stage_done(donor.dir, stage) for stage in ("data", "sft")):
            continue
        if warm_start_key(load_config(base, donor.overrides)) != key:
            continue
        run.dir.mkdir(parents=True, exist_ok=True)
        for folder in ("data", "sft"):
            shutil.copytree(donor.dir / folder, run.dir / folder)
        for stage in ("data", "sft"):
            marker = {**(stage_done(donor.dir, stage) or {}), "shared_from": donor.name}
            write_json(stage_marker(run.dir, stage), marker)
        write_text(run.dir / CONFIG_FILE, dump_config(config))  # written last: now resumable
        return donor
    return None


def launch_command(run: PlannedRun, base: str, how: str, workers: int, address: str | None
                   ) -> list[str]:  # fmt: skip
    command = [sys.executable, "-m", "reflectrl.cli", "launch", "--workers", str(workers)]
    if how == "resume":
        command += ["--resume", str(run.dir)]
    else:
        command += ["--config", base, "--output", str(run.dir)]
        for override in run.overrides:
            command += ["--set", override]
    return command + (["--address", address] if address else [])


_print_lock = threading.Lock()


def execute(run: PlannedRun, command: list[str], log: Path) -> int:
    """Run one launch, its output prefixed with the run's name and copied into `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as sink:
        # Which code made the run: the report may be written later, at another commit.
        sink.write(f"# commit {git_commit()}: {' '.join(command)}\n")
        # An argument list, never a shell: nothing in a config reaches a shell.
        child = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
        )
        assert child.stdout is not None
        for line in child.stdout:
            sink.write(line)
            sink.flush()
            with _print_lock:
                print(f"[{run.name}] {line}", end="", flush=True)
        return child.wait()


def run_grid(
    spec: ExperimentSpec,
    runs: list[PlannedRun],
    output: Path,
    workers: int,
    parallel: int = 1,
    address: str | None = None,
    share: bool = True,
    donors: list[PlannedRun] | None = None,
) -> dict[str, Any]:
    """Run what is not finished; returns {run name: 'finished' | 'failed (exit N)'}. A new run
    may start from the data and SFT of any finished run of `donors` (default: `runs`)."""
    todo = []
    outcome: dict[str, Any] = {}
    for run in runs:
        how = status(run, spec.base)
        if how == "finished":
            print(f"{run.name}: finished earlier; skipped", flush=True)
            outcome[run.name] = "finished"
        else:
            todo.append((run, how))
    total = len(todo)

    def one(item: tuple[int, tuple[PlannedRun, str]]) -> None:
        number, (run, how) = item
        if how == "new" and share:
            donor = share_warm_start(donors or runs, run, spec.base)
            if donor is not None:
                how = "resume"
                with _print_lock:
                    print(f"{run.name}: data and SFT shared with {donor.name} (same settings)",
                          flush=True)  # fmt: skip
        with _print_lock:
            print(f"run {number}/{total}: {run.name} ({'resumed' if how == 'resume' else 'new'})",
                  flush=True)  # fmt: skip
        command = launch_command(run, spec.base, how, workers, address)
        code = execute(run, command, output / "logs" / f"{run.name}.log")
        outcome[run.name] = "finished" if code == 0 else f"failed (exit {code})"

    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        list(pool.map(one, enumerate(todo, 1)))
    return outcome
