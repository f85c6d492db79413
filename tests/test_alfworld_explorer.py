"""ALFWorld's observable expert: it decides from what the agent sees (never from where the
game hid things), it only plays commands on the menu, it wins real games through the real
engine, and `data.expert: observable` makes SFT data.

The hidden-state test plays two copies of one game that differ only in which closed receptacle
holds the task's object; the walkthrough (the oracle) goes to different places in them, the
observable expert must act and reflect the same until it opens one of the two receptacles.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path

import pytest

from reflectrl.data.alfworld import DEMONSTRATORS, ObservableDemonstrator, sight_of
from reflectrl.envs.alfworld import generator as gen
from reflectrl.envs.alfworld.engine import Engine
from reflectrl.envs.alfworld.env import AlfWorldEnv, AlfWorldOptions
from reflectrl.envs.alfworld.explorer import ReceptaclePrior, Sight, decide, explore, parse_goal

REPO = Path(__file__).resolve().parents[1]
SEED = 4  # its training games include one whose object hides in one of many cabinets
GAME = "game.tw-pddl"
ROOM = (
    "You are in the middle of a room. Looking quickly around you, you see a cabinet 2, a "
    "cabinet 1, a countertop 1, a fridge 1, a microwave 1, a sidetable 1, and a sinkbasin 1."
)
PLACES = ("cabinet 1", "cabinet 2", "countertop 1", "fridge 1", "microwave 1", "sidetable 1")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("alfworld_explorer") / "games"
    # 8 games: train cycles through the six task types; one game per held-out split.
    report = gen.generate_games(out, 8, SEED, valid_seen=1 / 8, valid_unseen=1 / 8)
    assert len(report.games) == 8
    return out


def prior() -> ReceptaclePrior:
    """Apples mostly on counter tops, then in cabinets; lamps on side tables; the package's
    rules keep apples out of sink basins and off side tables."""
    return ReceptaclePrior(
        rates={
            "apple": {"countertop": 0.3, "cabinet": 0.2, "fridge": 0.1, "microwave": 0.05},
            "desklamp": {"sidetable": 0.9},
        },
        pooled={"countertop": 0.2, "cabinet": 0.1, "sidetable": 0.1, "fridge": 0.1},
        openable={"cabinet": 1.0, "fridge": 1.0, "microwave": 1.0},
        goal_factor=1.0,
        holds={"sinkbasin": frozenset(), "sidetable": frozenset({"desklamp"})},
    )


def sight(task: str, history: list[tuple[str, str]], menu: list[str] | None = None) -> Sight:
    default = [f"go to {p}" for p in PLACES] + ["go to sinkbasin 1", "inventory", "look"]
    return Sight.observe(task, ROOM, history, menu if menu is not None else default)


ARRIVE_CLOSED = "You arrive at {0}. The {0} is closed."
ARRIVE_ON = "You arrive at {0}. On the {0}, you see {1}."
OPEN = "You open the {0}. The {0} is open. In it, you see {1}."


# --- decisions from constructed sights ------------------------------------------------------


def test_sight_reads_only_the_screen_and_history() -> None:
    s = sight(
        "put a hot apple in fridge",
        [
            ("go to countertop 1", ARRIVE_ON.format("countertop 1", "a mug 1, and a apple 2")),
            ("go to cabinet 1", ARRIVE_CLOSED.format("cabinet 1")),
            ("open cabinet 1", OPEN.format("cabinet 1", "a apple 1")),
            ("take apple 1 from cabinet 1", "You pick up the apple 1 from the cabinet 1."),
        ],
    )
    assert s.receptacles[:2] == ("cabinet 1", "cabinet 2") and "sinkbasin 1" in s.receptacles
    assert (s.location, s.holding) == ("cabinet 1", "apple 1")
    assert s.seen == {"countertop 1": ("mug 1", "apple 2"), "cabinet 1": ()}
    assert s.opened == {"cabinet 1"} and not s.closed
    assert s.unsearched() == ["cabinet 2", "fridge 1", "microwave 1", "sidetable 1", "sinkbasin 1"]
    assert parse_goal(s.task).task_type == "pick_heat_then_place_in_recep"


def test_summary_carries_every_fact_the_expert_reads_beyond_the_window() -> None:
    """`env.options.memory`'s block: what the whole history showed, so a prompt with the last
    few pairs still holds each fact `decide` reads (the first pairs here are out of a window of
    one pair)."""
    history = [
        ("go to countertop 1", ARRIVE_ON.format("countertop 1", "a mug 1, and a apple 2")),
        ("go to sidetable 1", ARRIVE_ON.format("sidetable 1", "a desklamp 1")),
        ("use desklamp 1", "You turn on the desklamp 1."),
        ("go to fridge 1", ARRIVE_CLOSED.format("fridge 1")),
        ("go to cabinet 1", ARRIVE_CLOSED.format("cabinet 1")),
        ("open cabinet 1", OPEN.format("cabinet 1", "a apple 1")),
        ("take apple 1 from cabinet 1", "You pick up the apple 1 from the cabinet 1."),
        ("go to sinkbasin 1", "You arrive at sinkbasin 1. On the sinkbasin 1, you see nothing."),
        ("clean apple 1 with sinkbasin 1", "You clean the apple 1 using the sinkbasin 1."),
    ]
    full = sight("put a clean apple in fridge", history)
    assert full.summary() == (
        "At: sinkbasin 1. Holding: apple 1.\n"
        "Searched: cabinet 1 (empty); countertop 1 (mug 1, apple 2); sidetable 1 (desklamp 1); "
        "sinkbasin 1 (empty).\n"
        "Not searched: cabinet 2, fridge 1, microwave 1.\n"
        "Closed: fridge 1. Opened: cabinet 1.\n"
        "Cleaned, heated or cooled: apple 1. Turned on: desklamp 1."
    )
    assert "Holding: nothing" in sight("put a clean apple in fridge", history[:1]).summary()
    # The window alone gives another decision than the whole episode: the summary is needed.
    window = sight("put a clean apple in fridge", history[-1:])
    assert explore(window, prior()) != explore(full, prior()) == "go to fridge 1"


def test_search_order_follows_the_prior_per_step_and_respects_the_menu() -> None:
    task = "put some apple on sidetable"
    first = decide(sight(task, []), prior())
    assert first.command == "go to countertop 1" and "likeliest" in first.why
    # Chance per step: a cabinet's 0.2 over two steps (go to, open) beats the fridge's 0.1.
    seen = [("go to countertop 1", ARRIVE_ON.format("countertop 1", "a mug 1"))]
    assert explore(sight(task, seen), prior()) == "go to cabinet 1"
    closed = [*seen, ("go to cabinet 1", ARRIVE_CLOSED.format("cabinet 1"))]
    assert explore(sight(task, closed, ["open cabinet 1", "go to cabinet 2"]), prior()) == (
        "open cabinet 1"
    )
    # A "go to" the menu cap dropped is never chosen: the next best one that is there.
    menu = ["go to cabinet 2", "go to fridge 1", "look"]
    assert explore(sight(task, seen, menu), prior()) == "go to cabinet 2"


def test_task_steps_from_take_to_put() -> None:
    task = "heat some apple and put it in fridge"
    history = [("go to countertop 1", ARRIVE_ON.format("countertop 1", "a apple 1"))]
    menu = ["take apple 1 from countertop 1", "go to fridge 1", "look"]
    assert explore(sight(task, history, menu), prior()) == "take apple 1 from countertop 1"
    history.append(
        ("take apple 1 from countertop 1", "You pick up the apple 1 from the countertop 1.")
    )
    assert explore(sight(task, history), prior()) == "go to microwave 1"
    history.append(("go to microwave 1", ARRIVE_CLOSED.format("microwave 1")))
    menu = ["heat apple 1 with microwave 1", "open microwave 1", "go to fridge 1"]
    assert explore(sight(task, history, menu), prior()) == "heat apple 1 with microwave 1"
    history.append(("heat apple 1 with microwave 1", "You heat the apple 1 using the microwave 1."))
    assert explore(sight(task, history), prior()) == "go to fridge 1"
    history.append(("go to fridge 1", ARRIVE_CLOSED.format("fridge 1")))
    assert explore(sight(task, history, ["open fridge 1", "look"]), prior()) == "open fridge 1"
    history.append(("open fridge 1", OPEN.format("fridge 1", "nothing")))
    menu = ["move apple 1 to fridge 1", "close fridge 1", "look"]
    assert explore(sight(task, history, menu), prior()) == "move apple 1 to fridge 1"
    history.append(("move apple 1 to fridge 1", "You move the apple 1 to the fridge 1."))
    assert decide(sight(task, history), prior()).why == "the task is done"


def test_two_objects_and_a_lamp_seen_earlier() -> None:
    two = "find two apple and put them in fridge"
    history = [
        ("go to countertop 1", ARRIVE_ON.format("countertop 1", "a apple 1, and a apple 2")),
        ("take apple 1 from countertop 1", "You pick up the apple 1 from the countertop 1."),
        ("go to fridge 1", ARRIVE_CLOSED.format("fridge 1")),
        ("open fridge 1", OPEN.format("fridge 1", "nothing")),
        ("move apple 1 to fridge 1", "You move the apple 1 to the fridge 1."),
    ]
    menu = ["take apple 1 from fridge 1", "go to countertop 1", "look"]
    assert explore(sight(two, history, menu), prior()) == "go to countertop 1"  # not apple 1
    look = "look at apple under the desklamp"
    history = [
        ("go to sidetable 1", ARRIVE_ON.format("sidetable 1", "a desklamp 1")),
        ("go to countertop 1", ARRIVE_ON.format("countertop 1", "a apple 1")),
        ("take apple 1 from countertop 1", "You pick up the apple 1 from the countertop 1."),
    ]
    assert explore(sight(look, history), prior()) == "go to sidetable 1"
    history.append(("go to sidetable 1", ARRIVE_ON.format("sidetable 1", "a desklamp 1")))
    assert explore(sight(look, history, ["use desklamp 1", "look"]), prior()) == "use desklamp 1"


# --- the real engine ------------------------------------------------------------------------


def play(env: AlfWorldEnv, demo: ObservableDemonstrator) -> tuple[bool, int]:
    prior_ = demo.prior(env)
    done, won, steps = False, False, 0
    while not done:
        seen = sight_of(env)
        command = explore(seen, prior_)
        assert command in env.menu  # on the menu, every step
        # Decided from what the sight derived, never from the raw pairs: so the memory
        # block's summary and the menu carry all of it (env.options.memory).
        assert explore(dataclasses.replace(seen, history=()), prior_) == command
        _, _, terminated, truncated, info = env.step(demo.expert(env))
        done, won, steps = terminated or truncated, bool(info["success"]), steps + 1
    return won, steps


def test_observable_expert_wins_real_games(data_dir: Path) -> None:
    demo = ObservableDemonstrator()
    for split in ("train", "valid_unseen"):  # every task type, and an unseen floor plan
        env = AlfWorldEnv(AlfWorldOptions(data_dir=str(data_dir), split=split))
        for i, game in enumerate(env.games):
            env.reset(options={"game": i})
            won, steps = play(env, demo)
            assert won and steps <= 40, (game.path, steps)


def test_memory_option_shows_the_summary_in_the_observation(data_dir: Path) -> None:
    demo = ObservableDemonstrator()
    observations = {}
    for memory in (False, True):
        env = AlfWorldEnv(AlfWorldOptions(data_dir=str(data_dir), memory=memory, history=1))
        first, _ = env.reset(options={"game": 0})
        for _ in range(3):
            obs, *_ = env.step(demo.expert(env))
        observations[memory] = (first.observation, obs.observation, sight_of(env).summary())
    (first, plain, _), (first_memory, shown, summary) = observations[False], observations[True]
    assert first == first_memory  # nothing seen yet: no block
    assert "What you know so far:" not in plain
    assert shown == plain.replace(
        "\nYour last actions", f"\nWhat you know so far:\n{summary}\n\nYour last actions", 1
    )


def hiding_place(path: Path) -> tuple[str, str, str] | None:
    """(object, its receptacle, another receptacle of that type) when the game has one object
    of the task's type (a second one could be found first and the games never told apart)."""
    init = json.loads(path.read_text())["pddl_problem"].split("(:goal")[0]  # not the goal's ?o
    target = json.loads((path.parent / "traj_data.json").read_text())["pddl_params"]
    objects = re.findall(rf"\(objectType (\S+) {target['object_target']}Type\)", init)
    if len(objects) != 1:
        return None
    (src,) = re.findall(rf"\(inReceptacle {re.escape(objects[0])} (\S+)\)", init)
    (rtype,) = re.findall(rf"\(receptacleType {re.escape(src)} (\S+)\)", init)
    twins = [r for r in re.findall(rf"\(receptacleType (\S+) {rtype}\)", init) if r != src]
    return (objects[0], src, twins[-1]) if twins else None


