"""AutoExplore env: observation and menu, rewards (error cost non-zero), episode end, seeding,
stages, the training drop view, the menu cap, the expert and negative examples, `cat` output."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from reflectrl.envs.auto_explore.env import AutoExploreEnv, AutoExploreOptions
from reflectrl.envs.auto_explore.expert import (
    expert_plan,
    negative_plan,
    run_expert_episode,
)
from reflectrl.envs.auto_explore.render import outline, render_file
from reflectrl.envs.auto_explore.sandbox import ReadResult, root_versions
from reflectrl.envs.auto_explore.tasks import (
    GenerationSettings,
    Task,
    generate_tasks,
    write_tasks,
)
from reflectrl.envs.registry import make_text_env
from reflectrl.errors import ConfigError

SCALE = 0.05


def build_repo(base: Path) -> Path:
    """A small repository: Python, Markdown and config files at depths 1 to 3."""
    root = base / "repo"
    files = {
        "README.md": "# Demo project\n\n## Installation\n\nRun it.\n",
        "setup.cfg": "[metadata]\nname = demo\n\n[options]\nzip_safe = False\n",
        "core.py": "class Engine:\n    pass\n\n\ndef start_engine():\n    return Engine()\n",
        "pkg/__init__.py": "",
        "pkg/models.py": "class Model:\n    def fit(self):\n        pass\n",
        "pkg/utils.py": "def helper_function():\n    return 1\n\n\ndef fit():\n    pass\n",
        "pkg/sub/deep.py": "class DeepThing:\n    pass\n",
        "pkg/sub/notes.md": "# Deep notes\n\n```\n# not a heading\n```\n",
        "docs/guide.md": "# User guide\n\n## Installation\n",
        "docs/blob.txt": "x\x00y",
        "lonely/only/alone.py": "class Alone:\n    pass\n",
    }
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (root / ".secret.py").write_text("class Hidden: ...\n")
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "core.py").write_text("class Cached: ...\n")
    return root


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return build_repo(tmp_path)


def tasks_file(tmp_path: Path, roots: list[str], **kwargs: Any) -> Path:
    path = tmp_path / "tasks.jsonl"
    write_tasks(generate_tasks(roots, seed=0, **kwargs), path)
    return path


def make_env(tmp_path: Path, repo: Path, **options: Any) -> AutoExploreEnv:
    settings = GenerationSettings(max_actions=options.get("max_actions", 40))
    path = tasks_file(tmp_path, [str(repo)], settings=settings)
    return AutoExploreEnv(AutoExploreOptions(tasks=str(path), split="all", **options))


def reset_to(env: AutoExploreEnv, target: str) -> Any:
    task = next(t for t in env.tasks if t.target == target)
    return env.reset(options={"task_id": task.id})


def test_observation_layout_and_menu(tmp_path: Path, repo: Path) -> None:
    env = make_env(tmp_path, repo)
    obs, info = reset_to(env, "pkg/models.py")
    assert obs.instruction.startswith("Which file defines the class `Model`?")
    text = obs.observation
    order = [text.index(k) for k in ("Current directory: .", "Contents:", "Commands so far:")]
    assert order == sorted(order) and text.index("Last output:") > order[-1]
    listing = text.split("Contents:\n")[1].split("\nCommands so far")[0].splitlines()
    assert listing == ["docs/", "lonely/", "pkg/", "README.md", "core.py", "setup.cfg"]
    assert (
        obs.actions
        == info["valid_actions"]
        == (
            "cd docs",
            "cd lonely",
            "cd pkg",
            "cat README.md",
            "cat core.py",
            "cat setup.cfg",
            "id README.md",
            "id core.py",
            "id setup.cfg",
        )
    )
    assert not any(".secret" in a or "__pycache__" in a for a in obs.actions)
    obs, *_ = env.step(obs.actions.index("cd pkg"))
    assert obs.actions[0] == "cd .." and "Current directory: pkg" in obs.observation
    obs, *_ = env.step(obs.actions.index("cat models.py"))
    assert "cat models.py" not in obs.actions and "id models.py" in obs.actions
    assert "Defines: class Model" in obs.observation
    assert "Commands so far: cd pkg; cat models.py" in obs.observation


def test_rewards_step_cost_and_success_bonus(tmp_path: Path, repo: Path) -> None:
    env = make_env(tmp_path, repo, max_steps=10)
    obs, _ = reset_to(env, "pkg/models.py")
    rewards = []
    for command in ("cd pkg", "cat models.py", "id models.py"):
        obs, reward, terminated, truncated, info = env.step(obs.actions.index(command))
        rewards.append(reward)
    assert rewards[:2] == pytest.approx([-1 * SCALE, -1 * SCALE])
    assert rewards[2] == pytest.approx((-1 + 10) * SCALE)
    assert terminated and not truncated and info["success"] and info["status"] == "ok"
    with pytest.raises(RuntimeError):
        env.step(0)


@pytest.mark.parametrize("pays_unused", [True, False])
def test_wrong_id_ends_with_the_horizon_penalty(
    tmp_path: Path, repo: Path, pays_unused: bool
) -> None:
    # A wrong `id` on step 2 of 10 also pays the 8 unused steps' cost, so answering at once is
    # never cheaper than exploring until the steps run out (-10 - 7 in all, both ways).
    env = make_env(
        tmp_path, repo, max_steps=10, terminal_reward=7.0, wrong_id_pays_unused_steps=pays_unused
    )
    obs, _ = reset_to(env, "pkg/models.py")
    obs, first, *_ = env.step(obs.actions.index("cd pkg"))
    _, reward, terminated, truncated, info = env.step(obs.actions.index("id utils.py"))
    assert terminated and not truncated and not info["success"]
    unused = 8 if pays_unused else 0
    assert reward == pytest.approx((-1 - 7 - unused) * SCALE)
    if pays_unused:
        assert first + reward == pytest.approx((-10 - 7) * SCALE)


def test_running_out_of_steps_terminates_with_the_penalty(tmp_path: Path, repo: Path) -> None:
    # The observation shows the steps left, so the limit is a terminal the agent sees coming:
    # `terminated` (no bootstrap on top of the penalty), never `truncated`.
    env = make_env(tmp_path, repo, max_steps=3)
    obs, _ = reset_to(env, "pkg/models.py")
    assert "(3 steps left)" in obs.observation
    steps = []
    for command in ("cd pkg", "cd ..", "cd docs"):
        obs, *rest = env.step(obs.actions.index(command))
        steps.append(rest)
    assert [s[1:3] for s in steps] == [[False, False], [False, False], [True, False]]
    assert steps[-1][0] == pytest.approx((-1 - 3) * SCALE)
    assert not steps[-1][3]["success"]


def test_error_and_warning_costs_are_not_zero(tmp_path: Path, repo: Path) -> None:
    env = make_env(tmp_path, repo, error_penalty=2.0)
    obs, _ = reset_to(env, "pkg/models.py")
    step_only = -1 * SCALE
    # An error from the menu: a .txt file that turns out to be binary.
    obs, *_ = env.step(obs.actions.index("cd docs"))
    obs, reward, _, _, info = env.step(obs.actions.index("cat blob.txt"))
    assert info["status"] == "error" and reward == pytest.approx((-1 - 2) * SCALE) != step_only
    # A warning: coming back into a directory already visited.
    obs, *_ = env.step(obs.actions.index("cd .."))
    obs, reward, _, _, info = env.step(obs.actions.index("cd docs"))
    assert info["status"] == "warning" and reward == pytest.approx((-1 - 2) * SCALE)
    # Typed commands: invalid ones cost the same; a valid one costs only the step.
    for command in (
        "rm -rf /",
        "cat ../../etc/passwd",
        "cd nowhere",
        "cat guide.md",
        "cat guide.md",
    ):
        obs, reward, terminated, _, info = env.step_text(command)
        assert not terminated
        expected = step_only if command == "cat guide.md" and info["status"] == "ok" else None
        if expected is None:
            assert info["status"] in ("error", "warning")
            assert reward == pytest.approx((-1 - 2) * SCALE)
        else:
            assert reward == pytest.approx(step_only)
    # Invalid commands are not echoed into the history.
    assert "passwd" not in obs.observation and "nowhere" not in obs.observation
    assert "<invalid command>" in obs.observation


def test_bad_menu_index_and_numpy_index(tmp_path: Path, repo: Path) -> None:
    env = make_env(tmp_path, repo)
    obs, _ = reset_to(env, "core.py")
    with pytest.raises(ValueError):
        env.step(len(obs.actions))
    with pytest.raises(ValueError):
        env.step(-1)
    obs, _, _, _, info = env.step(np.int64(obs.actions.index("cat core.py")))
    assert info["status"] == "ok"


def test_history_is_cut_to_history_len(tmp_path: Path, repo: Path) -> None:
    env = make_env(tmp_path, repo, history_len=2)
    obs, _ = reset_to(env, "core.py")
    for command in ("cd pkg", "cd ..", "cd docs", "cd .."):
        obs, *_ = env.step(obs.actions.index(command))
    assert "Commands so far: ...; cd docs; cd .. (16 steps left)" in obs.observation


def test_seeded_task_choice(tmp_path: Path, repo: Path) -> None:
    env = make_env(tmp_path, repo)

    def sequence(seed: int) -> list[str]:
        first = env.reset(seed=seed)[1]["task_id"]
        return [first] + [env.reset()[1]["task_id"] for _ in range(15)]

    assert sequence(3) == sequence(3)
    assert sequence(3) != sequence(4)
    assert len(set(sequence(5))) > 2


def test_stages_select_by_target_depth(tmp_path: Path, repo: Path) -> None:
    env = make_env(tmp_path, repo)
    assert env.stages == ("depth1", "depth2", "all")
    env.reset(seed=0)
    seen: dict[str, Counter[int]] = {}
    for stage in env.stages:
        env.set_stage(stage)
        seen[stage] = Counter(env.reset()[1]["depth"] for _ in range(60))
        assert env.episode_stage == stage
    assert set(seen["depth1"]) == {1}
    assert set(seen["depth2"]) == {1, 2}
    assert set(seen["all"]) == {1, 2, 3}


def test_a_stage_without_tasks_plays_the_shallowest(tmp_path: Path, repo: Path) -> None:
    tasks = [t for t in generate_tasks([str(repo)], seed=0) if t.depth == 3]
    path = tmp_path / "deep.jsonl"
    write_tasks(tasks, path)
    env = AutoExploreEnv(AutoExploreOptions(tasks=str(path), split="all"))
    env.set_stage("depth1")
    assert {env.reset(seed=s)[1]["depth"] for s in range(10)} == {3}


def test_drop_view_keeps_the_path_and_hides_others(tmp_path: Path, repo: Path) -> None:
    env = make_env(tmp_path, repo, drop_prob=0.5)
    task = next(t for t in env.tasks if t.target == "pkg/sub/deep.py")
    full = env.sandbox(task.root).listing(())
    menus = set()
    for seed in range(40):
        obs, _ = env.reset(seed=seed, options={"task_id": task.id})
        menus.add(obs.actions)
        assert "cd pkg" in obs.actions
        for step in expert_plan(env):  # the path is never dropped
            obs, _, terminated, _, info = env.step(obs.actions.index(step))
        assert terminated and info["success"]
    assert len(menus) > 3  # other entries come and go
    assert min(len(m) for m in menus) < 9
    assert env.sandbox(task.root).listing(()) == full  # a view: the sandbox is untouched
    # The same seed gives the same view; hidden names cannot be typed either.
    first = env.reset(seed=11, options={"task_id": task.id})[0].actions
    assert env.reset(seed=11, options={"task_id": task.id})[0].actions == first
    hidden = [n for n in ("docs", "lonely") if f"cd {n}" not in first]
    for name in hidden:
        assert env.step_text(f"cd {name}")[4]["status"] == "error"


def test_evaluation_view_shows_everything(tmp_path: Path, repo: Path) -> None:
    env = make_env(tmp_path, repo, drop_prob=0.0)
    menus = {reset_to(env, "pkg/sub/deep.py")[0].actions for _ in range(5)}
    assert len(menus) == 1 and len(next(iter(menus))) == 9


def test_menu_cap_is_fixed_deterministic_and_skips_unreachable_tasks(tmp_path: Path) -> None:
    root = tmp_path / "wide"
    (root / "a_dir").mkdir(parents=True)
    (root / "a_dir" / "inside.py").write_text("class InsideThing: ...\n")
    for i in range(30):
        (root / f"f{i:02d}.py").write_text(f"class Thing{i:02d}: ...\n")
    tasks = generate_tasks([str(root)], seed=0)  # default cap 40: 1 dir + 19 files fit
    targets = {t.target for t in tasks}
    assert "a_dir/inside.py" in targets and "f18.py" in targets
    assert "f19.py" not in targets and "f29.py" not in targets
    path = tmp_path / "wide.jsonl"
    write_tasks(tasks, path)
    env = AutoExploreEnv(AutoExploreOptions(tasks=str(path), split="all"))
    obs, _ = env.reset(seed=0)
    assert len(obs.actions) <= env.max_actions == 40
    assert "(11 more entries not shown)" in obs.observation
    assert env.step_text("cat f25.py")[4]["status"] == "error"  # past the cap: unreachable
    # A task past the cap (e.g. from a larger cap) is refused when the env loads it.
    wide = generate_tasks([str(root)], seed=0, settings=GenerationSettings(max_actions=61))
    write_tasks(wide, path)
    with pytest.raises(ConfigError, match=r"target f19\.py is not a reachable file"):
        AutoExploreEnv(AutoExploreOptions(tasks=str(path), split="all"))


def test_every_menu_fits_the_cap(tmp_path: Path, repo: Path) -> None:
    env = make_env(tmp_path, repo, max_actions=4)
    rng = random.Random(0)
    for seed in range(20):
        obs, _ = env.reset(seed=seed)
        done = False
        while not done:
            assert 1 <= len(obs.actions) <= 4
            obs, _, terminated, truncated, _ = env.step(rng.randrange(len(obs.actions)))
            done = terminated or truncated


def test_expert_solves_every_task_by_the_shortest_path(tmp_path: Path, repo: Path) -> None:
    env = make_env(tmp_path, repo)
    assert len(env.tasks) >= 7
    for task in env.tasks:
        info, terminated = run_expert_episode(env, task.id)
        assert info["success"] and terminated
        assert env.steps == (task.depth - 1) + 2  # cd per directory, cat, id


def test_expert_recovers_from_any_state(tmp_path: Path, repo: Path) -> None:
    env = make_env(tmp_path, repo)
    obs, _ = reset_to(env, "pkg/sub/deep.py")
    for command in ("cd docs", "cat guide.md"):
        obs, *_ = env.step(obs.actions.index(command))
    assert expert_plan(env) == ["cd ..", "cd pkg", "cd sub", "cat deep.py", "id deep.py"]
    obs, _ = reset_to(env, "pkg/sub/deep.py")
    for command in ("cd pkg", "cd sub", "cat deep.py"):
        obs, *_ = env.step(obs.actions.index(command))
    assert expert_plan(env) == ["id deep.py"]


def run_plan(env: AutoExploreEnv, plan: list[Any]) -> dict[str, Any]:
    obs = None
    info: dict[str, Any] = {}
    for step in plan:
        assert step.command in env.actions, (step.command, env.actions)
        obs, _, _, _, info = env.step(env.actions.index(step.command))
    assert obs is not None
    return info


def test_negative_plan_reads_a_wrong_file_then_recovers(tmp_path: Path, repo: Path) -> None:
    env = make_env(tmp_path, repo)
    reset_to(env, "pkg/models.py")
    plan = negative_plan(env, random.Random(0))
    assert plan is not None
    mistakes = [s for s in plan if s.mistake]
    assert len(mistakes) == 1
    assert mistakes[0].command in ("cat __init__.py", "cat utils.py")
    assert "models.py" in mistakes[0].note
    assert [s.command for s in plan if not s.mistake] == expert_plan(env)
    assert plan.index(mistakes[0]) == 1  # right after arriving in pkg/
    assert run_plan(env, plan)["success"]


def test_negative_plan_takes_a_wrong_directory_when_the_target_is_alone(
    tmp_path: Path, repo: Path
) -> None:
    env = make_env(tmp_path, repo)
    reset_to(env, "lonely/only/alone.py")
    plan = negative_plan(env, random.Random(1))
    assert plan is not None
    mistakes = [s for s in plan if s.mistake]
    assert len(mistakes) == 1 and mistakes[0].command in ("cd docs", "cd pkg")
    following = plan[plan.index(mistakes[0]) + 1]
    assert following.command == "cd .." and not following.mistake
    info = run_plan(env, plan)
    assert info["success"]


def test_registered_with_strict_options(tmp_path: Path, repo: Path) -> None:
    path = tasks_file(tmp_path, [str(repo)])
    env = make_text_env("auto_explore", {"tasks": str(path), "split": "all", "max_actions": 12})
    assert isinstance(env, AutoExploreEnv) and env.max_actions == 12
    assert env.action_space.n == 12
    with pytest.raises(ConfigError, match="bogus"):
        make_text_env("auto_explore", {"tasks": str(path), "bogus": 1})
    with pytest.raises(ConfigError, match="tasks"):
        make_text_env("auto_explore", {})
    with pytest.raises(ConfigError, match="drop_prob"):
        make_text_env("auto_explore", {"tasks": str(path), "drop_prob": 1.0})


def test_split_option_and_unknown_task(tmp_path: Path, repo: Path) -> None:
    path = tasks_file(tmp_path, [str(repo)])
    train = AutoExploreEnv(AutoExploreOptions(tasks=str(path), split="train"))
    test = AutoExploreEnv(AutoExploreOptions(tasks=str(path), split="test"))
    assert {t.split for t in train.tasks} == {"train"} and {t.split for t in test.tasks} == {"test"}
    assert not {t.target for t in train.tasks} & {t.target for t in test.tasks}
    with pytest.raises(ValueError, match="no task"):
        train.reset(options={"task_id": test.tasks[0].id})


def test_missing_target_is_a_config_error(tmp_path: Path, repo: Path) -> None:
    path = tasks_file(tmp_path, [str(repo)])
    (repo / "pkg" / "models.py").unlink()
    with pytest.raises(ConfigError, match=r"pkg/models\.py"):
        AutoExploreEnv(AutoExploreOptions(tasks=str(path), split="all"))


def test_tasks_are_generated_when_missing_and_roots_are_named(tmp_path: Path, repo: Path) -> None:
    path = tmp_path / "made" / "tasks.jsonl"
    options = AutoExploreOptions(tasks=str(path), split="all", roots=[str(repo)])
    env = AutoExploreEnv(options)
    assert path.is_file() and len(env.tasks) >= 7
    with pytest.raises(ConfigError, match="does not exist"):
        AutoExploreEnv(AutoExploreOptions(tasks=str(tmp_path / "none.jsonl")))


def test_the_corpus_tasks_file_is_named_by_the_installed_versions(
    tmp_path: Path, repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scratch tokenizer's tasks are cached per version of the roots' packages: tasks of
    another peft name files this one may not show (under peft 0.22, `tuners/lora/` holds one
    more file and `monteclora.py` of 0.21's tasks falls past the 40-entry menu)."""
    from importlib.metadata import version

    from reflectrl.envs.auto_explore import env as env_module

    assert root_versions(["pkg:peft", str(repo)]) == f"pkg:peft=peft-{version('peft')};{repo}"
    name = env_module.corpus_config(tmp_path)["env"]["options"]["tasks"]
    assert Path(name).parent == tmp_path
    monkeypatch.setattr(env_module, "root_versions", lambda roots: "pkg:peft=peft-0.0.1")
    assert env_module.corpus_config(tmp_path)["env"]["options"]["tasks"] != name


