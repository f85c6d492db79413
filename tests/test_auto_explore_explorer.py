"""AutoExplore's observable expert (the SFT data's default) decides and describes from what the
agent sees: moving the target elsewhere in the tree changes none of its actions or reflection
facts, while the oracle's do change (so the check can fail). Measured on tasks generated from
the installed gymnasium and peft trees."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from reflectrl.data.auto_explore import DEMONSTRATORS
from reflectrl.envs.auto_explore.env import AutoExploreEnv, AutoExploreOptions
from reflectrl.envs.auto_explore.explorer import TrainingPrior, resemblance, states_answer
from reflectrl.envs.auto_explore.tasks import generate_tasks, write_tasks

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tasks_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("auto_explore") / "tasks.jsonl"
    write_tasks(generate_tasks(["pkg:gymnasium", "pkg:peft"], seed=0), path)
    return path


def moved(env: AutoExploreEnv, rng: np.random.Generator) -> Any:
    """The episode's task with its target moved to another unread file of the same tree."""
    others = [
        t.target
        for t in env.tasks
        if t.root == env.task.root
        and t.target != env.task.target
        and tuple(t.target.split("/")) not in env.shell.read
    ]
    return env.task.model_copy(update={"target": others[int(rng.integers(len(others)))]})


def play_with_moved_targets(
    env: AutoExploreEnv, expert: str, tasks: int = 40
) -> tuple[int, int, list[bool]]:
    """(steps, steps where moving the target changed the action or the reflection's fact,
    success per episode)."""
    demo = DEMONSTRATORS[expert]
    rng = np.random.default_rng(0)
    steps = changed = 0
    solved = []
    for task in env.tasks[:tasks]:
        env.reset(seed=0, options={"task_id": task.id})
        done = False
        while not done:
            real, other = env.task, moved(env, rng)
            action = demo.expert(env)
            env.task = other
            try:
                action_if_moved = demo.expert(env)
            except RuntimeError:  # the oracle's route to the moved target is not in view
                action_if_moved = -1
            env.task = real
            before = demo.snapshot(env)
            command = env.actions[action]
            _, _, terminated, truncated, info = env.step(action)
            fact = demo.describe(before, command, env)
            env.task = other
            fact_if_moved = demo.describe(before, command, env)
            env.task = real
            steps += 1
            changed += action != action_if_moved or fact != fact_if_moved
            done = terminated or truncated
        solved.append(bool(info["success"]))
    return steps, changed, solved


def test_moving_the_target_changes_no_decision_or_reflection(tasks_path: Path) -> None:
    options = AutoExploreOptions(tasks=str(tasks_path), split="train", drop_prob=0.5)
    env = AutoExploreEnv(options)
    steps, changed, solved = play_with_moved_targets(env, "observable")
    assert steps > 100 and changed == 0
    assert sum(solved) >= len(solved) // 2, f"the observable expert solved {sum(solved)}"
    # The oracle walks to wherever the target is: the same check catches it.
    _, oracle_changed, oracle_solved = play_with_moved_targets(env, "oracle")
    assert oracle_changed > 0 and all(oracle_solved)


def test_the_answer_is_read_off_the_outline_or_a_definition() -> None:
    assert states_answer("class", "Wrapper", "Defines: class Env, class Wrapper, def make\n...")
    assert not states_answer("class", "Wrap", "Defines: class Env, class Wrapper\n...")
    assert not states_answer("class", "Wrapper", "Defines: def f\nfrom core import Wrapper\n")
    assert states_answer("function", "make", "x.py: text\n\ndef make(id):\n    pass\n")
    assert states_answer("heading", "Install", "Headings: Usage, Install\n# Usage\n")
    assert states_answer("config_section", "tool", "Keys: [tool], name\n")
    assert resemblance("training_arguments.py", "TrainingArguments") == 2
    assert resemblance("training_args.py", "TrainingArguments") == 1
    assert resemblance("core.py", "Wrapper") == 0 and resemblance("wrappers", "Wrapper") == 1


def test_prior_counts_the_training_split_only(tasks_path: Path) -> None:
    every = AutoExploreEnv(AutoExploreOptions(tasks=str(tasks_path), split="all")).tasks
    prior = TrainingPrior.of(every)
    train = [t for t in every if t.split == "train"]
    assert prior.depth[1] == pytest.approx(sum(t.depth == 1 for t in train) / len(train))
    assert sum(prior.depth.values()) == pytest.approx(1.0)


def test_sft_data_states_no_hidden_fact_unless_the_oracle_is_asked(
    tasks_path: Path, tmp_path: Path
) -> None:
    from reflectrl.config import load_config
    from reflectrl.data.dataset import write_dataset

    base = [
        f"env.options.tasks={tasks_path}",
        "env.options.unseen_roots=[]",
        "policy.model=tiny",
        "reflection.model=tiny",
    ]
    texts = {}
    for expert in ("observable", "oracle"):
        config = load_config(
            REPO / "configs" / "auto_explore.yaml", [*base, f"data.expert={expert}"]
        )
        out = tmp_path / expert
        stats = write_dataset(config, out, episodes=12, seed=0, progress=False)
        assert stats["expert"] == expert
        rows = [json.loads(line) for line in (out / "data.jsonl").read_text().splitlines()]
        texts[expert] = " ".join(r["completion"] for r in rows)
    hidden = ("on the way to the answer", "off the way to the answer", "answers the question")
    assert not any(phrase in texts["observable"] for phrase in hidden)
    assert any(phrase in texts["oracle"] for phrase in hidden)


def test_held_out_evaluation_shows_every_entry(tasks_path: Path) -> None:
    """Training hides off-path entries (`drop_prob`), which only the answer can tell apart:
    evaluation never does, whatever the training config says."""
    from reflectrl.config import load_config
    from reflectrl.evaluation.held_out import eval_config

    config = load_config(
        REPO / "configs" / "auto_explore.yaml",
        [f"env.options.tasks={tasks_path}", "env.options.unseen_roots=[]"],
    )
    assert config.env.options["drop_prob"] == 0.5
    held_out, _ = eval_config(config)
    assert held_out.env.options["drop_prob"] == 0.0 and held_out.env.options["split"] == "test"
