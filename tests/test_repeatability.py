"""Seeded runs repeat bitwise on one machine: SFT of both players, and a whole short run (data ->
SFT -> RL with the reflection server -> eval). What does not repeat across machines, and how
far it drifts: docs/repeatability.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from reflectrl.config import load_config
from tests.helpers import cli_env

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


# data -> SFT -> RL (reflections from the served SFT adapter) -> eval, as short as it goes.
SHORT_RUN = [
    "--workers", "2", "--config", str(SMOKE), "--iterations", "1",
    "--set", "data.episodes=4", "--set", "sft.max_steps=4", "--set", "eval.episodes=2",
]  # fmt: skip


def without_timings(row: dict[str, Any]) -> dict[str, Any]:
    """A metrics row less its seconds (`iteration_s`, `env_steps_per_s`, ...)."""
    return {k: v for k, v in row.items() if not k.endswith("_s")}


@pytest.mark.integration
def test_a_seeded_short_run_repeats_bitwise_beside_its_twin(tmp_path: Path) -> None:
    """Two launches of one config side by side (each loads the other's cores): the data, both
    SFT adapters, the RL adapter and value head, every non-timing metric and the eval JSON
    are equal byte for byte."""
    runs = [tmp_path / "a", tmp_path / "b"]
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "reflectrl.cli", "launch", *SHORT_RUN, "--output", str(run)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env=cli_env(),
        )
        for run in runs
    ]
    for process in processes:
        _, stderr = process.communicate(timeout=1200)
        assert process.returncode == 0, stderr[-3000:]
    a, b = runs
    same = ["data/data.jsonl", "eval_test.json"]
    same += [f"sft/{player}/adapter_model.safetensors" for player in PLAYERS]
    checkpoint = Path("checkpoints") / (a / "checkpoints" / "latest").read_text().strip()
    assert (b / "checkpoints" / "latest").read_text().strip() == checkpoint.name
    same += [str(checkpoint / "adapter" / name) for name in ("adapter_model.safetensors",
                                                              "value_head.pt")]  # fmt: skip
    for name in same:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    rows = [[json.loads(line) for line in (r / "metrics.jsonl").read_text().splitlines()]
            for r in runs]  # fmt: skip
    assert [without_timings(r) for r in rows[0]] == [without_timings(r) for r in rows[1]]
    assert rows[0][-1]["reflection_calls"] > 0  # the reflections were the server's


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
