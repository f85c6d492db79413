"""ALFWorld's observable expert: it searches as an agent could, without knowing where things are.

It decides from what the agent sees and did: the task text, the receptacles the room
description names, its own (command, engine text) history and the current menu, plus
statistics of the training split (`ReceptaclePrior`: how often training games start an object
type in a receptacle type, and how often receptacles of a type are closed). It never reads
the game's state; `expert.py` (the walkthrough) is the oracle that does.

Each step:
0. the screen shows the task done (nothing left to do: "look");
1. holding the task's object: carry out the task type's steps (clean it at a sink basin, heat
   it at a microwave, cool it at a fridge; for "look at" tasks turn on a lamp it has seen,
   searching for one if none was seen; else go to a receptacle of the goal type, open it if
   closed, put the object there);
2. else take an object of the task's type in view here (for two-object tasks, one not already
   in the goal), or go back to where one was seen;
3. else search: the unsearched receptacle with the best chance of holding the object (by the
   prior) per step it costs (a "go to", plus an "open" where the type is usually closed).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache

from reflectrl.envs.alfworld import catalog
from reflectrl.envs.alfworld.prior import ReceptaclePrior
from reflectrl.errors import ReflectRLError

__all__ = ["ReceptaclePrior", "Sight", "decide", "explore", "parse_goal"]

NAME = r"[a-z]+ \d+"  # what the engine calls every object and receptacle: "apple 2"
# Task type -> (receptacle type of the appliance, its verb); only these three change state.
APPLIANCES = {
    "pick_clean_then_place_in_recep": ("sinkbasin", "clean"),
    "pick_heat_then_place_in_recep": ("microwave", "heat"),
    "pick_cool_then_place_in_recep": ("fridge", "cool"),
}
LOOK = "look_at_obj_in_light"
TWO = "pick_two_obj_and_place"


class ExplorerError(ReflectRLError):
    """The task text matches none of ALFWorld's goal templates: no plan to follow."""


@dataclass(frozen=True)
class Goal:
    task_type: str
    obj: str  # object type as the engine writes it: "apple", "butterknife"
    recep: str  # goal receptacle type ("" for look_at_obj_in_light)
    toggle: str  # lamp type for look_at_obj_in_light, else ""


@cache
def _goal_patterns() -> tuple[tuple[str, re.Pattern[str]], ...]:
    patterns = []
    for task_type in (*APPLIANCES, "pick_and_place_simple", LOOK, TWO):
        for template in catalog.goal_templates(task_type):
            text = re.escape(template.rstrip(".").strip())
            for key in ("obj", "recep", "toggle"):
                text = text.replace(re.escape(f"{{{key}}}"), f"(?P<{key}>[a-z]+)")
            patterns.append((task_type, re.compile(text)))
    return tuple(patterns)


def parse_goal(task: str) -> Goal:
    """The task text ("put a hot apple in fridge") -> its type and object types, by ALFWorld's
    own goal templates (the text is all the agent is told)."""
    text = task.strip().rstrip(".").lower()
    for task_type, pattern in _goal_patterns():
        match = pattern.fullmatch(text)
        if match:
            parts = match.groupdict()
            return Goal(task_type, parts["obj"], parts.get("recep", ""), parts.get("toggle", ""))
    raise ExplorerError(f"task {task!r} matches no ALFWorld goal template")


def kind(name: str) -> str:
    """A name's type: "cabinet 12" -> "cabinet"."""
    return name.rsplit(" ", 1)[0]


def names_in(text: str) -> tuple[str, ...]:
    """The names an engine list shows ("a mug 1, a apple 2, and a cabinet 3")."""
    return tuple(re.findall(rf"\b(?:a|an|some) ({NAME})", text))


def _natural(name: str) -> tuple[str, int]:
    base, _, number = name.rpartition(" ")
    return base, int(number) if number.isdigit() else 0


_CONTENTS = re.compile(
    rf"(?:On the ({NAME}), you see|The ({NAME}) is open\. In it, you see) ([^.]*)\."
)
_CLOSED = re.compile(rf"The ({NAME}) is closed\.")


