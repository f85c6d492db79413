"""`reflectrl autoexplore-tasks | -check | -shell` through `python -m reflectrl.cli`, bad inputs
(one line, exit code 2), and the shipped config."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from reflectrl.envs.auto_explore import commands
from reflectrl.envs.auto_explore.sandbox import DEFAULT_MAX_READ_BYTES
from reflectrl.envs.auto_explore.shell import DEFAULT_MAX_ACTIONS, DEFAULT_MAX_OUTPUT_CHARS
from tests.test_auto_explore_env import build_repo
from tests.test_auto_explore_sandbox import CANARY, build_fenced

REPO = Path(__file__).resolve().parents[1]


def reflectrl(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "reflectrl.cli", *args],
        input=stdin,
        capture_output=True,
        timeout=300,
        env=env,
        cwd=REPO,
    )
    return subprocess.CompletedProcess(
        result.args,
        result.returncode,
        result.stdout.decode("utf-8", "replace"),
        result.stderr.decode("utf-8", "replace"),
    )


def assert_usage_error(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode == 2, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert "Traceback" not in result.stderr
    assert len(lines) == 1 and lines[0].startswith("reflectrl: error: "), result.stderr
    for needle in needles:
        assert needle in lines[0]


def test_tasks_then_check(tmp_path: Path) -> None:
    root = build_repo(tmp_path)
    out = tmp_path / "tasks.jsonl"
    args = ["autoexplore-tasks", "--root", str(root), "--out", str(out), "--seed", "3"]
    first = reflectrl(*args)
    assert first.returncode == 0, first.stderr
    assert f"wrote 9 tasks to {out}" in first.stdout
    content = out.read_bytes()
    assert reflectrl(*args).returncode == 0 and out.read_bytes() == content  # reproducible
    rows = [json.loads(line) for line in content.decode().splitlines()]
    assert all(set(r) >= {"id", "root", "question", "target", "depth", "split"} for r in rows)
    check = reflectrl("autoexplore-check", "--tasks", str(out))
    assert check.returncode == 0, check.stderr
    assert "tasks 9  success rate 1.000  mean length 3.00" in check.stdout


def test_default_roots_with_max_tasks(tmp_path: Path) -> None:
    out = tmp_path / "default.jsonl"
    made = reflectrl("autoexplore-tasks", "--out", str(out), "--seed", "0", "--max-tasks", "40")
    assert made.returncode == 0, made.stderr
    roots = {json.loads(line)["root"] for line in out.read_text().splitlines()}
    assert roots <= {"pkg:gymnasium", "pkg:peft", "pkg:pydantic", "pkg:trl"} and len(roots) > 1
    check = reflectrl("autoexplore-check", "--tasks", str(out))
    assert check.returncode == 0 and "tasks 40  success rate 1.000" in check.stdout


def test_bad_inputs_are_one_line_errors(tmp_path: Path) -> None:
    out = str(tmp_path / "t.jsonl")
    assert_usage_error(
        reflectrl("autoexplore-tasks", "--root", "/nonexistent/tree", "--out", out),
        "root /nonexistent/tree: does not exist",
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_usage_error(
        reflectrl("autoexplore-tasks", "--root", str(empty), "--out", out),
        "no files of the allowed types",
    )
    assert_usage_error(
        reflectrl("autoexplore-tasks", "--root", "pkg:no_such_pkg_qq", "--out", out),
        "no installed package",
    )
    assert_usage_error(
        reflectrl("autoexplore-tasks", "--root", str(empty), "--out", out, "--max-tasks", "0"),
        "--max-tasks 0",
    )
    assert not Path(out).exists()
    assert_usage_error(reflectrl("autoexplore-check", "--tasks", out), "does not exist")
    assert_usage_error(
        reflectrl("autoexplore-shell", "--root", str(empty / "no")), "does not exist"
    )


def test_check_refuses_a_tasks_file_with_a_missing_target(tmp_path: Path) -> None:
    root = build_repo(tmp_path)
    out = tmp_path / "tasks.jsonl"
    assert reflectrl("autoexplore-tasks", "--root", str(root), "--out", str(out)).returncode == 0
    (root / "pkg" / "sub" / "deep.py").unlink()
    assert_usage_error(
        reflectrl("autoexplore-check", "--tasks", str(out)),
        "target pkg/sub/deep.py is not a reachable file",
    )
    out.write_text(out.read_text() + "{broken\n")
    assert_usage_error(reflectrl("autoexplore-check", "--tasks", str(out)), "not JSON")


def test_shell_reads_commands_until_exit(tmp_path: Path) -> None:
    fenced = build_fenced(tmp_path)
    script = (
        b"cat ok.py\n"
        b"cd sub\n"
        b"cat ../../zone_out/leak.txt\n"
        b"cat link_up\n"
        b"cat \xff\xfe.py\n"
        b"\n"
        b"cat inner.py\n"
        b"id inner.py\n"
        b"exit\n"
        b"cd ..\n"
    )
    result = reflectrl("autoexplore-shell", "--root", str(fenced.root), stdin=script)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "sub/\nbig.py\nbinary.txt" in out  # the root listing first
    assert "Defines: class Fine" in out
    assert "Changed directory to sub.\ninner.py" in out  # the listing after a cd
    assert out.count("error: ") == 3
    assert "def inner_fn" in out and "You identified sub/inner.py." in out
    assert "Changed directory to ." not in out  # nothing after `exit`
    for marker in (CANARY, "zone_out", "leak"):
        assert marker not in out
    eof = reflectrl("autoexplore-shell", "--root", str(fenced.root), stdin=b"cd sub")
    assert eof.returncode == 0 and "Changed directory to sub." in eof.stdout


def test_command_defaults_match_the_env() -> None:
    assert commands.MAX_ACTIONS == DEFAULT_MAX_ACTIONS
    assert commands.MAX_OUTPUT_CHARS == DEFAULT_MAX_OUTPUT_CHARS
    assert commands.MAX_READ_BYTES == DEFAULT_MAX_READ_BYTES


def test_config_loads_and_its_labels_are_single_tokens(tokenizer: object) -> None:
    from reflectrl.config import load_config
    from reflectrl.text import prompts
    from reflectrl.text.tokens import label_token_ids

    config = load_config(REPO / "configs" / "auto_explore.yaml")
    options = config.env.options
    assert config.env.name == "auto_explore" and Path(options["tasks"]).is_absolute()
    assert options["max_actions"] <= len(config.policy.labels)
    assert [s.name for s in config.curriculum.stages] == ["depth1", "depth2", "all"]
    labels = config.policy.labels
    assert len(label_token_ids(tokenizer, labels, prompts.ACTION_MARKER)) == len(labels)


@pytest.mark.parametrize("flag", ["--max-actions", "--max-output-chars"])
def test_bad_settings(tmp_path: Path, flag: str) -> None:
    out = str(tmp_path / "t.jsonl")
    assert_usage_error(reflectrl("autoexplore-tasks", "--out", out, flag, "1"), flag)
