"""AutoExplore and ALFWorld end to end through the CLI, smoke-sized: real Ray, RLlib, a real
vLLM reflection server and (for ALFWorld) the real alfworld engine. A few expert episodes, a
few SFT steps of both players, one RL iteration, then the held-out evaluation. Both run the
text action head (`policy.action_head=text`): the label head's path is the one every other
end-to-end test takes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from reflectrl.envs.alfworld.tasks import TASK_TYPES
from tests.helpers import run_cli

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.integration

# Tiny players (the SmolLM2 tokenizer, random weights), 1 worker x 2 envs x 8 steps (two
# workers: tests/test_launch_e2e.py).
SMOKE = [
    "policy.model=tiny",
    "reflection.model=tiny",
    "reflection.max_tokens=16",
    "env.envs_per_worker=2",
    "ppo.rollout_fragment_length=8",
    "ppo.minibatch_size=16",
    "data.episodes=6",
    "sft.max_steps=3",
    "sft.reflection_max_steps=3",
    "sft.batch_size=2",  # rows of ~1k tokens over a 49k-id head
    "sft.eval_steps=3",
    "eval.episodes=2",
    "run.checkpoint_every=1",
    "policy.action_head=text",
]


def launch(config: str, run: Path, overrides: list[str]) -> tuple[str, dict[str, Any]]:
    args = ["launch", "--workers", "1", "--config", str(REPO / "configs" / config)]
    args += ["--iterations", "1", "--output", str(run)]
    for override in [*SMOKE, *overrides]:
        args += ["--set", override]
    result = run_cli(*args, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    for stage in ("data", "sft", "rl", "eval"):
        assert json.loads((run / "stages" / f"{stage}.json").read_text())["stage"] == stage
    (row,) = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert row["env_steps"] >= 2 * 8 and row["reflection_calls"] > 0 and row["updated"]
    return result.stdout, row


def test_auto_explore_smoke_pipeline_evaluates_test_files_and_unseen_trees(
    tmp_path: Path,
) -> None:
    run = tmp_path / "run"
    tasks = tmp_path / "tasks.jsonl"
    overrides = [
        f"env.options.tasks={tasks}",
        "env.options.roots=[pkg:pydantic]",
        "env.options.unseen_roots=[pkg:httpx]",
        "eval.stages=[depth2]",
        "eval.extra_splits=[unseen]",
    ]
    _, row = launch("auto_explore.yaml", run, overrides)
    assert row["stage"] == "depth1"
    stats = json.loads((run / "data" / "stats.json").read_text())
    assert stats["expert"] == "observable" and stats["episodes"] == 6
    roots = ("test", "unseen")
    for split in roots:
        report = json.loads((run / f"eval_{split}.json").read_text())
        assert report["split"] == split and report["greedy"]["all"]["episodes"] == 2
        # A row per target depth: the depth2 stage plays targets at most one folder down.
        assert report["greedy"]["kinds"] and set(report["greedy"]["kinds"]) <= {"depth1", "depth2"}
    # The held-out starts are the split's own tasks: test files of pydantic, all of httpx.
    by_split = {}
    for line in tasks.read_text().splitlines():
        task = json.loads(line)
        by_split.setdefault(task["split"], set()).add(task["root"])
    assert by_split == {
        "train": {"pkg:pydantic"},
        "test": {"pkg:pydantic"},
        "unseen": {"pkg:httpx"},
    }
    done = json.loads((run / "stages" / "eval.json").read_text())
    assert done["file"] == "eval_test.json"
    assert done["extra_splits"]["unseen"]["file"] == "eval_unseen.json"


def test_alfworld_smoke_pipeline_generates_games_and_evaluates_unseen_floor_plans(
    tmp_path: Path,
) -> None:
    run = tmp_path / "run"
    games = tmp_path / "games"
    overrides = [
        f"env.options.data_dir={games}",
        "env.options.generate_games=8",  # 6 train, 1 valid_seen, 1 valid_unseen
        "env.options.max_steps=6",
        "reflection.max_model_len=2048",
        "data.episodes=4",
        "eval.every=0",
    ]
    stdout, row = launch("alfworld_cpu.yaml", run, overrides)
    assert "alfworld: generating 8 verified games" in stdout
    assert sorted(p.name for p in games.iterdir()) == ["train", "valid_seen", "valid_unseen"]
    assert row["stage"] == "walkthrough_le_6"
    stats = json.loads((run / "data" / "stats.json").read_text())
    assert stats["expert"] == "observable" and stats["episodes"] == 4
    report = json.loads((run / "eval_valid_unseen.json").read_text())
    assert report["split"] == "valid_unseen" and report["greedy"]["all"]["episodes"] == 1
    assert set(report["greedy"]["kinds"]) <= set(TASK_TYPES)
