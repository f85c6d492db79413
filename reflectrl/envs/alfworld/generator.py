"""Solvable ALFWorld games from the package's own layouts, written offline, each one verified.

`generate_games` samples scenes (`scene.py`), writes each as the PDDL problem the alfworld engine
reads, writes its walkthrough from the plan it was built with, and replays that walkthrough
through the real engine before keeping the game. Games are laid out like the official data,
`OUT/<split>/<task>-<Obj>-None-<Recep>-<scene>/trial_.../{game.tw-pddl, traj_data.json,
initial_state.pddl}`, split by floor plan: the unseen floor plans only ever appear in
`valid_unseen`. Every random choice derives from (seed, split, index, attempt): reproducible.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from reflectrl.envs.alfworld import catalog
from reflectrl.envs.alfworld.engine import Engine, replay
from reflectrl.envs.alfworld.games import GAME_FILE, TRAJ_FILE, GameDataError
from reflectrl.envs.alfworld.scene import Scene, sample_scene
from reflectrl.envs.alfworld.tasks import DEFAULT_MAX_ACTIONS, TASK_TYPES
from reflectrl.errors import ConfigError

# ALFRED's unseen validation floor plans (one kitchen, living room, bedroom, bathroom).
UNSEEN_FLOOR_PLANS: tuple[int, ...] = (10, 219, 308, 424)
MAX_ATTEMPTS = 25  # draws per game slot before giving up on it
# Types the domain names in its own preconditions: the problem must declare them.
DOMAIN_OTYPES = ("Knife", "ButterKnife")
DOMAIN_RTYPES = ("SinkBasin", "Microwave", "Fridge")


@dataclass
class GenerationReport:
    kept: Counter[tuple[str, str]] = field(default_factory=Counter)  # (split, task type) -> games
    skipped: list[str] = field(default_factory=list)  # one line per discarded draw
    games: list[Path] = field(default_factory=list)


def mangle(alfred_id: str) -> str:
    """ALFRED id -> PDDL name, the inverse of alfworld's Demangler ("|" -> "_bar_", ...)."""
    for char, word in (("|", "_bar_"), ("-", "_minus_"), ("+", "_plus_"), (".", "_dot_")):
        alfred_id = alfred_id.replace(char, word)
    return alfred_id.replace(",", "_comma_")


def pddl_problem(scene: Scene, name: str) -> str:
    plan = scene.plan
    receptacles = plan.receptacles
    objects = sorted(scene.objects)
    otypes = sorted({o.split("|", 1)[0] for o in objects} | {scene.obj})
    rtypes = sorted({r.type for r in receptacles})
    locations = sorted({r.location for r in receptacles} | {scene.start})
    declared = ["agent1 - agent"]
    declared += [f"{mangle(loc)} - location" for loc in locations]
    declared += [f"{mangle(r.id)} - receptacle" for r in receptacles]
    declared += [f"{mangle(o)} - object" for o in objects]
    declared += [f"{t}Type - otype" for t in sorted(set(otypes) | set(DOMAIN_OTYPES))]
    declared += [f"{t}Type - rtype" for t in sorted(set(rtypes) | set(DOMAIN_RTYPES))]
    facts = [f"(atLocation agent1 {mangle(scene.start)})"]
    for r in receptacles:
        facts.append(f"(receptacleType {mangle(r.id)} {r.type}Type)")
        facts.append(f"(receptacleAtLocation {mangle(r.id)} {mangle(r.location)})")
        if r.openable:
            facts.append(f"(openable {mangle(r.id)})")
    for oid in objects:
        otype, where = oid.split("|", 1)[0], scene.objects[oid]
        name_o = mangle(oid)
        facts.append(f"(objectType {name_o} {otype}Type)")
        facts.append(f"(inReceptacle {name_o} {mangle(where.id)})")
        facts.append(f"(objectAtLocation {name_o} {mangle(where.location)})")
        if otype in catalog.LAMP_TYPES:
            facts.append(f"(toggleable {name_o})")
            continue
        facts.append(f"(pickupable {name_o})")
        if catalog.is_receptacle_object(otype):
            facts.append(f"(isReceptacleObject {name_o})")
        for prop, predicate in (
            ("Cleanable", "cleanable"),
            ("Heatable", "heatable"),
            ("Coolable", "coolable"),
            ("Sliceable", "sliceable"),
        ):
            if catalog.has_property(otype, prop):
                facts.append(f"({predicate} {name_o})")
    for rt in rtypes:
        for ot in otypes:
            if catalog.can_hold(rt, ot):
                facts.append(f"(canContain {rt}Type {ot}Type)")
    goal = catalog.goal_pddl(scene.task_type, scene.obj, scene.recep, scene.toggle)
    body = "\n        ".join(declared)
    init = "\n        ".join(facts)
    return (
        f"(define (problem {name})\n(:domain alfred)\n(:objects\n        {body}\n        )\n"
        f"(:init\n        {init}\n        )\n{goal}"
    )


