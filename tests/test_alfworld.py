"""ALFWorld: generated games, the real engine, the env, the expert, the CLI tools.

A few games are generated once per module (every task type in train, one game in each held-out
split); walkthroughs are checked against an engine stack built here from textworld and
alfworld directly, not through `reflectrl.envs.alfworld.engine`.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from reflectrl.envs.alfworld import generator as gen
from reflectrl.envs.alfworld.catalog import floor_plans
from reflectrl.envs.alfworld.engine import Engine, capped_menu, replay
from reflectrl.envs.alfworld.env import AlfWorldEnv, AlfWorldOptions
from reflectrl.envs.alfworld.expert import ExpertError, expert_action, expert_command
from reflectrl.envs.alfworld.games import GameDataError
from reflectrl.envs.alfworld.scene import sample_scene
from reflectrl.envs.alfworld.tasks import TASK_TYPES
from reflectrl.envs.registry import env_names, make_text_env
from reflectrl.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
SEED = 5
GAME = "game.tw-pddl"
COMMAND = re.compile(
    r"^(go to [a-z]+ \d+|open [a-z]+ \d+|use [a-z]+ \d+"
    r"|(take|move|clean|heat|cool) [a-z]+ \d+ (from|to|with) [a-z]+ \d+)$"
)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("alfworld") / "games"
    # 8 games: train cycles through the six task types; one game per held-out split.
    report = gen.generate_games(out, 8, SEED, valid_seen=1 / 8, valid_unseen=1 / 8)
    assert len(report.games) == 8
    return out


def games_of(root: Path, split: str) -> list[Path]:
    return sorted((root / split).glob(f"*/*/{GAME}"))


def train_game(root: Path, task_type: str) -> Path:
    (path,) = [p for p in games_of(root, "train") if p.parent.parent.name.startswith(task_type)]
    return path


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def plain_engine() -> Any:
    """alfworld's own wrappers over textworld's PddlEnv, as alfworld's AlfredTWEnv builds them."""
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
    from textworld.envs import PddlEnv

    infos = textworld.EnvInfos(admissible_commands=True, won=True)
    return AlfredInfos(AlfredDemangler(PddlEnv(infos), shuffle=False))


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reflectrl.cli", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, **(env or {})},
        timeout=600,
    )


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_mtime_ns, p.stat().st_size) for p in root.rglob("*")}


# --- generation -----------------------------------------------------------------------------


def test_games_cover_every_task_type_in_the_official_layout(data_dir: Path) -> None:
    train = games_of(data_dir, "train")
    assert sorted(p.parent.parent.name.split("-")[0] for p in train) == sorted(TASK_TYPES)
    assert len(games_of(data_dir, "valid_seen")) == len(games_of(data_dir, "valid_unseen")) == 1
    for path in train:
        folder = path.parent
        data, traj = load(path), load(folder / "traj_data.json")
        assert (
            data["solvable"] is True
            and data["pddl_problem"] == (folder / "initial_state.pddl").read_text()
        )
        assert set(data) >= {"pddl_domain", "grammar", "pddl_problem", "walkthrough"}
        task_type, obj, _, recep, scene = folder.parent.name.split("-")
        assert traj["task_type"] == task_type and traj["pddl_params"]["object_target"] == obj
        assert traj["scene"]["floor_plan"] == f"FloorPlan{scene}"
        assert "UNKNOWN GOAL" not in data["grammar"] and "Your task is to: " in data["grammar"]
        walkthrough = data["walkthrough"]
        assert walkthrough and all(COMMAND.match(c) for c in walkthrough), walkthrough
        if task_type == "pick_clean_then_place_in_recep":
            assert any(re.match(r"clean \w+ \d+ with sinkbasin \d+$", c) for c in walkthrough)
        if task_type == "pick_heat_then_place_in_recep":
            assert any(re.match(r"heat \w+ \d+ with microwave \d+$", c) for c in walkthrough)
        if task_type == "pick_cool_then_place_in_recep":
            assert any(re.match(r"cool \w+ \d+ with fridge \d+$", c) for c in walkthrough)
        if task_type == "look_at_obj_in_light":
            assert re.match(r"use (desklamp|floorlamp) \d+$", walkthrough[-1])
            assert traj["pddl_params"]["toggle_target"] == recep
        if task_type == "pick_two_obj_and_place":
            moves = [c for c in walkthrough if c.startswith("move ")]
            assert len(moves) == 2 and moves[0] != moves[1]
            assert moves[0].split(" to ")[1] == moves[1].split(" to ")[1]
            assert moves[0].split()[1] == moves[1].split()[1] == obj.lower()


