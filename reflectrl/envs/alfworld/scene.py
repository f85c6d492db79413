"""Sampling one game: a floor plan, a task, and where every object starts.

Follows the package's constraints: the rooms each task type is valid in (`GOALS_VALID`), which
receptacle holds which object (`VAL_RECEPTACLE_OBJECTS`), which objects can be cleaned, heated,
cooled or toggled (`VAL_ACTION_OBJECTS`). Sliced objects and movable receptacles as targets are
left out, as ALFWorld's text games leave them out. All choices come from the given `rng`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from reflectrl.envs.alfworld import catalog
from reflectrl.envs.alfworld.catalog import FloorPlan, Receptacle

MAX_OBJECTS_PER_RECEPTACLE = 5  # keeps "take X from Y" menus short on crowded counter tops
DISTRACTOR_TYPE_PROBABILITY = 0.5
# The appliance each state-change task needs, and which target receptacle type that rules out
# (cleaning something to leave it in the sink, or heating it to leave it in the microwave, would
# make the task trivial).
APPLIANCE = {
    "pick_clean_then_place_in_recep": ("SinkBasin", "Cleanable"),
    "pick_heat_then_place_in_recep": ("Microwave", "Heatable"),
    "pick_cool_then_place_in_recep": ("Fridge", "Coolable"),
}


@dataclass
class Scene:
    task_type: str
    plan: FloorPlan
    obj: str  # the target object type, e.g. "Apple"
    recep: str  # the target receptacle type ("" for look_at_obj_in_light)
    toggle: str  # the lamp type for look_at_obj_in_light, else ""
    start: str  # the agent's start location (a floor point with no receptacle)
    objects: dict[str, Receptacle] = field(default_factory=dict)  # object id -> where it is
    targets: list[str] = field(default_factory=list)  # object ids the walkthrough moves
    goal: Receptacle | None = None  # the receptacle instance the walkthrough fills
    appliance: Receptacle | None = None  # sink basin / microwave / fridge used on the way
    lamp: str = ""  # the lamp's object id (look_at_obj_in_light)

    @property
    def family(self) -> str:
        """ALFWorld's folder name without the scene: `<task>-<Obj>-<MRecep>-<Recep>`."""
        return f"{self.task_type}-{self.obj}-None-{self.recep or self.toggle}"


def candidate_plans(task_type: str, plans: list[FloorPlan]) -> list[FloorPlan]:
    rooms = catalog.valid_rooms(task_type)
    return [p for p in plans if p.room in rooms and _targets(task_type, p)]


def sample_scene(task_type: str, plans: list[FloorPlan], rng: random.Random) -> Scene | None:
    """One scene of the task type in one of `plans`, or None when this draw does not fit."""
    candidates = candidate_plans(task_type, plans)
    if not candidates:
        return None
    plan = rng.choice(candidates)
    obj, recep, toggle = rng.choice(_targets(task_type, plan))
    gx, gz = rng.choice(plan.free_points)
    start = f"loc|{gx}|{gz}|{rng.randrange(4)}|30|start"
    scene = Scene(task_type, plan, obj, recep, toggle, start)
    if not _place_objects(scene, rng):
        return None
    instances = [oid for oid in scene.objects if oid.split("|", 1)[0] == obj]
    scene.targets = rng.sample(instances, 2 if task_type == "pick_two_obj_and_place" else 1)
    if recep:
        scene.goal = rng.choice([r for r in plan.receptacles if r.type == recep])
    if task_type in APPLIANCE:
        kind = APPLIANCE[task_type][0]
        scene.appliance = rng.choice([r for r in plan.receptacles if r.type == kind])
    if toggle:
        surfaces = [r for r in plan.receptacles if r.type in catalog.LAMP_SURFACES]
        surface = rng.choice(surfaces)
        scene.lamp = _object_id(toggle, surface, set(scene.objects))
        scene.objects[scene.lamp] = surface
    return scene


def _targets(task_type: str, plan: FloorPlan) -> list[tuple[str, str, str]]:
    """Every valid (object type, receptacle type, lamp type) of the task in this plan, sorted."""
    types = plan.receptacle_types()
    if task_type == "look_at_obj_in_light":
        return [
            (o, "", lamp)
            for o in plan.object_types
            for lamp in plan.lamp_types
            if _sources(plan, o, "")
        ]
    prop = None
    if task_type in APPLIANCE:
        appliance, prop = APPLIANCE[task_type]
        if appliance not in types:
            return []
    found = []
    for o in plan.object_types:
        if prop and not catalog.has_property(o, prop):
            continue
        for r in sorted(types):
            if task_type in APPLIANCE and r in (APPLIANCE[task_type][0], "BathtubBasin"):
                continue
            if catalog.can_hold(r, o) and _sources(plan, o, r):
                found.append((o, r, ""))
    return found


def _sources(plan: FloorPlan, obj: str, goal_type: str) -> list[Receptacle]:
    """Where an object of the target type may start: never in a receptacle of the goal's type,
    or the game could be won (or half won) before the first command."""
    return [r for r in plan.receptacles if r.type != goal_type and catalog.can_hold(r.type, obj)]


def _place_objects(scene: Scene, rng: random.Random) -> bool:
    plan = scene.plan
    counts: dict[str, int] = {}
    target_count = rng.randint(2, 3) if scene.task_type == "pick_two_obj_and_place" else None
    for otype in plan.object_types:  # sorted: the draw order is fixed
        if otype == scene.obj:
            n = target_count or rng.randint(1, 2)
        elif rng.random() < DISTRACTOR_TYPE_PROBABILITY:
            n = rng.randint(1, 2)
        else:
            continue
        # Every object of the target type stays out of the goal's receptacle type.
        sources = _sources(plan, otype, scene.recep if otype == scene.obj else "")
        for _ in range(n):
            free = [r for r in sources if counts.get(r.id, 0) < MAX_OBJECTS_PER_RECEPTACLE]
            if not free:
                if otype == scene.obj:
                    return False
                break
            where = rng.choice(free)
            counts[where.id] = counts.get(where.id, 0) + 1
            scene.objects[_object_id(otype, where, set(scene.objects))] = where
    return True


def _object_id(otype: str, where: Receptacle, taken: set[str]) -> str:
    """An ALFRED-style id, `Apple|+01.00|+00.90|-02.00`, near its receptacle and unique."""
    x, y, z = (float(v) for v in where.id.split("|")[1:4])
    k = 0
    while True:
        oid = f"{otype}|{x + 0.07 * k:+06.2f}|{y + 0.05:+06.2f}|{z - 0.03 * k:+06.2f}"
        if oid not in taken:
            return oid
        k += 1