def plan_steps(scene: Scene) -> list[tuple[str, ...]]:
    """The walkthrough as (verb, ALFRED ids...): the direct way to the goal, never searching."""
    steps: list[tuple[str, ...]] = []
    at: str | None = None
    opened: set[str] = set()

    def reach(r: catalog.Receptacle) -> None:
        nonlocal at
        if at != r.id:
            steps.append(("go to", r.id))
            at = r.id
        if r.openable and r.id not in opened:
            steps.append(("open", r.id))
            opened.add(r.id)

    for oid in scene.targets:
        source = scene.objects[oid]
        reach(source)
        steps.append(("take", oid, source.id))
        if scene.appliance is not None:
            verb = {"SinkBasin": "clean", "Microwave": "heat", "Fridge": "cool"}
            if at != scene.appliance.id:  # only needs the agent there, not an open door
                steps.append(("go to", scene.appliance.id))
                at = scene.appliance.id
            steps.append((verb[scene.appliance.type], oid, scene.appliance.id))
        if scene.goal is not None:
            reach(scene.goal)
            steps.append(("move", oid, scene.goal.id))
    if scene.lamp:
        surface = scene.objects[scene.lamp]
        if at != surface.id:
            steps.append(("go to", surface.id))
        steps.append(("use", scene.lamp))
    return steps


def render_step(step: tuple[str, ...], names: dict[str, str]) -> str:
    """("take", apple id, counter id) -> "take apple 1 from countertop 2" (the grammar's words)."""
    verb, *ids = step
    shown = [names[mangle(i).lower()] for i in ids]
    if verb in ("go to", "open", "use"):
        return f"{verb} {shown[0]}"
    joiner = {"take": "from", "move": "to"}.get(verb, "with")
    return f"{verb} {shown[0]} {joiner} {shown[1]}"


def task_text(scene: Scene, rng: random.Random) -> str:
    template = rng.choice(catalog.goal_templates(scene.task_type))
    return template.format(
        obj=scene.obj.lower(), recep=scene.recep.lower(), toggle=scene.toggle.lower(), mrecep=""
    )


@cache
def _logic_files() -> tuple[str, str]:
    data_dir = catalog.package_dir() / "data"
    return (data_dir / "alfred.pddl").read_text(), (data_dir / "alfred.twl2").read_text()


def build_game(scene: Scene, task: str, engine: Engine, name: str) -> dict[str, Any]:
    """The game file's content, loaded into `engine`: the engine names the objects ("apple 2"),
    and the walkthrough is written with those names."""
    domain, grammar = _logic_files()
    data: dict[str, Any] = {
        "pddl_domain": domain,
        "grammar": grammar.replace("UNKNOWN GOAL", task),  # as alfworld's add_task_to_grammar
        "pddl_problem": pddl_problem(scene, name),
        "solvable": False,
        "walkthrough": None,
    }
    engine.load(data, name=name)
    names = engine.entity_names()
    data["walkthrough"] = [render_step(s, names) for s in plan_steps(scene)]
    return data


def traj_data(
    scene: Scene, task: str, walkthrough_length: int, meta: dict[str, Any]
) -> dict[str, Any]:
    """The metadata alfworld's env classes read (task_type, pddl_params, scene, annotations)."""
    return {
        "task_id": meta["trial"],
        "task_type": scene.task_type,
        "pddl_params": {
            "object_target": scene.obj,
            "parent_target": scene.recep,
            "toggle_target": scene.toggle,
            "mrecep_target": "",
            "object_sliced": False,
        },
        "scene": {"floor_plan": scene.plan.name, "scene_num": scene.plan.number},
        "turk_annotations": {"anns": [{"task_desc": task, "assignment_id": "reflectrl-gen"}]},
        "reflectrl": {**meta, "walkthrough_length": walkthrough_length},
    }


def split_counts(n: int, valid_seen: float, valid_unseen: float) -> dict[str, int]:
    seen, unseen = round(n * valid_seen), round(n * valid_unseen)
    counts = {"train": n - seen - unseen, "valid_seen": seen, "valid_unseen": unseen}
    if counts["train"] < 0 or min(valid_seen, valid_unseen) < 0:
        raise ConfigError(f"split fractions {valid_seen} + {valid_unseen} leave no train games")
    return counts