def test_relative_tasks_path_is_made_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert AutoExploreOptions(tasks="t.jsonl").tasks == str(tmp_path / "t.jsonl")


# --- what `cat` shows --------------------------------------------------------------------


def test_outline_by_file_type() -> None:
    python = (
        "# c\n\nimport os\n\n@dec\ndef a():\n    def inner(): ...\n"
        "async def b(): ...\nclass C:\n    def m(self): ...\n"
    )
    assert outline("python", python) == ["def a", "def b", "class C"]
    markdown = "# Title\n\n```\n# code\n```\n## Part two ##\n"
    assert outline("markdown", markdown) == ["Title", "Part two"]
    assert outline("rst", "Intro\n=====\n\ntext\n\nUsage\n-----\n") == ["Intro", "Usage"]
    config = "[tool.x]\nname = 1\nother: 2\n  # note\n"
    assert outline("config", config) == ["[tool.x]", "name", "other"]
    assert outline("yaml", "top: 1\n  nested: 2\nsecond:\n") == ["top", "second"]


def test_cat_output_is_outline_first_and_within_budget() -> None:
    text = "# License line\n# more\n\n" + "\n".join(f"def f{i}():\n    pass\n" for i in range(200))
    rendered = render_file("big.py", ReadResult(text=text, truncated=True, bytes_read=5000), 300)
    assert len(rendered.text) <= 300
    assert rendered.text.startswith("Defines: def f0, def f1")
    assert rendered.text.endswith("... (truncated)")
    assert "def f0" in rendered.shown_items and "def f199" not in rendered.shown_items
    short = render_file("core.py", ReadResult(text=text[:60], bytes_read=60), 800)
    assert "License" not in short.text  # the leading comment block is skipped
    assert render_file("x.txt", ReadResult(error="binary file"), 800).text.startswith("error:")


