"""The pipeline's bookkeeping (no Ray): which stages run, resume, what RL and eval start from."""

from __future__ import annotations

from pathlib import Path

import pytest

from reflectrl.config import load_config
from reflectrl.errors import ConfigError
from reflectrl.evaluation.held_out import run_policy
from reflectrl.pipeline import mark_done
from reflectrl.run_dir import enabled_stages, rl_config, sft_players, stages_to_run

STAGES = ["data", "sft", "rl", "eval"]


def test_switches_choose_the_stages() -> None:
    assert enabled_stages(load_config()) == STAGES
    assert enabled_stages(load_config(None, ["sft.enabled=false"])) == ["rl", "eval"]
    assert enabled_stages(load_config(None, ["rl.enabled=false"])) == ["data", "sft", "eval"]
    off = ["sft.enabled=false", "rl.enabled=false", "eval.enabled=false"]
    with pytest.raises(ConfigError, match="nothing to run"):
        enabled_stages(load_config(None, off))


def test_resume_runs_the_first_unfinished_stage_and_everything_after(tmp_path: Path) -> None:
    config = load_config(None, ["run.iterations=5"])
    assert stages_to_run(config, tmp_path, STAGES) == STAGES
    mark_done(tmp_path, "data", {})
    mark_done(tmp_path, "sft", {})
    assert stages_to_run(config, tmp_path, STAGES) == ["rl", "eval"]
    mark_done(tmp_path, "rl", {"iterations": 5})
    mark_done(tmp_path, "eval", {})
    assert stages_to_run(config, tmp_path, STAGES) == []
    # More iterations asked for: RL continues, and its new policy is evaluated again.
    more = load_config(None, ["run.iterations=8"])
    assert stages_to_run(more, tmp_path, STAGES) == ["rl", "eval"]
    (tmp_path / "stages" / "sft.json").unlink()  # e.g. SFT crashed: everything after it reruns
    assert stages_to_run(config, tmp_path, STAGES) == ["sft", "rl", "eval"]


def test_rl_starts_from_this_runs_sft_outputs(tmp_path: Path) -> None:
    lora = rl_config(load_config(), tmp_path)
    assert lora.policy.init_adapter == str(tmp_path / "sft" / "policy")
    assert lora.reflection.adapter == str(tmp_path / "sft" / "reflection")
    assert lora.policy.model == "smollm2"
    full = rl_config(load_config(None, ["sft.method=full"]), tmp_path)
    assert full.policy.model == str(tmp_path / "sft" / "policy")
    assert full.reflection.model == str(tmp_path / "sft" / "reflection")
    assert full.policy.init_adapter is None and full.reflection.adapter is None
    scratch = load_config(None, ["sft.enabled=false"])
    assert rl_config(scratch, tmp_path) == scratch
    # A remote reflection server is the user's to train: only the policy is SFT'd.
    remote = ["reflection.server=url", "reflection.url=http://127.0.0.1:9/v1"]
    assert sft_players(load_config(None, remote)) == ["policy"]
    assert rl_config(load_config(None, remote), tmp_path).reflection.adapter is None
    assert sft_players(load_config(None, ["reflection.enabled=false"])) == ["policy"]


def test_rl_only_trains_the_reflection_and_starts_the_policy_from_its_base(tmp_path: Path) -> None:
    for method in ("lora", "full"):
        config = load_config(None, ["sft.policy=false", f"sft.method={method}"])
        assert sft_players(config) == ["reflection"]
        derived = rl_config(config, tmp_path)
        assert derived.policy.model == "smollm2" and derived.policy.init_adapter is None
        trained = derived.reflection.adapter or derived.reflection.model
        assert trained == str(tmp_path / "sft" / "reflection")
    # Nothing left to train: the error says what to set.
    with pytest.raises(ConfigError, match=r"sft\.policy=false leaves the sft stage nothing"):
        load_config(None, ["sft.policy=false", "reflection.enabled=false"])


def test_the_final_policy_of_a_run(tmp_path: Path) -> None:
    sft_only = load_config(None, ["rl.enabled=false"])
    with pytest.raises(ConfigError, match="no finished policy \\(stage sft has not finished\\)"):
        run_policy(tmp_path, sft_only)
    mark_done(tmp_path, "sft", {})
    config, source = run_policy(tmp_path, sft_only)
    assert source.sft_adapter == tmp_path / "sft" / "policy"
    assert config.reflection.adapter == str(tmp_path / "sft" / "reflection")
    with pytest.raises(ConfigError, match="stage rl has not finished"):
        run_policy(tmp_path, load_config())
    # An untrained policy is its base model, whatever the sft method.
    _, untrained = run_policy(tmp_path, load_config(None, ["rl.enabled=false", "sft.policy=false"]))
    assert untrained.sft_adapter is None