def test_split_by_floor_plan(data_dir: Path) -> None:
    plans = {
        split: {
            load(p.parent / "traj_data.json")["scene"]["scene_num"]
            for p in games_of(data_dir, split)
        }
        for split in ("train", "valid_seen", "valid_unseen")
    }
    assert plans["valid_unseen"] <= set(gen.UNSEEN_FLOOR_PLANS)
    assert not (plans["train"] | plans["valid_seen"]) & set(gen.UNSEEN_FLOOR_PLANS)
    # Every draw for a held-out split comes from the unseen plans only, and the reverse.
    all_plans = floor_plans()
    unseen = [all_plans[n] for n in gen.UNSEEN_FLOOR_PLANS]
    seen = [p for n, p in all_plans.items() if n not in gen.UNSEEN_FLOOR_PLANS]
    for i in range(30):
        for task_type in TASK_TYPES:
            scene = sample_scene(task_type, unseen, random.Random(i))
            assert scene is None or scene.plan.number in gen.UNSEEN_FLOOR_PLANS
            scene = sample_scene(task_type, seen, random.Random(i))
            assert scene is None or scene.plan.number not in gen.UNSEEN_FLOOR_PLANS
    # The env reads one split, or both held-out ones.
    env = AlfWorldEnv(AlfWorldOptions(data_dir=str(data_dir), split="valid_unseen"))
    assert [g.path for g in env.games] == games_of(data_dir, "valid_unseen")
    env = AlfWorldEnv(AlfWorldOptions(data_dir=str(data_dir), split="valid"))
    assert len(env.games) == 2