def test_tasks_model_rejects_mismatched_depth() -> None:
    with pytest.raises(ValueError):
        Task(id="x", root="/r", question="q", target="a/b.py", depth=1, split="train")


def test_over_long_prompts_trim_history_and_output_never_the_listing(
    tmp_path: Path, repo: Path, tokenizer: Any
) -> None:
    from reflectrl.config import load_config
    from reflectrl.rollout.vector_env import ReflectRLVectorEnv
    from reflectrl.text import prompts
    from reflectrl.text.tokens import count_tokens

    big = "\n\n".join(f"def function_number_{i}(argument):\n    return argument" for i in range(60))
    (repo / "pkg" / "big.py").write_text(big)
    path = tasks_file(tmp_path, [str(repo)], settings=GenerationSettings(max_actions=20))
    budget = 300
    config = load_config(
        None,
        [
            "env.name=auto_explore",
            f"env.options.tasks={path}",
            "env.options.split=all",
            "env.options.max_steps=30",
            "env.options.max_actions=20",
            f"env.max_prompt_tokens={budget}",
            "policy.model=tiny",
            "reflection.enabled=false",
        ],
    )
    vec = ReflectRLVectorEnv(config, tokenizer, None, num_envs=1)
    vec.reset()
    env = vec.envs[0]
    commands = ["cd pkg", "cd sub", "cd ..", "cd sub", "cd ..", "cat models.py", "cat big.py"]
    for command in commands:
        vec.step(np.array([vec._orders[0].index(env.actions.index(command))]))
    full = env._observation()
    prompt = vec.last_prompts[0]
    full_prompt = prompts.no_reflection_parts(full, vec.labels, vec._orders[0]).text
    assert count_tokens(tokenizer, full_prompt) > budget  # needed trimming
    assert vec.counters["truncated_prompts"] == 0  # ... and the env's own trimming sufficed
    assert count_tokens(tokenizer, prompt) <= budget
    listing = full.observation.split("Commands so far")[0]
    assert listing.startswith("Current directory: pkg\nContents:\n") and listing in prompt
    assert "steps left)" in prompt and prompt.endswith(" # Action:\n")
    assert "def function_number_0" in prompt  # the start of the last output stays
    assert "def function_number_20" in full.observation and "function_number_20" not in prompt
    shortest = None
    for level in range(1, 10):
        shorter = env.shorter_observation(level)
        if shorter is None:
            break
        shortest = shorter
    assert shortest is not None and listing in shortest.observation
    assert "Commands so far: ... (" in shortest.observation  # history gone, state kept


