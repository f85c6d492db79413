"""SFT data on DangerousTaxi: expert labels, negatives, RL's own prompts, no held-out starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from reflectrl.config import load_config
from reflectrl.data.dataset import write_dataset
from reflectrl.envs.taxi import start_states
from tests.helpers import check_dataset

REPO = Path(__file__).resolve().parents[1]
TINY = ["policy.model=tiny", "reflection.model=tiny"]


@pytest.fixture(scope="module")
def taxi_data(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, Path]:
    config = load_config(None, [*TINY, "data.negative_rate=0.3"])
    out = tmp_path_factory.mktemp("taxi") / "data"
    write_dataset(config, out, episodes=45, seed=3, progress=False)
    return config, out


def test_taxi_rows_are_expert_labels_with_negatives_and_rl_prompts(taxi_data: tuple) -> None:
    config, out = taxi_data
    rows = check_dataset(config, out, rate_bounds=(0.15, 0.35))
    stats = json.loads((out / "stats.json").read_text())
    assert {r["stage"] for r in rows} == {"pickup", "dropoff", "full"}  # every stage
    assert stats["rows_sft"] == stats["rows_sft_policy"] == stats["steps"] > 100
    assert stats["eval_episodes"] == round(45 * config.data.eval_fraction)
    assert {r["split"] for r in rows} == {"train", "eval"}
    assert stats["lengths"]["reflection_tokens"]["max"] <= config.reflection.max_tokens
    negatives = [r["completion"] for r in rows if r["negative"] and r["target"] == "sft_reflection"]
    assert negatives and all("away from" in text for text in negatives)  # names the mistake
    assert stats["wrong_hint_steps"] == 0 and not any(r["wrong_hint"] for r in rows)  # default


def test_no_held_out_start_state_enters_the_data(taxi_data: tuple) -> None:
    config, out = taxi_data
    rows = [json.loads(line) for line in (out / "data.jsonl").read_text().splitlines()]
    options = config.env.options
    held_out = set(start_states("test", options["test_fraction"], options["split_seed"]))
    starts = {int(r["task"]) for r in rows if r["step"] == 0 and r["stage"] != "dropoff"}
    assert starts and not starts & held_out


def test_wrong_hints_quote_a_mistake_and_keep_the_experts_label(tmp_path: Path) -> None:
    import re

    config = load_config(None, [*TINY, "data.wrong_hint_rate=0.4"])
    stats = write_dataset(config, tmp_path / "w", episodes=12, seed=2, progress=False)
    rows = check_dataset(config, tmp_path / "w", rate_bounds=(0.05, 0.4))  # prompts as RL's
    steps: dict[tuple[int, int], dict[str, dict]] = {}
    for r in rows:
        steps.setdefault((r["episode"], r["step"]), {})[r["target"]] = r
    misled = [s for s in steps.values() if s["sft_policy"]["wrong_hint"]]
    assert stats["wrong_hint_steps"] == len(misled)
    assert 0.2 < len(misled) / len(steps) < 0.6, (len(misled), len(steps))
    for step in steps.values():
        policy, reflection = step["sft_policy"], step["sft_reflection"]
        assert policy["completion"] == step["sft"]["completion"]  # always the expert's label
        assert policy["prompt"].startswith(reflection["prompt"])
        quoted = re.findall(r'"([^"]+)"', policy["prompt"][len(reflection["prompt"]) :])[-1]
        # The reflection model still learns the right hint; only the policy's row is misled.
        assert re.findall(r'"([^"]+)"', reflection["completion"])[-1] == policy["expert_action"]
        assert (quoted != policy["expert_action"]) == policy["wrong_hint"]


def test_reflections_vary_and_the_data_is_seeded(tmp_path: Path) -> None:
    config = load_config(None, TINY)
    first = write_dataset(config, tmp_path / "a", episodes=6, seed=1, progress=False)
    write_dataset(config, tmp_path / "b", episodes=6, seed=1, progress=False)
    assert (tmp_path / "a" / "data.jsonl").read_text() == (
        tmp_path / "b" / "data.jsonl"
    ).read_text()
    rows = [json.loads(x) for x in (tmp_path / "a" / "data.jsonl").read_text().splitlines()]
    texts = [r["completion"] for r in rows if r["target"] == "sft_reflection" and r["step"] > 0]
    openings = {text.split('"')[0] for text in texts}
    assert len(openings) >= 3 and first["steps"] == len(texts) + 6  # seeded templates vary


def test_api_writer_words_the_reflections(server: object, tmp_path: Path) -> None:
    server.chat_text = "The last move helped; go on."  # type: ignore[attr-defined]
    config = load_config(
        None,
        [*TINY, f"data.writer.url={server.url}", "data.writer.model=writer"],  # type: ignore[attr-defined]
    )
    write_dataset(config, tmp_path / "d", episodes=2, seed=0, progress=False)
    rows = [json.loads(x) for x in (tmp_path / "d" / "data.jsonl").read_text().splitlines()]
    reflections = {r["completion"] for r in rows if r["target"] == "sft_reflection"}
    assert reflections == {"The last move helped; go on."}
    asked = [r for r in server.requests if r["path"] == "/v1/chat/completions"]  # type: ignore[attr-defined]
    assert asked and "The best next action is" in asked[0]["body"]["messages"][0]["content"]


def reflectrl(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "reflectrl.cli", *args],
        capture_output=True, text=True, timeout=300, env=env, cwd=REPO,
    )  # fmt: skip


def test_cli_writes_data_and_refuses_bad_input(tmp_path: Path) -> None:
    out = tmp_path / "data"
    tiny = [x for pair in (("--set", s) for s in TINY) for x in pair]
    result = reflectrl("data", "--out", str(out), "--episodes", "3", *tiny)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "wrote" in result.stdout and (out / "stats.json").is_file()
    before = (out / "data.jsonl").read_bytes()
    for args, needle in [
        (["--out", str(out), "--episodes", "3", *tiny], "already holds data.jsonl"),
        (["--out", str(tmp_path / "x"), "--episodes", "0", *tiny], "--episodes 0"),
        (
            ["--out", str(tmp_path / "y"), *tiny, "--set", "data.writer.url=http://127.0.0.1:9/v1"],
            "data.writer.url http://127.0.0.1:9/v1 does not answer",
        ),
    ]:
        bad = reflectrl("data", *args)
        assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr[-2000:]
        assert needle in bad.stderr.strip().splitlines()[-1]
    assert (out / "data.jsonl").read_bytes() == before  # nothing written is touched