def test_generation_is_deterministic_across_processes(data_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "again"
    args = ["--n", "2", "--seed", str(SEED), "--task-types", "look,pick"]
    result = cli("alfworld-gen", "--out", str(out), *args, "--valid-seen", "0",
                 "--valid-unseen", "0", env={"PYTHONHASHSEED": "123"})  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "wrote 2 games" in result.stdout
    again = games_of(out, "train")
    expected = [train_game(data_dir, t) for t in ("pick_and_place_simple", "look_at_obj_in_light")]
    assert sorted(p.relative_to(out) for p in again) == sorted(
        p.relative_to(data_dir) for p in expected
    )
    for path in again:
        twin = data_dir / path.relative_to(out)
        assert path.read_bytes() == twin.read_bytes()
        assert (path.parent / "traj_data.json").read_bytes() == (
            twin.parent / "traj_data.json"
        ).read_bytes()
    # Another seed draws other scenes.
    plans = list(floor_plans().values())
    a = sample_scene("pick_and_place_simple", plans, random.Random(f"x:{SEED}"))
    b = sample_scene("pick_and_place_simple", plans, random.Random(f"x:{SEED + 1}"))
    assert a is not None and b is not None and (a.plan, a.objects) != (b.plan, b.objects)


def test_a_game_failing_verification_is_reported_and_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = gen.plan_steps
    calls = []

    def first_plan_loses_its_last_step(scene: Any) -> list[tuple[str, ...]]:
        calls.append(1)
        steps = real(scene)
        return steps[:-1] if len(calls) == 1 else steps

    monkeypatch.setattr(gen, "plan_steps", first_plan_loses_its_last_step)
    out = tmp_path / "games"
    report = gen.generate_games(
        out, 1, SEED, ["pick_and_place_simple"], valid_seen=0, valid_unseen=0
    )
    assert len(report.skipped) == 1 and "not won after the last command" in report.skipped[0]
    (kept,) = report.games
    assert games_of(out, "train") == [kept]  # nothing written for the failed draw
    assert load(kept.parent / "traj_data.json")["reflectrl"]["attempt"] == 1
    engine = Engine()
    engine.load(kept)
    assert replay(engine, load(kept)["walkthrough"], 60).ok


# --- the engine and the env -----------------------------------------------------------------


def test_env_menu_is_the_engines_and_walkthroughs_win(data_dir: Path) -> None:
    env = AlfWorldEnv(AlfWorldOptions(data_dir=str(data_dir), max_actions=500))
    plain = plain_engine()
    for path in games_of(data_dir, "train"):
        walkthrough = load(path)["walkthrough"]
        obs, info = env.reset(options={"game": str(path)})
        plain.load(str(path))
        state = plain.reset()
        intro = state.feedback
        assert obs.actions == tuple(state["admissible_commands"]) == info["valid_actions"]
        assert obs.instruction.endswith(intro.split("Your task is to: ")[1].strip())
        assert intro.split("\n\n")[1] in obs.observation  # the room description
        assert (
            info["success"] is False and info["task_type"] == path.parent.parent.name.split("-")[0]
        )
        for i, command in enumerate(walkthrough):
            assert obs.actions.index(command) == expert_action(env)
            obs, reward, terminated, truncated, info = env.step(obs.actions.index(command))
            state, _, _ = plain.step(command)
            last = i == len(walkthrough) - 1
            assert obs.actions == tuple(state["admissible_commands"])
            assert (reward, terminated, info["success"], state["won"]) == (
                (1.0, True, True, True) if last else (0.0, False, False, False)
            )
            assert not truncated
        assert f"> {walkthrough[-1]}" in obs.observation


def test_capped_menu_rule() -> None:
    admissible = (
        "close fridge 1",
        "examine apple 1",
        "examine fridge 1",
        "go to cabinet 1",
        "go to cabinet 2",
        "help",
        "inventory",
        "look",
        "move apple 1 to fridge 1",
        "take egg 1 from fridge 1",
    )
    assert capped_menu(admissible, 10) == admissible
    assert capped_menu(admissible, 7) == (
        "close fridge 1",
        "go to cabinet 1",
        "go to cabinet 2",
        "inventory",
        "look",
        "move apple 1 to fridge 1",
        "take egg 1 from fridge 1",
    )
    assert capped_menu(admissible, 3) == (
        "go to cabinet 1",
        "move apple 1 to fridge 1",
        "take egg 1 from fridge 1",
    )


def test_env_caps_the_menu_and_check_catches_cut_walkthroughs(data_dir: Path) -> None:
    path = train_game(data_dir, "pick_heat_then_place_in_recep")
    env = AlfWorldEnv(AlfWorldOptions(data_dir=str(data_dir), max_actions=5))
    obs, _ = env.reset(options={"game": str(path)})
    assert env.action_space.n == env.max_actions == 5
    assert len(env.admissible) > 5 and obs.actions == capped_menu(env.admissible, 5)
    assert set(obs.actions) <= set(env.admissible)
    engine = Engine()
    engine.load(path)
    result = replay(engine, load(path)["walkthrough"], 3)
    assert not result.ok and "cap" in result.reason
    assert replay(engine, load(path)["walkthrough"], 60).ok  # what the generator checked
    # A second reset without a new load starts the game over too (not from the played state).
    first = engine.reset()
    assert engine.step(first.admissible[0]).feedback.startswith("You arrive at")
    assert engine.reset() == first


def test_history_step_limit_and_no_writes(data_dir: Path) -> None:
    before = snapshot(data_dir)
    env = AlfWorldEnv(AlfWorldOptions(data_dir=str(data_dir), max_steps=3, history=2))
    obs, _ = env.reset(options={"game": 0})
    first = obs
    with pytest.raises(ValueError, match="out of range"):
        env.step(len(obs.actions))
    go_to = next(a for a in obs.actions if a.startswith("go to "))
    for i, command in enumerate([go_to, "inventory", "look"], start=1):
        obs, reward, terminated, truncated, info = env.step(obs.actions.index(command))
        assert reward == 0.0 and not terminated and info["success"] is False
        assert truncated == (i == 3) and info["steps"] == i
    assert "(3 so far, 1 earlier not shown)" in obs.observation
    assert obs.observation.count("> ") == 2 and f"> {go_to}" not in obs.observation
    assert obs.observation.index("> inventory") < obs.observation.index("> look")
    assert "You are facing the" in obs.observation  # the engine's "look" where the agent went
    with pytest.raises(RuntimeError, match="finished episode"):
        env.step(0)
    again, info = env.reset(options={"game": 0})  # the same game from its start again
    assert again == first and info["steps"] == 0
    assert snapshot(data_dir) == before


def test_expert_recovers_from_a_wrong_go_to(data_dir: Path) -> None:
    path = train_game(data_dir, "pick_clean_then_place_in_recep")
    walkthrough = load(path)["walkthrough"]
    env = AlfWorldEnv(AlfWorldOptions(data_dir=str(data_dir)))
    obs, _ = env.reset(options={"game": str(path)})
    obs, *_ = env.step(expert_action(env))  # go to the object's receptacle
    wrong = next(a for a in obs.actions if a.startswith("go to ") and a not in walkthrough)
    obs, *_ = env.step(obs.actions.index(wrong))
    assert expert_command(env) == walkthrough[0]  # back to where the plan was
    steps, done, info = 0, False, {}
    while not done:
        obs, _, terminated, truncated, info = env.step(expert_action(env))
        done, steps = terminated or truncated, steps + 1
    assert info["success"] and steps == len(walkthrough)


def test_two_envs_in_one_process_do_not_share_engine_state(data_dir: Path) -> None:
    paths = [train_game(data_dir, t) for t in ("pick_two_obj_and_place", "look_at_obj_in_light")]
    envs = [AlfWorldEnv(AlfWorldOptions(data_dir=str(data_dir))) for _ in paths]
    argv = list(sys.argv)
    for env, path in zip(envs, paths, strict=True):
        env.reset(options={"game": str(path)})
    assert sys.argv == argv  # the planner's translator sets it while a game loads
    successes = [False, False]
    while not all(successes):
        for i, env in enumerate(envs):
            if not successes[i]:
                _, _, terminated, truncated, info = env.step(expert_action(env))
                assert not truncated and terminated == info["success"]
                successes[i] = info["success"]


def test_curriculum_stages(data_dir: Path, tmp_path: Path) -> None:
    env = AlfWorldEnv(AlfWorldOptions(data_dir=str(data_dir)))
    assert env.stages == (*TASK_TYPES, "all") and env.stage == "all"
    with pytest.raises(ValueError, match="unknown stage"):
        env.set_stage("walkthrough_le_6")
    env.set_stage("pick_heat_then_place_in_recep")
    assert {g.task_type for g in env.stage_games()} == {"pick_heat_then_place_in_recep"}
    _, info = env.reset(seed=1)
    assert info["stage"] == info["task_type"] == "pick_heat_then_place_in_recep"
    assert len(env.stage_games("all")) == 6
    # The game is drawn from the reset's seed: the same seed, the same games.
    env.set_stage("all")
    drawn = [env.reset(seed=5 if i == 0 else None) and env.game for i in range(4)]
    assert [env.reset(seed=5 if i == 0 else None) and env.game for i in range(4)] == drawn
    env.set_stage("pick_heat_then_place_in_recep")
    # Listed starts (held-out eval plays each once) are the stage's games, by index.
    starts = env.start_ids("pick_heat_then_place_in_recep")
    assert [env.games[int(i)] for i in starts] == list(env.stage_games())
    env.reset(options={"start": starts[0]})
    assert env.game == env.games[int(starts[0])]
    shortest = min(g.walkthrough_length or 99 for g in env.games)
    by_length = AlfWorldEnv(
        AlfWorldOptions(
            data_dir=str(data_dir), curriculum="walkthrough_length", length_stages=[shortest, 99]
        )
    )
    assert by_length.stages == (f"walkthrough_le_{shortest}", "walkthrough_le_99", "all")
    short = by_length.stage_games(f"walkthrough_le_{shortest}")
    assert short and all(g.walkthrough_length == shortest for g in short)
    assert len(short) < len(by_length.stage_games("walkthrough_le_99")) == 6
    # A game without a walkthrough (official data may ship some): playable, no expert, and in
    # no length stage.
    source = train_game(data_dir, "pick_and_place_simple").parent
    copy = tmp_path / "data" / "train" / source.parent.name / source.name
    shutil.copytree(source, copy)
    data = load(copy / GAME)
    data["walkthrough"] = None
    (copy / GAME).write_text(json.dumps(data))
    env = AlfWorldEnv(
        AlfWorldOptions(data_dir=str(tmp_path / "data"), curriculum="walkthrough_length")
    )
    assert env.stages == ("all",)
    env.reset(seed=0)
    with pytest.raises(ExpertError, match="no walkthrough"):
        expert_action(env)


# --- registry, config, bad input --------------------------------------------------------------


def test_registry_and_config(data_dir: Path) -> None:
    from reflectrl.config import load_config

    assert "alfworld" in env_names()
    env = make_text_env("alfworld", {"data_dir": str(data_dir), "task_types": ["heat", "two"]})
    assert isinstance(env, AlfWorldEnv)
    assert {g.task_type for g in env.games} == {
        "pick_heat_then_place_in_recep",
        "pick_two_obj_and_place",
    }
    config = load_config(REPO / "configs" / "alfworld.yaml", [f"env.options.data_dir={data_dir}"])
    options = AlfWorldOptions(**config.env.options)
    assert len(set(config.policy.labels)) == len(config.policy.labels) >= options.max_actions
    assert config.env.max_prompt_tokens >= 1024
    assert Path(AlfWorldOptions(data_dir="some/games").data_dir or "").is_absolute()
    family = train_game(data_dir, "pick_cool_then_place_in_recep").parent.parent.name
    env = make_text_env("alfworld", {"data_dir": str(data_dir), "families": [family[:-3]]})
    assert [g.task_type for g in env.games] == ["pick_cool_then_place_in_recep"]


def test_bad_options_and_data_are_one_line_errors(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigError, match=r"env\.options\.task_types: .*'bogus'"):
        make_text_env("alfworld", {"data_dir": str(data_dir), "task_types": ["pick", "bogus"]})
    missing = tmp_path / "nowhere"
    with pytest.raises(GameDataError, match=re.escape(f"{missing} is not a directory")):
        make_text_env("alfworld", {"data_dir": str(missing)})
    (tmp_path / "empty" / "train").mkdir(parents=True)
    with pytest.raises(GameDataError, match="no solvable ALFWorld games"):
        make_text_env("alfworld", {"data_dir": str(tmp_path / "empty")})
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    with pytest.raises(ConfigError, match="ALFWORLD_DATA"):
        make_text_env("alfworld", {})
    source = train_game(data_dir, "pick_and_place_simple").parent
    copy = tmp_path / "bad" / "train" / source.parent.name / source.name
    shutil.copytree(source, copy)
    (copy / GAME).write_text('{"pddl_domain": ')
    with pytest.raises(GameDataError, match=re.escape(f"{copy / GAME}: corrupt game file")):
        make_text_env("alfworld", {"data_dir": str(tmp_path / "bad")})
    (copy / GAME).unlink()
    with pytest.raises(GameDataError, match=re.escape(f"{copy / GAME}: game file not found")):
        make_text_env("alfworld", {"data_dir": str(tmp_path / "bad")})


def test_cli_errors_exit_2_with_one_line(data_dir: Path, tmp_path: Path) -> None:
    cases = [
        (["alfworld-gen", "--out", str(tmp_path / "x"), "--n", "2", "--task-types", "pick,bogus"],
         "unknown ALFWorld task type 'bogus'"),
        (["alfworld-gen", "--out", str(data_dir), "--n", "2"], "is not empty"),
        (["alfworld-check", str(tmp_path / "nowhere")], "nowhere: not a directory"),
    ]  # fmt: skip
    bad = tmp_path / "bad" / "train" / "pick_and_place_simple-Apple-None-Fridge-7" / "trial_1"
    bad.mkdir(parents=True)
    (bad / GAME).write_text("not json")
    cases.append((["alfworld-check", str(tmp_path / "bad")], f"{bad / GAME}: corrupt game file"))
    for args, message in cases:
        result = cli(*args)
        assert result.returncode == 2, (args, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("reflectrl: error: ")
        assert message in lines[0]


def test_cli_check_counts_rate_and_failures(data_dir: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(data_dir, copy)
    broken = train_game(copy, "pick_cool_then_place_in_recep")
    data = load(broken)
    data["walkthrough"] = data["walkthrough"][:-1]
    broken.write_text(json.dumps(data))
    leaked = train_game(copy, "look_at_obj_in_light").parent
    shutil.copytree(leaked, copy / "valid_unseen" / leaked.parent.name / leaked.name)
    result = cli("alfworld-check", str(copy))
    assert result.returncode == 1, result.stderr
    rows = {line.split()[0]: line.split()[1:4] for line in result.stdout.splitlines()[1:7]}
    assert rows == {
        "look_at_obj_in_light": ["2", "2", "1.000"],
        "pick_and_place_simple": ["3", "3", "1.000"],
        "pick_clean_then_place_in_recep": ["1", "1", "1.000"],
        "pick_cool_then_place_in_recep": ["1", "0", "0.000"],
        "pick_heat_then_place_in_recep": ["1", "1", "1.000"],
        "pick_two_obj_and_place": ["1", "1", "1.000"],
    }
    assert f"FAILED {broken}: not won after the last command" in result.stderr
    assert "FAILED split: floor plans in both train and valid_unseen" in result.stdout
    assert "solved rate: 0.889 (8/9)" in result.stdout


def test_official_layout_through_alfworld_data(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    official = tmp_path / "alfworld_data" / "json_2.1.1"
    shutil.copytree(data_dir / "train", official / "train")
    bare = train_game(official, "pick_two_obj_and_place").parent
    (bare / "traj_data.json").unlink()  # the task type then comes from the folder name
    movable = official / "train" / "pick_and_place_with_movable_recep-Apple-Bowl-Fridge-7" / "t1"
    movable.mkdir(parents=True)
    (movable / GAME).write_text("not read: the text engine does not support these")
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "alfworld_data"))
    env = make_text_env("alfworld", {})
    assert isinstance(env, AlfWorldEnv) and env.root == official
    assert sorted(g.task_type for g in env.games) == sorted(TASK_TYPES)
    (two,) = [g for g in env.games if g.path.parent == bare]
    assert two.floor_plan is None and two.walkthrough_length == len(
        load(bare / GAME)["walkthrough"]
    )
    family = bare.parent.name.rsplit("-", 1)[0]  # the paper's filter is such a family name
    env = make_text_env("alfworld", {"families": [family]})
    assert [g.family for g in env.games] == [family]


def test_rollout_vector_env_over_alfworld(data_dir: Path, tokenizer: Any) -> None:
    import numpy as np

    from reflectrl.config import load_config
    from reflectrl.rollout.vector_env import ReflectRLVectorEnv

    config = load_config(
        REPO / "configs" / "alfworld.yaml",
        [f"env.options.data_dir={data_dir}", "policy.model=tiny", "reflection.enabled=false"],
    )
    env = ReflectRLVectorEnv(config, tokenizer, None, num_envs=2, worker_index=1)
    obs, _ = env.reset()
    rng = np.random.default_rng(0)
    for _ in range(3):
        menus = obs["option_mask"].sum(axis=1).astype(int)
        assert obs["input_ids"].shape == (2, config.env.max_prompt_tokens)
        assert all(1 < m <= 60 for m in menus)
        assert all(
            "Your task is to: " in p and p.endswith(" # Action:\n") for p in env.last_prompts
        )
        obs, *_ = env.step(np.array([rng.integers(m) for m in menus]))
    assert env.counters["truncated_prompts"] == 0 and env.pop_stats()["env_steps"] == 6


def test_shorter_observations_trim_history_never_the_room(data_dir: Path) -> None:
    env = AlfWorldEnv(AlfWorldOptions(data_dir=str(data_dir), max_steps=20, history=4))
    obs, _ = env.reset(options={"game": 0})
    room = obs.observation
    for command in ("look", "inventory", "look", "inventory", "look", "inventory"):
        obs, *_ = env.step(obs.actions.index(command))
    assert obs.observation.count("\n> ") == 4
    pairs = []
    level = 1
    while (shorter := env.shorter_observation(level)) is not None:
        assert shorter.observation.startswith(room)  # the room description is never cut
        assert shorter.instruction == obs.instruction and shorter.actions == obs.actions
        assert len(shorter.observation) <= len(obs.observation)
        pairs.append(shorter.observation.count("\n> "))
        level += 1
    assert pairs[:2] == [2, 1] and pairs[-1] == 1 and level > 3  # then feedback gets cut


def test_sft_data_on_alfworld(data_dir: Path, tmp_path: Path) -> None:
    from reflectrl.config import load_config
    from reflectrl.data.dataset import write_dataset
    from tests.helpers import check_dataset

    config = load_config(
        REPO / "configs" / "alfworld.yaml",
        [
            f"env.options.data_dir={data_dir}",
            "policy.model=tiny",
            "reflection.model=tiny",
            "data.negative_rate=0.3",
        ],
    )
    write_dataset(config, tmp_path / "data", episodes=6, seed=0, progress=False)
    rows = check_dataset(config, tmp_path / "data", rate_bounds=(0.05, 0.45))
    games = {Path(r["task"]) for r in rows}
    assert games and all(g.is_relative_to(data_dir / "train") for g in games)  # no valid_* game
    assert all(r["taken_action"].startswith("go to ") for r in rows if r["perturbed"])


def test_prefetched_resets_over_the_real_engine_change_nothing(
    data_dir: Path, tokenizer: Any
) -> None:
    # The engine is not thread-safe (a game loading beside another env's step fails inside the
    # planner's translator): the vector env must never step while a reset runs behind.
    import numpy as np

    from reflectrl.config import load_config
    from reflectrl.rollout.vector_env import ReflectRLVectorEnv

    played = []
    for prefetch in (False, True):
        config = load_config(
            REPO / "configs" / "alfworld.yaml",
            [
                f"env.options.data_dir={data_dir}",
                "env.options.max_steps=2",
                "policy.model=tiny",
                "reflection.enabled=false",
                f"env.prefetch_resets={str(prefetch).lower()}",
            ],
        )
        env = ReflectRLVectorEnv(config, tokenizer, None, num_envs=2, worker_index=1)
        obs, _ = env.reset()
        rng = np.random.default_rng(0)
        prompts, pending = [env.last_prompts], 0
        for _ in range(7):
            menus = obs["option_mask"].sum(axis=1).astype(int)
            obs, *_ = env.step(np.array([rng.integers(m) for m in menus]))
            prompts.append(env.last_prompts)
            pending += 0 if env._prefetch is None else len(env._prefetch.pending)
        played.append((prompts, env.pop_stats()["episodes"], pending))
        env.close()
    (inline, inline_episodes, _), (prefetched, episodes, pending) = played
    assert pending >= 4 and len(episodes) >= 4
    assert prefetched == inline and episodes == inline_episodes