@dataclass(frozen=True)
class Sight:
    """What the agent knows at a step: the task, the room, its own history and the menu, and
    what follows from them alone."""

    task: str
    receptacles: tuple[str, ...]  # named in the room description, in natural order
    history: tuple[tuple[str, str], ...]  # (command, engine text), oldest first
    menu: tuple[str, ...]
    location: str | None = None  # the receptacle it last went to
    holding: str | None = None
    opened: frozenset[str] = frozenset()  # receptacles it opened (and has not closed since)
    closed: frozenset[str] = frozenset()  # seen closed and not opened since
    seen: dict[str, tuple[str, ...]] = field(default_factory=dict)  # receptacle -> contents
    changed: frozenset[str] = frozenset()  # objects it cleaned, heated or cooled
    lamps_on: frozenset[str] = frozenset()

    @classmethod
    def observe(
        cls,
        task: str,
        description: str,
        history: Iterable[tuple[str, str]],
        menu: Sequence[str],
    ) -> Sight:
        history = tuple(history)
        location: str | None = None
        holding: str | None = None
        opened: set[str] = set()
        closed: set[str] = set()
        seen: dict[str, tuple[str, ...]] = {}
        changed: set[str] = set()
        lamps: set[str] = set()
        for command, text in history:
            if command.startswith("go to ") and text.startswith("You arrive at"):
                location = command[len("go to ") :]
            for match in _CONTENTS.finditer(text):
                where = match.group(1) or match.group(2)
                seen[where] = names_in(match.group(3))
                closed.discard(where)
            for match in _CLOSED.finditer(text):
                closed.add(match.group(1))
                opened.discard(match.group(1))
            if m := re.match(rf"You open the ({NAME})\.", text):
                opened.add(m.group(1))
            elif m := re.match(rf"You close the ({NAME})\.", text):
                opened.discard(m.group(1))
                closed.add(m.group(1))
            elif m := re.match(rf"You pick up the ({NAME}) from the ({NAME})\.", text):
                holding = m.group(1)
                seen[m.group(2)] = tuple(o for o in seen.get(m.group(2), ()) if o != holding)
            elif m := re.match(rf"You move the ({NAME}) to the ({NAME})\.", text):
                holding = None
                seen[m.group(2)] = (*seen.get(m.group(2), ()), m.group(1))
            elif m := re.match(rf"You (?:clean|heat|cool) the ({NAME}) using", text):
                changed.add(m.group(1))
            elif m := re.match(rf"You turn (on|off) the ({NAME})\.", text):
                (lamps.add if m.group(1) == "on" else lamps.discard)(m.group(2))
        return cls(
            task=task,
            receptacles=tuple(sorted(set(names_in(description)), key=_natural)),
            history=history,
            menu=tuple(menu),
            location=location,
            holding=holding,
            opened=frozenset(opened),
            closed=frozenset(closed),
            seen=seen,
            changed=frozenset(changed),
            lamps_on=frozenset(lamps),
        )

    def where_seen(self, obj_type: str) -> list[tuple[str, str]]:
        """(object, receptacle) for every object of the type it last saw, in natural order."""
        return [
            (o, r)
            for r in sorted(self.seen, key=_natural)
            for o in self.seen[r]
            if kind(o) == obj_type
        ]

    def unsearched(self) -> list[str]:
        return [r for r in self.receptacles if r not in self.seen]

    def summary(self) -> str:
        """What the whole episode has shown, in a few lines: every fact `decide` reads besides
        the task, the room and the menu (where it is, what it holds, what each searched
        receptacle held, what is closed or open, what it cleaned, heated or cooled, the lamps
        it turned on, what it has not searched). A prompt that shows only the last few pairs
        carries the rest of the episode in it (`env.options.memory`)."""

        def listed(names: Iterable[str]) -> str:
            return ", ".join(sorted(names, key=_natural)) or "none"

        searched = [
            f"{r} ({', '.join(self.seen[r]) or 'empty'})" for r in sorted(self.seen, key=_natural)
        ]
        return "\n".join(
            [
                f"At: {self.location or 'the start'}. Holding: {self.holding or 'nothing'}.",
                f"Searched: {'; '.join(searched) or 'none'}.",
                f"Not searched: {listed(self.unsearched())}.",
                f"Closed: {listed(self.closed)}. Opened: {listed(self.opened)}.",
                f"Cleaned, heated or cooled: {listed(self.changed)}. "
                f"Turned on: {listed(self.lamps_on)}.",
            ]
        )


@dataclass(frozen=True)
class Decision:
    command: str
    why: str  # a few words for the reflection: what the command is for


def explore(sight: Sight, prior: ReceptaclePrior) -> str:
    """The next command (one of the menu's) from what the agent sees."""
    return decide(sight, prior).command


def decide(sight: Sight, prior: ReceptaclePrior) -> Decision:
    goal = parse_goal(sight.task)
    if goal_met(sight, goal):  # the engine ends a won game; this only words the last reflection
        return Decision("look" if "look" in sight.menu else sight.menu[0], "the task is done")
    held = sight.holding
    if held is not None and kind(held) == goal.obj:
        step = _carry(sight, goal, held, prior)
        if step is not None:
            return step
    elif held is not None:  # not the task's object: put it down here to free the hands
        here = sight.location or ""
        if f"move {held} to {here}" in sight.menu:
            return Decision(f"move {held} to {here}", f"the hands must be free for a {goal.obj}")
    return _fetch(sight, goal, prior, goal.obj, take=held is None)


