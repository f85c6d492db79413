"""The whole configuration as one pydantic tree, loaded from YAML with `--set a.b=value` overrides.

Unknown keys and wrong types are errors that name the key (`ConfigError`, exit code 2).
The defaults are the GPU recipe, spelled out in `configs/gpu.yaml`; `reflectrl launch` with no
`--config` picks `configs/gpu.yaml` where a CUDA device is visible and `configs/cpu.yaml` (tiny
from-scratch models that learn Taxi on a laptop) otherwise (`machine_recipe`).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, model_validator

from reflectrl.config.base import Strict

# Every section's model stays importable from `reflectrl.config`.
from reflectrl.config.players import (
    MIN_REFLECTION_PROMPT_TOKENS,
    REFLECTION_MARGIN,
    EnvConfig,
    LoraSettings,
    PolicyConfig,
    ReflectionConfig,
)
from reflectrl.config.training import (
    CRITIC_FREE,
    DIGEST_ESTIMATORS,
    TABLE_ESTIMATORS,
    AdvantageEstimator,
    CurriculumConfig,
    DataConfig,
    EvalConfig,
    PPOSettings,
    RLStage,
    RunConfig,
    SFTSettings,
    StageConfig,
    SuccessReplayConfig,
    TrackerName,
    WriterConfig,
)

__all__ = [
    "CRITIC_FREE",
    "DIGEST_ESTIMATORS",
    "MIN_REFLECTION_PROMPT_TOKENS",
    "RECIPES_DIR",
    "REFLECTION_MARGIN",
    "TABLE_ESTIMATORS",
    "AdvantageEstimator",
    "CurriculumConfig",
    "DataConfig",
    "EnvConfig",
    "EvalConfig",
    "LoraSettings",
    "PPOSettings",
    "PolicyConfig",
    "RLStage",
    "ReflectRLConfig",
    "ReflectionConfig",
    "RunConfig",
    "SFTSettings",
    "StageConfig",
    "Strict",
    "SuccessReplayConfig",
    "TrackerName",
    "WriterConfig",
    "add_config_arguments",
    "apply_override",
    "dump_config",
    "load_config",
    "machine_recipe",
    "parse_override",
]
from reflectrl.errors import ConfigError


class ReflectRLConfig(Strict):
    env: EnvConfig = Field(default_factory=EnvConfig)
    """The environment and its options."""
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    """The trainable policy model and how it is run."""
    reflection: ReflectionConfig = Field(default_factory=ReflectionConfig)
    """The frozen reflection model and its servers."""
    ppo: PPOSettings = Field(default_factory=PPOSettings)
    """PPO and the train batch."""
    curriculum: CurriculumConfig = Field(default_factory=CurriculumConfig)
    """The curriculum's stages and when the run moves on."""
    run: RunConfig = Field(default_factory=RunConfig)
    """Seed, iterations, checkpoints, Ray resources and fault handling."""
    data: DataConfig = Field(default_factory=DataConfig)
    """SFT data (`reflectrl data`)."""
    sft: SFTSettings = Field(default_factory=SFTSettings)
    """Warm-up SFT of both players (`reflectrl sft`)."""
    rl: RLStage = Field(default_factory=RLStage)
    """The RL stage: advantage estimator, group resets, success replay."""
    eval: EvalConfig = Field(default_factory=EvalConfig)
    """Held-out evaluation (`reflectrl eval`, and during RL)."""

    @model_validator(mode="after")
    def _check_advantage(self) -> ReflectRLConfig:
        if self.env.envs_per_worker % self.rl.group_size:
            raise ValueError(
                f"rl.group_size={self.rl.group_size} does not divide "
                f"env.envs_per_worker={self.env.envs_per_worker}; set a divisor of it"
            )
        if not self.rl.critic and self.ppo.batch_mode != "complete_episodes":
            raise ValueError(
                f"rl.advantage={self.rl.advantage} scores whole episodes, but "
                f"ppo.batch_mode={self.ppo.batch_mode} cuts them; set "
                "ppo.batch_mode=complete_episodes (or rl.advantage=gae)"
            )
        local_reflection = self.reflection.enabled and self.reflection.server == "local"
        if self.sft.enabled and not self.sft.policy and not local_reflection:
            raise ValueError(
                "sft.policy=false leaves the sft stage nothing to train (the reflection is off "
                "or served from a url); set sft.enabled=false for RL from scratch"
            )
        if self.rl.bootstrap_step_limit and self.rl.advantage != "state_table":
            raise ValueError(
                f"rl.bootstrap_step_limit=true bootstraps state_table's returns, but "
                f"rl.advantage={self.rl.advantage}; set rl.advantage=state_table or "
                "rl.bootstrap_step_limit=false"
            )
        if self.rl.advantage in TABLE_ESTIMATORS and self.run.num_learners > 1:
            raise ValueError(
                f"rl.advantage={self.rl.advantage} keeps its table in one learner, but "
                f"run.num_learners={self.run.num_learners}; set run.num_learners=0 or 1"
            )
        return self