def test_sft_data_on_autoexplore(tmp_path: Path, repo: Path) -> None:
    from reflectrl.config import load_config
    from reflectrl.data.dataset import write_dataset
    from reflectrl.envs.auto_explore.tasks import load_tasks
    from tests.helpers import check_dataset

    for i in range(6):  # more files, so the split has train and test tasks in each folder
        (repo / "pkg" / f"extra_{i}.py").write_text(f"class Extra{i}:\n    pass\n")
    path = tasks_file(tmp_path, [str(repo)], settings=GenerationSettings(max_actions=20))
    config = load_config(
        None,
        [
            "env.name=auto_explore",
            f"env.options.tasks={path}",
            "env.options.max_actions=20",
            "env.max_prompt_tokens=1024",
            "policy.model=tiny",
            "reflection.model=tiny",
            "data.negative_rate=0.4",
        ],
    )
    write_dataset(config, tmp_path / "data", episodes=24, seed=0, progress=False)
    rows = check_dataset(config, tmp_path / "data", rate_bounds=(0.15, 0.5))
    tasks = load_tasks(path)
    test_targets = {t.target for t in tasks if t.split == "test"}
    assert test_targets and not {r["task"] for r in rows} & test_targets  # held out by file
    mistakes = {r["taken_action"].split()[0] for r in rows if r["perturbed"]}
    assert mistakes <= {"cat", "cd"}  # a wrong file or folder, never a wrong `id`


def test_listed_starts_are_the_stage_tasks_and_reset_plays_them(tmp_path: Path, repo: Path) -> None:
    env = make_env(tmp_path, repo)
    for stage in env.stages:
        starts = env.start_ids(stage)
        assert starts == [t.id for t in env.stage_tasks(stage)] and len(set(starts)) == len(starts)
    last = env.start_ids("all")[-1]
    assert env.reset(options={"start": last})[1]["task_id"] == last
