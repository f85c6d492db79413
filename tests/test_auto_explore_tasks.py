"""AutoExplore task generator and tasks file: determinism, the split by file, unique and
answerable questions, bad inputs, and the optional question writer (against a fake server)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from reflectrl.envs.auto_explore.env import AutoExploreEnv, AutoExploreOptions
from reflectrl.envs.auto_explore.expert import run_expert_episode
from reflectrl.envs.auto_explore.render import render_file
from reflectrl.envs.auto_explore.sandbox import Sandbox
from reflectrl.envs.auto_explore.tasks import (
    GenerationSettings,
    Task,
    generate_tasks,
    load_tasks,
    write_tasks,
)
from reflectrl.envs.auto_explore.writer import rewrite_questions
from reflectrl.errors import ConfigError
from tests.test_auto_explore_env import build_repo


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return build_repo(tmp_path)


def by_target(tasks: list[Task]) -> dict[str, Task]:
    return {t.target: t for t in tasks}


def test_questions_are_unique_answerable_and_of_every_kind(repo: Path) -> None:
    tasks = by_target(generate_tasks([str(repo)], seed=0))
    assert set(tasks) == {
        "README.md",
        "setup.cfg",
        "core.py",
        "pkg/models.py",
        "pkg/utils.py",
        "pkg/sub/deep.py",
        "pkg/sub/notes.md",
        "docs/guide.md",
        "lonely/only/alone.py",
    }
    assert tasks["pkg/models.py"].question == "Which file defines the class `Model`?"
    # `fit` is defined in two files (a method and a function): never asked about.
    assert tasks["pkg/utils.py"].key == "helper_function"
    assert tasks["pkg/utils.py"].question == "Which file defines the function `helper_function`?"
    # "Installation" is a heading of two files: each file is asked about its unique one.
    assert tasks["README.md"].key == "Demo project" and tasks["docs/guide.md"].key == "User guide"
    assert tasks["pkg/sub/notes.md"].question == 'Which file has a section titled "Deep notes"?'
    assert tasks["setup.cfg"].kind in ("config_key", "config_section")
    assert tasks["core.py"].key in ("Engine", "start_engine")
    assert {t.depth for t in tasks.values()} == {1, 2, 3}
    sandbox = Sandbox(repo)
    for task in tasks.values():
        assert task.root == str(repo.resolve()) and task.depth == len(task.parts)
        shown = render_file(task.parts[-1], sandbox.read(task.parts), 800).text
        assert task.key in shown  # answerable by reading the target


def test_generation_is_deterministic_and_seeded(tmp_path: Path, repo: Path) -> None:
    settings = GenerationSettings(test_fraction=0.5)
    first = tmp_path / "a.jsonl"
    second = tmp_path / "b.jsonl"
    write_tasks(generate_tasks([str(repo)], seed=7, settings=settings), first)
    write_tasks(generate_tasks([str(repo)], seed=7, settings=settings), second)
    assert first.read_bytes() == second.read_bytes()
    splits = {
        seed: tuple(t.split for t in generate_tasks([str(repo)], seed, settings=settings))
        for seed in range(6)
    }
    assert len(set(splits.values())) > 1  # the seed moves files between splits


def test_split_is_by_file_and_stable_when_roots_are_added(tmp_path: Path, repo: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    for i in range(40):
        (other / f"mod{i:02d}.py").write_text(f"class Other{i:02d}: ...\n")
    settings = GenerationSettings(test_fraction=0.3)
    alone = generate_tasks([str(other)], seed=1, settings=settings)
    both = generate_tasks([str(repo), str(other)], seed=1, settings=settings)
    assert [t for t in both if t.root == str(other.resolve())] == alone
    files = [(t.root, t.target) for t in both]
    assert len(files) == len(set(files))  # one split per file: no target in two splits
    test_share = sum(t.split == "test" for t in alone) / len(alone)
    assert 0.1 < test_share < 0.5
    assert {t.split for t in generate_tasks([str(other)], 1)} <= {"train", "test"}
    none = GenerationSettings(test_fraction=0.0)
    assert {t.split for t in generate_tasks([str(other)], 1, settings=none)} == {"train"}


def test_unseen_roots_are_held_out_whole_and_move_no_training_task(
    tmp_path: Path, repo: Path
) -> None:
    other = tmp_path / "other"
    (other / "sub").mkdir(parents=True)
    for i in range(6):
        (other / "sub" / f"mod{i}.py").write_text(f"class Unseen{i}: ...\n")
    alone = generate_tasks([str(repo)], seed=2)
    with_unseen = generate_tasks([str(repo)], seed=2, unseen_roots=[str(other)])
    assert with_unseen[: len(alone)] == alone  # the training roots' tasks and splits unchanged
    unseen = with_unseen[len(alone) :]
    assert len(unseen) == 6 and {t.split for t in unseen} == {"unseen"}
    assert {t.root for t in unseen} == {str(other.resolve())} and {t.depth for t in unseen} == {2}
    with pytest.raises(ConfigError, match="both a training root and an unseen root"):
        generate_tasks([str(repo)], seed=2, unseen_roots=[str(repo)])
    path = tmp_path / "tasks.jsonl"
    write_tasks(with_unseen, path)
    env = AutoExploreEnv(AutoExploreOptions(tasks=str(path), split="unseen"))
    assert {t.id for t in env.tasks} == {t.id for t in unseen}
    env.reset(seed=0)
    assert env.episode_kind == "depth2"  # held-out reports have a row per depth


def test_max_tasks_keeps_a_seeded_subset(repo: Path) -> None:
    every = generate_tasks([str(repo)], seed=0)
    some = generate_tasks([str(repo)], seed=0, max_tasks=4)
    assert len(some) == 4 and all(t in every for t in some)
    assert some == generate_tasks([str(repo)], seed=0, max_tasks=4)
    assert [t.target for t in some] == sorted(
        (t.target for t in some), key=[t.target for t in every].index
    )


def test_unanswerable_files_are_skipped(tmp_path: Path) -> None:
    root = tmp_path / "r"
    root.mkdir()
    (root / "broken.py").write_text("class Broken(:\n")  # a syntax error: names still count
    (root / "dup.py").write_text("class Broken: ...\n")
    (root / "private.py").write_text("def _hidden(): ...\nx = 1\n")
    # A definition nested in a try/else block elsewhere makes a top-level name ambiguous.
    (root / "guarded.py").write_text("class Guarded: ...\n")
    (root / "compat.py").write_text(
        "try:\n    import x\nexcept ImportError:\n    pass\nelse:\n"
        "    if x:\n        class Guarded: ...\n"
    )
    (root / "long.py").write_text("x = 1\n" * 400 + "class LateClass: ...\n")
    (root / "wide.py").write_text("".join(f"def function_{i:03d}(): ...\n" for i in range(300)))
    tasks = by_target(generate_tasks([str(root)], seed=0))
    assert "broken.py" not in tasks and "dup.py" not in tasks and "private.py" not in tasks
    assert "guarded.py" not in tasks and "compat.py" not in tasks
    assert tasks["long.py"].key == "LateClass"  # the outline shows it, however long the file
    assert int(tasks["wide.py"].key.split("_")[1]) < 60  # only definitions the output shows


def test_bad_roots(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        generate_tasks([str(tmp_path / "missing")], seed=0)
    empty = tmp_path / "empty"
    (empty / "sub").mkdir(parents=True)
    (empty / "image.png").write_bytes(b"\x89PNG")
    with pytest.raises(ConfigError, match="no files of the allowed types"):
        generate_tasks([str(empty)], seed=0)
    (empty / "plain.py").write_text("x = 1\n")
    with pytest.raises(ConfigError, match="no answerable questions"):
        generate_tasks([str(empty)], seed=0)
    with pytest.raises(ConfigError):
        generate_tasks([], seed=0)


def test_package_roots_are_recorded_portably_and_solved_by_the_expert(tmp_path: Path) -> None:
    tasks = generate_tasks(["pkg:gymnasium"], seed=0, max_tasks=25)
    assert len(tasks) == 25 and {t.root for t in tasks} == {"pkg:gymnasium"}
    path = tmp_path / "gym.jsonl"
    write_tasks(tasks, path)
    env = AutoExploreEnv(AutoExploreOptions(tasks=str(path), split="all"))
    for task in env.tasks:
        info, _ = run_expert_episode(env, task.id)
        assert info["success"]


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ("{not json", "line 2: not JSON"),
        ('{"id": "x"}', "line 2: root: Field required"),
        (
            '{"id":"x","root":"/r","question":"q","target":"/etc/passwd","depth":2,"split":"train"}',
            "not a relative path",
        ),
        (
            '{"id":"x","root":"/r","question":"q","target":"../x.py","depth":2,"split":"train"}',
            "not a relative path",
        ),
        (
            '{"id":"x","root":"/r","question":"q","target":"a.py","depth":1,"split":"dev"}',
            "split",
        ),
        (
            '{"id":"t1","root":"/r","question":"q","target":"a.py","depth":1,"split":"test"}',
            "repeated",
        ),
    ],
)
def test_bad_tasks_files(tmp_path: Path, line: str, needle: str) -> None:
    path = tmp_path / "t.jsonl"
    good = '{"id":"t1","root":"/r","question":"q","target":"a.py","depth":1,"split":"train"}'
    path.write_text(good + "\n" + line + "\n")
    with pytest.raises(ConfigError, match=needle):
        load_tasks(path)


def test_missing_or_empty_tasks_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_tasks(tmp_path / "none.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ConfigError, match="no tasks"):
        load_tasks(tmp_path / "empty.jsonl")


def test_written_tasks_round_trip(tmp_path: Path, repo: Path) -> None:
    tasks = generate_tasks([str(repo)], seed=0)
    path = tmp_path / "deep" / "t.jsonl"
    write_tasks(tasks, path)
    assert load_tasks(path) == tasks
    first = json.loads(path.read_text().splitlines()[0])
    assert list(first)[:6] == ["id", "root", "question", "target", "depth", "split"]
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


# --- the optional question writer ---------------------------------------------------------


@pytest.fixture
def fake_llm() -> Iterator[dict[str, Any]]:
    state: dict[str, Any] = {"prompts": []}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            prompts = body["prompt"]
            state["prompts"].extend(prompts)
            choices = []
            for i, prompt in enumerate(prompts):
                key = prompt.split("Keep ")[1].split(" exactly")[0].strip('`"')
                # Every other answer drops the key: the writer must keep the template then.
                text = f" Where is {key} defined?" if i % 2 == 0 else " Where is it?"
                choices.append({"index": i, "text": text})
            data = json.dumps({"choices": choices, "usage": {}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    state["url"] = f"http://127.0.0.1:{server.server_address[1]}/v1"
    yield state
    server.shutdown()
    server.server_close()


def test_writer_rephrases_but_keeps_the_key(repo: Path, fake_llm: dict[str, Any]) -> None:
    tasks = generate_tasks([str(repo)], seed=0)
    rewritten = rewrite_questions(tasks, fake_llm["url"], "m", batch_size=4)
    assert len(fake_llm["prompts"]) == len(tasks)
    for i, (old, new) in enumerate(zip(tasks, rewritten, strict=True)):
        if i % 4 % 2 == 0:
            assert new.question == f"Where is {old.key} defined?"
        else:
            assert new.question == old.question  # the answer lost the key: template kept
        assert new.model_copy(update={"question": old.question}) == old