def _format_validation_error(err: ValidationError, source: str) -> str:
    first = err.errors()[0]
    key = ".".join(str(p) for p in first["loc"]) or "(top level)"
    msg = first["msg"]
    if first["type"] == "extra_forbidden":
        msg = "unknown key"
    elif first["type"] == "value_error" and not first["loc"]:  # a check across sections
        return f"{source}: {first['ctx']['error']}"
    elif "input" in first and not isinstance(first["input"], dict | list):
        msg = f"{msg} (got {first['input']!r})"
    return f"{source}: {key}: {msg}"


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b.c=value` -> (["a", "b", "c"], value parsed as YAML: 3, true, [x, y], text)."""
    key, sep, raw = text.partition("=")
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"--set {text!r}: expected KEY=VALUE with a dotted key, e.g. ppo.lr=3e-4")
    try:
        value = yaml.safe_load(raw) if raw else ""
    except yaml.YAMLError:
        value = raw
    return key.split("."), value


def apply_override(tree: dict[str, Any], path: list[str], value: Any) -> None:
    node = tree
    for part in path[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"--set {'.'.join(path)}: {part!r} is not a section")
        node = child
    node[path[-1]] = value


def add_config_arguments(
    parser: argparse.ArgumentParser,
    example: str,
    config_help: str = "YAML config (default: the built-in defaults)",
) -> None:
    """`--config FILE` and repeatable `--set KEY=VALUE` (args.config, args.overrides)."""
    parser.add_argument("--config", help=config_help)
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"override a config value, e.g. --set {example} (repeatable)",
    )


def load_config(
    path: str | Path | None = None, overrides: list[str] | None = None
) -> ReflectRLConfig:
    """Read YAML (or start from the defaults), apply overrides, validate."""
    tree: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        source = str(path)
        file = Path(path)
        if not file.is_file():
            raise ConfigError(f"config file {file} does not exist; pass an existing YAML file")
        try:
            loaded = yaml.safe_load(file.read_text(encoding="utf-8"))
        except UnicodeDecodeError as err:
            raise ConfigError(
                f"{file}: byte {err.start} is not UTF-8 text; save the config as UTF-8 YAML"
            ) from None
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f" line {mark.line + 1}" if mark is not None else ""
            raise ConfigError(f"{file}:{where} invalid YAML; fix the syntax") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{file}: expected a mapping of sections (env, policy, ...)")
        tree = loaded or {}
    for text in overrides or []:
        key, value = parse_override(text)
        apply_override(tree, key, value)
        source = f"{source} + --set"
    try:
        return ReflectRLConfig.model_validate(tree)
    except ValidationError as err:
        raise ConfigError(_format_validation_error(err, source)) from None


def dump_config(config: ReflectRLConfig) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)


# The shipped recipes, next to the package in a source checkout (`pip install -e .`).
RECIPES_DIR = Path(__file__).resolve().parents[2] / "configs"


def machine_recipe() -> tuple[Path, str]:
    """(recipe file, the line that says why): `configs/gpu.yaml` where a CUDA device is visible,
    `configs/cpu.yaml` otherwise."""
    import torch

    cuda = torch.cuda.is_available()
    path = RECIPES_DIR / ("gpu.yaml" if cuda else "cpu.yaml")
    if not path.is_file():
        raise ConfigError(f"no --config given and the recipe {path} is missing; pass --config FILE")
    why = "a CUDA device is visible" if cuda else "no CUDA device is visible"
    return path, f"{why}: using the recipe {path} (pass --config FILE to choose another)"
