"""What the `alfworld` package ships about its 120 floor plans, read into plain data.

Per floor plan the package has `FloorPlanN-openable.json` (receptacle ids with the agent pose to
interact with them), `FloorPlanN-objects.json` (the object and receptacle types of the scene) and
`FloorPlanN-layout.npy` (reachable floor points). `alfworld.gen.constants` holds which object
fits in which receptacle, which objects can be cleaned/heated/cooled/toggled, and which rooms
each task type is valid in. Nothing here is invented except where noted (`_extra_receptacles`).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import random
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from reflectrl.errors import ReflectRLError

ROOMS = {0: "Kitchen", 2: "LivingRoom", 3: "Bedroom", 4: "Bathroom"}  # by floor plan // 100
# Surfaces a lamp can stand on: the PDDL's ToggleObject needs the lamp inside a receptacle.
LAMP_SURFACES = ("SideTable", "Desk", "Dresser", "Shelf", "CoffeeTable", "DiningTable", "TVStand")
LAMP_TYPES = ("DeskLamp", "FloorLamp")


@dataclass(frozen=True)
class Receptacle:
    id: str  # ALFRED id: "Cabinet|+00.68|+00.50|-02.20", "Sink|+00.71|+00.82|-01.25|SinkBasin"
    type: str  # "Cabinet", "SinkBasin"
    location: str  # "loc|x|z|rotation|horizon", unique per receptacle of a floor plan
    openable: bool


@dataclass(frozen=True)
class FloorPlan:
    number: int
    receptacles: tuple[Receptacle, ...]
    object_types: tuple[str, ...]  # pickupable types of the scene that some receptacle here holds
    lamp_types: tuple[str, ...]  # toggleable lamps of the scene
    free_points: tuple[tuple[int, int], ...]  # reachable grid points (x, z) with no receptacle

    @property
    def name(self) -> str:
        return f"FloorPlan{self.number}"

    @property
    def room(self) -> str:
        return ROOMS[self.number // 100]

    def receptacle_types(self) -> set[str]:
        return {r.type for r in self.receptacles}


def package_dir() -> Path:
    # find_spec does not execute alfworld/__init__ (which creates $ALFWORLD_DATA as a side effect).
    spec = importlib.util.find_spec("alfworld")
    if spec is None or not spec.submodule_search_locations:
        raise ReflectRLError("the alfworld package is not installed; run `make install`")
    return Path(next(iter(spec.submodule_search_locations)))


def import_alfworld(module: str) -> Any:
    """Import an alfworld module without keeping alfworld's side effect on the environment:
    `alfworld.info` sets ALFWORLD_DATA to its cache folder when unset, and an unset
    ALFWORLD_DATA must keep meaning "no data path given" for our envs."""
    was_set = "ALFWORLD_DATA" in os.environ
    loaded = importlib.import_module(module)
    if not was_set:
        os.environ.pop("ALFWORLD_DATA", None)
    return loaded


@cache
def constants() -> Any:
    return import_alfworld("alfworld.gen.constants")


@cache
def pickupable_types() -> frozenset[str]:
    """Every object type some receptacle can hold, without ALFRED's sliced variants."""
    c = constants()
    held = set().union(*c.VAL_RECEPTACLE_OBJECTS.values())
    return frozenset(t for t in held if not t.endswith("Sliced"))


def can_hold(receptacle_type: str, object_type: str) -> bool:
    return object_type in constants().VAL_RECEPTACLE_OBJECTS.get(receptacle_type, ())


def has_property(object_type: str, prop: str) -> bool:
    """prop: Heatable, Coolable, Cleanable, Toggleable, Sliceable (ALFRED's VAL_ACTION_OBJECTS)."""
    return object_type in constants().VAL_ACTION_OBJECTS[prop]


def is_receptacle_object(object_type: str) -> bool:
    return object_type in constants().MOVABLE_RECEPTACLES_SET


def is_openable(receptacle_type: str) -> bool:
    return receptacle_type in constants().OPENABLE_CLASS_SET


def valid_rooms(task_type: str) -> set[str]:
    return set(constants().GOALS_VALID[task_type])


def goal_pddl(task_type: str, obj: str, recep: str, toggle: str = "") -> str:
    """The package's goal for the task, closing the problem's `(define` too."""
    goals = import_alfworld("alfworld.gen.goal_library")
    # The library writes `#` for PDDL's `-` in typed variables.
    text = goals.gdict[task_type]["pddl"].format(obj=obj, recep=recep, toggle=toggle, mrecep="")
    return text.replace("#", "-")


