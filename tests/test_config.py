from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from reflectrl.config import ReflectRLConfig, dump_config, load_config, parse_override
from reflectrl.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]


def leaves(tree: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def test_gpu_yaml_is_the_defaults_placed_on_a_gpu() -> None:
    """The built-in defaults run on CPUs; gpu.yaml spells them out and moves the three parts
    (reflection server, learner, rollout scoring) onto the GPU, nothing else."""
    from_file = leaves(load_config(REPO / "configs" / "gpu.yaml").model_dump(mode="json"))
    defaults = leaves(ReflectRLConfig().model_dump(mode="json"))
    differ = {key for key in defaults if from_file[key] != defaults[key]}
    assert differ == {
        "policy.dtype",
        "reflection.device",
        "reflection.num_gpus",
        "run.num_gpus_per_learner",
        "run.num_gpus_per_worker",
    }
    assert defaults["reflection.device"] == "cpu" and from_file["reflection.device"] == "cuda"


def test_every_shipped_config_loads() -> None:
    for path in (REPO / "configs").glob("*.yaml"):
        load_config(path)


def test_dump_round_trips(tmp_path: Path) -> None:
    config = load_config(REPO / "configs" / "smoke.yaml", ["ppo.lr=0.5"])
    path = tmp_path / "c.yaml"
    path.write_text(dump_config(config))
    assert load_config(path) == config


def test_overrides_parse_yaml_values() -> None:
    config = load_config(
        None,
        ["ppo.lr=3e-4", "reflection.enabled=false", "policy.lora.target_modules=[q_proj]"],
    )
    assert config.ppo.lr == pytest.approx(3e-4)
    assert config.reflection.enabled is False
    assert config.policy.lora.target_modules == ["q_proj"]
    assert parse_override("env.name=dangerous_taxi") == (["env", "name"], "dangerous_taxi")


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["ppo.bogus=1"], "ppo.bogus: unknown key"),
        (["ppo.lr=abc"], "ppo.lr"),
        (["ppo.lr=-1"], "ppo.lr"),
        (["env.options.max_stepz=3"], "env.options.max_stepz"),
        (["env.name=nope"], "unknown env 'nope'"),
        (["reflection.server=url"], "reflection.url is not set"),
        (["reflection.max_tokens=100000"], "reflection.max_tokens=100000 leaves -98984 tokens"),
        (["novalue"], "KEY=VALUE"),
        (["ppo.lr=1", "ppo.lr.x=1"], "not a section"),
        (["rl.advantage=ppo2"], "rl.advantage: Input should be 'gae', 'reinforce'"),
        (["rl.step_advantage_weight=-1"], "rl.step_advantage_weight"),
        (["rl.advantage=grpo"], "set ppo.batch_mode=complete_episodes"),
        (["rl.group_size=0"], "rl.group_size"),
        (["rl.group_size=3"], "rl.group_size=3 does not divide env.envs_per_worker=4"),
        (["rl.success_replay.episodes=-1"], "rl.success_replay.episodes"),
        (
            ["rl.advantage=state_table", "ppo.batch_mode=complete_episodes", "run.num_learners=2"],
            "set run.num_learners=0 or 1",
        ),
        (
            ["rl.advantage=state_model", "ppo.batch_mode=complete_episodes", "run.num_learners=2"],
            "rl.advantage=state_model keeps its table in one learner",
        ),
    ],
)
def test_bad_values_name_the_key(overrides: list[str], needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    message = str(err.value)
    assert needle in message and "\n" not in message


def test_bad_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("env: [unclosed\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(broken)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("3\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(scalar)
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes("run:\n  seed: 1  # d\u00e9j\u00e0\n".encode("latin-1"))
    with pytest.raises(ConfigError, match="byte 19 is not UTF-8 text"):
        load_config(latin1)
    typo = tmp_path / "typo.yaml"
    typo.write_text(yaml.safe_dump({"polcy": {"model": "tiny"}}))
    with pytest.raises(ConfigError, match="polcy: unknown key"):
        load_config(typo)


def test_batch_is_one_sampling_round_unless_a_multiple_is_set() -> None:
    config = load_config(None)
    assert config.ppo.train_batch_size is None and config.ppo.rollout_fragment_length >= 16
    assert config.ppo.batch_size(workers=2, envs_per_worker=4) == 2 * 4 * 16
    assert config.ppo.batch_size(workers=16, envs_per_worker=4) == 16 * 4 * 16
    doubled = load_config(None, ["ppo.train_batch_size=256"])
    assert doubled.ppo.batch_size(workers=2, envs_per_worker=4) == 256
    with pytest.raises(ConfigError, match=r"ppo.train_batch_size=128 .* 16 workers"):
        load_config(None, ["ppo.train_batch_size=128"]).ppo.batch_size(16, 4)