def moved_copy(data_dir: Path, out: Path) -> tuple[Path, Path, str, str]:
    """Two data folders with the same training games and one held-out game each: the same
    game, except that the task's object starts in another receptacle of the same type (so the
    walkthrough only changes that name). Returns the folders and the two receptacles' names."""
    games = [(p, hiding_place(p)) for p in sorted((data_dir / "train").glob(f"*/*/{GAME}"))]
    # A closed receptacle first: what it holds is hidden until the agent opens it.
    closed = [(p, h) for p, h in games if h and f"(openable {h[1]})" in p.read_text()]
    path, place = (closed or [(p, h) for p, h in games if h] or [(None, None)])[0]
    assert path is not None and place is not None, "no game with one object and a twin place"
    obj, src, dst = place
    data = json.loads(path.read_text())
    problem = data["pddl_problem"]
    (where,) = re.findall(rf"\(receptacleAtLocation {re.escape(dst)} (\S+)\)", problem)
    moved = problem.replace(f"(inReceptacle {obj} {src})", f"(inReceptacle {obj} {dst})")
    moved = re.sub(
        rf"\(objectAtLocation {re.escape(obj)} \S+\)", f"(objectAtLocation {obj} {where})", moved
    )
    engine = Engine()
    engine.load(path)
    names = engine.entity_names()
    a, b = names[src.lower()], names[dst.lower()]
    twin = {**data, "pddl_problem": moved}
    twin["walkthrough"] = [re.sub(rf"\b{a}\b", b, c) for c in data["walkthrough"]]
    roots = (out / "hidden_a", out / "hidden_b")
    for root, game in zip(roots, (data, twin), strict=True):
        shutil.copytree(data_dir / "train", root / "train")  # the same prior for both
        folder = root / "valid_seen" / path.parent.parent.name / path.parent.name
        shutil.copytree(path.parent, folder)
        (folder / GAME).write_text(json.dumps(game))
    return *roots, a, b