def goal_templates(task_type: str) -> list[str]:
    goals = import_alfworld("alfworld.gen.goal_library")
    return list(goals.gdict[task_type]["templates"])


def receptacle_type(receptacle_id: str) -> str:
    parts = receptacle_id.split("|")
    return parts[-1] if len(parts) > 4 else parts[0]  # "Sink|x|y|z|SinkBasin" -> SinkBasin


def rendered_prefix(receptacle_id: str) -> str:
    """The name alfworld's Demangler shows for this id (without the number)."""
    name = receptacle_id.split("|", 1)[0].lower()
    return name + "basin" if "basin" in receptacle_id.lower() else name


def _grid_location(pose: list[float]) -> tuple[int, int, int, int]:
    x, z, rotation, horizon = pose
    return round(x / 0.25), round(z / 0.25), round(rotation / 90) % 4, round(horizon)


@cache
def floor_plans() -> dict[int, FloorPlan]:
    layouts = package_dir() / "gen" / "layouts"
    numbers = sorted(
        int(p.name[len("FloorPlan") : -len("-openable.json")])
        for p in layouts.glob("FloorPlan*-openable.json")
    )
    if not numbers:
        raise ReflectRLError(f"no floor-plan layouts in {layouts}; reinstall alfworld")
    return {n: _load_floor_plan(layouts, n) for n in numbers}


def _load_floor_plan(layouts: Path, number: int) -> FloorPlan:
    import numpy as np

    c = constants()
    stem = layouts / f"FloorPlan{number}"
    poses: dict[str, list[float]] = json.loads(Path(f"{stem}-openable.json").read_text())
    scene_types: list[str] = json.loads(Path(f"{stem}-objects.json").read_text())
    points = np.load(f"{stem}-layout.npy")
    static = c.RECEPTACLES - c.MOVABLE_RECEPTACLES_SET
    used: set[str] = set()

    def unique_location(grid: tuple[int, int, int, int]) -> str:
        # One location per receptacle: the engine's "go to" then names a single receptacle.
        base = "loc|" + "|".join(str(v) for v in grid)
        name, k = base, 1
        while name in used:
            name, k = f"{base}|{k}", k + 1
        used.add(name)
        return name

    receptacles = []
    for rid in sorted(poses):
        rtype = receptacle_type(rid)
        # Skip layout quirks whose rendered name would not match their type
        # (e.g. "Bathtub|...|SinkBasin" would show as "bathtubbasin" but act as a sink).
        if rtype not in static or rendered_prefix(rid) != rtype.lower():
            continue
        location = unique_location(_grid_location(poses[rid]))
        receptacles.append(Receptacle(rid, rtype, location, is_openable(rtype)))
    grid_points = sorted({(round(x / 0.25), round(z / 0.25)) for x, z in points.tolist()})
    taken = {tuple(int(v) for v in r.location.split("|")[1:3]) for r in receptacles}
    free = [p for p in grid_points if p not in taken]
    receptacles += _extra_receptacles(number, scene_types, receptacles, free, static)
    receptacles.sort(key=lambda r: r.id)
    types = {r.type for r in receptacles}
    objects = sorted(
        t for t in set(scene_types) & pickupable_types() if any(can_hold(rt, t) for rt in types)
    )
    lamps = sorted(t for t in set(scene_types) & set(LAMP_TYPES) if types & set(LAMP_SURFACES))
    return FloorPlan(number, tuple(receptacles), tuple(objects), tuple(lamps), tuple(free))


def _extra_receptacles(
    number: int,
    scene_types: list[str],
    receptacles: list[Receptacle],
    free: list[tuple[int, int]],
    static: set[str],
) -> list[Receptacle]:
    """Receptacle types the scene lists (stove burner, coffee machine, toaster, garbage can, ...)
    but the layout gives no interaction pose for: one instance each, at a reachable floor point
    picked by a fixed per-plan seed (so every run builds the same floor plan)."""
    present = {r.type for r in receptacles}
    missing = sorted(t for t in set(scene_types) & static if t not in present)
    rng = random.Random(f"reflectrl-alfworld-floorplan-{number}")
    extra = []
    for rtype in missing:
        if not free or rtype in ("SinkBasin", "BathtubBasin"):
            continue  # a basin's id needs its parent sink/bathtub, which the layout lacks
        gx, gz = free.pop(rng.randrange(len(free)))
        rid = f"{rtype}|{gx * 0.25:+06.2f}|+00.90|{gz * 0.25:+06.2f}"
        location = f"loc|{gx}|{gz}|0|30|x"  # the suffix keeps it apart from layout poses
        extra.append(Receptacle(rid, rtype, location, is_openable(rtype)))
    return extra