def goal_met(sight: Sight, goal: Goal) -> bool:
    """Does what the agent saw and did meet the goal?"""
    if goal.task_type == LOOK:
        held, here = sight.holding, sight.location
        lit = [o for o, r in sight.where_seen(goal.toggle) if r == here and o in sight.lamps_on]
        return held is not None and kind(held) == goal.obj and bool(lit)
    need = 2 if goal.task_type == TWO else 1
    return any(
        sum(
            kind(o) == goal.obj and (goal.task_type not in APPLIANCES or o in sight.changed)
            for o in objects
        )
        >= need
        for r, objects in sight.seen.items()
        if kind(r) == goal.recep
    )


def _carry(sight: Sight, goal: Goal, held: str, prior: ReceptaclePrior) -> Decision | None:
    here = sight.location or ""
    if goal.task_type in APPLIANCES and held not in sight.changed:
        appliance, verb = APPLIANCES[goal.task_type]
        command = f"{verb} {held} with {here}"
        if kind(here) == appliance and command in sight.menu:
            return Decision(command, f"the {goal.obj} must be {verb}ed here")
        return _go_to_one(sight, appliance, f"the {goal.obj} must be {verb}ed at a {appliance}")
    if goal.task_type == LOOK:
        for obj, where in sight.where_seen(goal.toggle):
            if where == here and f"use {obj}" in sight.menu and obj not in sight.lamps_on:
                return Decision(f"use {obj}", f"the {obj} here can light the {goal.obj}")
            if where != here and f"go to {where}" in sight.menu:
                return Decision(f"go to {where}", f"{obj} was seen on {where}")
        return _fetch(sight, goal, prior, goal.toggle, take=False)
    # Two-object tasks need both in one receptacle: prefer the one already holding one.
    goals = [r for r in sight.receptacles if kind(r) == goal.recep]
    goals.sort(key=lambda r: not any(kind(o) == goal.obj for o in sight.seen.get(r, ())))
    for target in goals:
        if target == here:
            if f"move {held} to {here}" in sight.menu:
                return Decision(f"move {held} to {here}", f"the {goal.obj} goes in {here}")
            if f"open {here}" in sight.menu:
                return Decision(f"open {here}", f"the {goal.obj} goes inside {here}")
        elif f"go to {target}" in sight.menu:
            return Decision(f"go to {target}", f"the {goal.obj} goes in a {goal.recep}")
    return None


def _go_to_one(sight: Sight, receptacle_type: str, why: str) -> Decision | None:
    for r in sight.receptacles:
        if kind(r) == receptacle_type and f"go to {r}" in sight.menu:
            return Decision(f"go to {r}", why)
    return None


def _fetch(
    sight: Sight, goal: Goal, prior: ReceptaclePrior, obj_type: str, *, take: bool
) -> Decision:
    here = sight.location or ""
    # Objects already in a receptacle of the goal's type count as done (two-object tasks).
    wanted = [
        (o, r)
        for o, r in sight.where_seen(obj_type)
        if not (obj_type == goal.obj and goal.recep and kind(r) == goal.recep)
    ]
    for obj, where in wanted:
        if where == here and take and f"take {obj} from {here}" in sight.menu:
            return Decision(f"take {obj} from {here}", "the task needs it")
    for obj, where in wanted:
        if where == here and f"open {here}" in sight.menu and here in sight.closed:
            return Decision(f"open {here}", f"{obj} was seen inside")
        if where != here and f"go to {where}" in sight.menu:
            return Decision(f"go to {where}", f"{obj} was seen in {where}")
    best = _best_unsearched(sight, goal, prior, obj_type)
    if best is not None:
        return best
    for fallback in ("look", *sight.menu):
        if fallback in sight.menu:
            return Decision(fallback, f"every place was searched for a {obj_type}")
    raise ExplorerError("the menu is empty")


def _best_unsearched(
    sight: Sight, goal: Goal, prior: ReceptaclePrior, obj_type: str
) -> Decision | None:
    here = sight.location or ""
    scored: list[tuple[float, int, str]] = []
    for i, r in enumerate(sight.unsearched()):
        rtype = kind(r)
        chance = prior.chance(obj_type, rtype)
        if obj_type == goal.obj and rtype == goal.recep:
            chance *= prior.goal_factor
        if r == here:
            command, cost = f"open {r}", 1.0
        else:
            command = f"go to {r}"
            closed = r in sight.closed or (
                r not in sight.opened and prior.openable.get(rtype, 0.0) >= 0.5
            )
            cost = 2.0 if closed else 1.0
        if command in sight.menu:
            scored.append((chance / cost, -i, command))
    if not scored:
        return None
    chance, _, command = max(scored)
    # The next command names the place: the reason need not.
    left, wanted = len(scored), "" if obj_type == goal.obj else f" for a {obj_type}"
    if chance > 0:
        return Decision(command, f"the likeliest of {left} unsearched{wanted} is next")
    return Decision(command, f"{left} unsearched left{wanted}")