def test_decisions_and_reflections_never_read_where_things_hide(
    data_dir: Path, tmp_path: Path
) -> None:
    root_a, root_b, a, b = moved_copy(data_dir, tmp_path)
    envs = [
        AlfWorldEnv(AlfWorldOptions(data_dir=str(r), split="valid_seen")) for r in (root_a, root_b)
    ]
    for env in envs:
        env.reset(options={"game": 0})
    # The walkthrough knows: it heads for different receptacles in the two games.
    oracle = DEMONSTRATORS["oracle"]
    walkthrough_firsts = [e.menu[oracle.expert(e)] for e in envs]
    assert walkthrough_firsts[0] != walkthrough_firsts[1]
    demo = ObservableDemonstrator()
    assert demo.situation(envs[0]) == demo.situation(envs[1])
    steps = 0
    while True:
        sights = [sight_of(e) for e in envs]
        assert sights[0] == sights[1]  # menus included: nothing hidden leaks into them
        actions = [e.menu[demo.expert(e)] for e in envs]
        assert actions[0] == actions[1], steps
        for env in envs:
            env.step(env.menu.index(actions[0]))
        steps += 1
        reflections = [demo.describe(None, actions[0], e) for e in envs]
        if envs[0].last_feedback != envs[1].last_feedback:
            # Only looking at or into one of the two receptacles tells the games apart.
            assert actions[0] in {f"{verb} {r}" for verb in ("go to", "open") for r in (a, b)}
            # What it saw there, and only that, now sets the two games' plays apart.
            after = [e.menu[demo.expert(e)] for e in envs]
            assert after[0] != after[1] and any(c.startswith("take ") for c in after)
            break
        assert reflections[0] == reflections[1]
        assert steps < 50
    assert steps >= 2


