"""Seeded runs repeat bitwise on one machine: SFT of both players here; a whole short run (data ->
SFT -> RL with the reflection server -> eval) beside its twin in tests/test_launch_e2e.py. What
does not repeat across machines, and how far it drifts: docs/repeatability.md."""

from __future__ import annotations

import json
from pathlib import Path

from reflectrl.config import load_config

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "configs" / "smoke.yaml"
PLAYERS = ("reflection", "policy")


def adapter_bytes(folder: Path) -> bytes:
    return (folder / "adapter_model.safetensors").read_bytes()


def test_a_seeded_sft_gives_bitwise_identical_adapters_twice(tmp_path: Path) -> None:
    from reflectrl.data.dataset import write_dataset
    from reflectrl.sft.trainer import train_player

    config = load_config(SMOKE, ["sft.max_steps=6", "data.episodes=6"])
    write_dataset(config, tmp_path / "data", seed=0, progress=False)
    for out in ("a", "b"):
        for player in PLAYERS:
            train_player(config, tmp_path / "data", player, tmp_path / out, progress=False)
    other = load_config(SMOKE, ["sft.max_steps=6", "data.episodes=6", "run.seed=1"])
    train_player(other, tmp_path / "data", "policy", tmp_path / "seed1", progress=False)
    for player in PLAYERS:
        first, second = tmp_path / "a" / player, tmp_path / "b" / player
        assert adapter_bytes(first) == adapter_bytes(second), player
        result_a = json.loads((first / "sft_result.json").read_text())
        result_b = json.loads((second / "sft_result.json").read_text())
        assert result_a["loss_after"] == result_b["loss_after"], player
    # The seed is what fixes them: another run.seed trains another adapter.
    assert adapter_bytes(tmp_path / "seed1" / "policy") != adapter_bytes(tmp_path / "a" / "policy")


def test_each_launch_records_its_software_and_cpu_and_a_change_is_named(tmp_path: Path) -> None:
    import torch

    from reflectrl.provenance import LAUNCHES_FILE, differences, record_launch

    assert record_launch(tmp_path) == []  # the first launch: nothing to compare with
    assert record_launch(tmp_path) == []  # the same machine and software
    (first, second) = json.loads((tmp_path / LAUNCHES_FILE).read_text())
    assert first["packages"]["torch"] == torch.__version__
    assert first["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert first["torch_threads"] == torch.get_num_threads() and first["cpu_count"] >= 1
    assert {k: v for k, v in second.items() if k != "started"} == {
        k: v for k, v in first.items() if k != "started"
    }
    moved = {**second, "packages": {**second["packages"], "trl": "9.9"}, "cpu_capability": "X"}
    assert differences(first, moved) == [
        f"trl {first['packages'].get('trl', '-')} -> 9.9",
        f"cpu_capability {first['cpu_capability']} -> X",
    ]