def generate_games(
    out: Path,
    n: int,
    seed: int,
    task_types: Sequence[str] = TASK_TYPES,
    *,
    valid_seen: float = 0.1,
    valid_unseen: float = 0.1,
    unseen_floor_plans: Sequence[int] = UNSEEN_FLOOR_PLANS,
    max_actions: int = DEFAULT_MAX_ACTIONS,
    progress: Callable[[str], None] | None = None,
) -> GenerationReport:
    """Write `n` verified games under `out` (which must be empty or absent)."""
    if n < 1:
        raise ConfigError(f"--n must be at least 1 (got {n})")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"{out} already exists and is not empty; choose a new folder")
    plans = catalog.floor_plans()
    unknown = [p for p in unseen_floor_plans if p not in plans]
    if unknown:
        raise ConfigError(
            f"unknown floor plan {unknown[0]}; valid: 1-30, 201-230, 301-330, 401-430"
        )
    unseen = [plans[p] for p in sorted(set(unseen_floor_plans))]
    seen = [p for num, p in sorted(plans.items()) if num not in set(unseen_floor_plans)]
    writer = _Writer(out, seed, max_actions)
    for split, count in split_counts(n, valid_seen, valid_unseen).items():
        for index in range(count):
            task_type = task_types[index % len(task_types)]  # balanced task types per split
            path = writer.game(split, index, task_type, unseen if split == "valid_unseen" else seen)
            if progress:
                progress(f"{split} {index + 1}/{count}: {path.relative_to(out)}")
    return writer.report


def ensure_games(
    out: Path, n: int, seed: int, *, valid_seen: float = 0.1, valid_unseen: float = 0.1
) -> Path:
    """`out`, with `n` games generated there first when it does not exist yet. They are made
    in a sibling folder and renamed into place, so a reader (another worker starting at the
    same time) never sees a half-written set."""
    import shutil
    import tempfile

    if out.is_dir():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}-"))
    print(f"alfworld: generating {n} verified games into {out} (~2 s each)", flush=True)
    made = 0

    def every_tenth(line: str) -> None:
        nonlocal made
        made += 1
        if made % 10 == 0 or made == n:
            print(f"alfworld: {made}/{n} games", flush=True)

    try:
        generate_games(
            staging / "games",
            n,
            seed,
            valid_seen=valid_seen,
            valid_unseen=valid_unseen,
            progress=every_tenth,
        )
        try:
            (staging / "games").rename(out)
        except OSError:
            if not out.is_dir():  # not another process that finished first
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


class _Writer:
    """Draws, verifies and writes games one slot at a time, with one engine for all of them."""

    def __init__(self, out: Path, seed: int, max_actions: int) -> None:
        self.out, self.seed, self.max_actions = out, seed, max_actions
        self.engine = Engine()
        self.report = GenerationReport()
        self.problems: set[str] = set()  # digests of kept problems, across all splits

    def game(self, split: str, index: int, task_type: str, plans: list[catalog.FloorPlan]) -> Path:
        for attempt in range(MAX_ATTEMPTS):
            path = self._attempt(split, index, attempt, task_type, plans)
            if path is not None:
                self.report.games.append(path)
                self.report.kept[(split, task_type)] += 1
                return path
        raise ConfigError(
            f"could not generate a verified {task_type} game for {split} in {MAX_ATTEMPTS} "
            "draws (see the skipped lines)"
        )

    def _attempt(
        self, split: str, index: int, attempt: int, task_type: str, plans: list[catalog.FloorPlan]
    ) -> Path | None:
        rng = random.Random(f"reflectrl-alfworld:{self.seed}:{split}:{index}:{attempt}")
        scene = sample_scene(task_type, plans, rng)
        if scene is None:
            return None
        trial = f"trial_R{self.seed}_{split}_{index:05d}"
        where = f"{split}/{scene.family}-{scene.plan.number}/{trial} (attempt {attempt})"
        task = task_text(scene, rng)
        try:
            data = build_game(scene, task, self.engine, name=f"{scene.family}-{trial}")
        except GameDataError as err:
            self.report.skipped.append(f"{where}: {err}")
            return None
        # The same scene drawn twice (the problem's name aside) would leak between splits.
        digest = hashlib.sha256(data["pddl_problem"].split("\n", 1)[1].encode()).hexdigest()
        if digest in self.problems:
            self.report.skipped.append(f"{where}: duplicate of an earlier game")
            return None
        result = replay(self.engine, data["walkthrough"], self.max_actions)  # loaded above
        if not result.ok:
            self.report.skipped.append(f"{where}: {result.reason}")
            return None
        self.problems.add(digest)
        data["solvable"] = True
        meta = {"seed": self.seed, "split": split, "index": index, "attempt": attempt}
        meta["trial"] = trial
        folder = self.out / split / f"{scene.family}-{scene.plan.number}" / trial
        folder.mkdir(parents=True)
        (folder / GAME_FILE).write_text(json.dumps(data))
        metadata = traj_data(scene, task, len(data["walkthrough"]), meta)
        (folder / TRAJ_FILE).write_text(json.dumps(metadata, indent=1))
        (folder / "initial_state.pddl").write_text(data["pddl_problem"])
        return folder / GAME_FILE