def test_sft_data_with_the_observable_expert(data_dir: Path, tmp_path: Path) -> None:
    """`reflectrl data`'s writer with `data.expert=observable` (labels and prompts are checked
    against a replay by tests/test_alfworld.py's data test, on the config's default expert)."""
    from reflectrl.config import load_config
    from reflectrl.data.dataset import write_dataset

    assert load_config(REPO / "configs" / "alfworld.yaml").data.expert == "observable"
    config = load_config(
        REPO / "configs" / "alfworld.yaml",
        [
            f"env.options.data_dir={data_dir}",
            "env.options.task_types=[look]",  # a small room: few engine seconds per step
            "policy.model=tiny",
            "reflection.model=tiny",
            "data.expert=observable",
            "data.negative_rate=0.3",
        ],
    )
    stats = write_dataset(config, tmp_path / "data", episodes=3, seed=0, progress=False)
    rows = [
        json.loads(line) for line in (tmp_path / "data" / "data.jsonl").read_text().splitlines()
    ]
    assert stats["expert"] == "observable" and stats["episodes"] == 3 and rows
    assert stats["rows_sft"] == stats["rows_sft_reflection"] == stats["steps"] >= 3
    assert stats["lengths"]["reflection_tokens"]["max"] <= config.reflection.max_tokens
    reflections = [r["completion"] for r in rows if r["target"] == "sft_reflection"]
    assert reflections[0].startswith("Nothing searched yet; the task is to ")
    assert any("unsearched" in text for text in reflections)
    assert all(r["taken_action"].startswith("go to ") for r in rows if r["perturbed"])
    games = {Path(r["task"]) for r in rows}
    assert games and all(g.is_relative_to(data_dir / "train") for g in games)
