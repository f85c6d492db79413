"""What the training split says about where things start, for ALFWorld's observable expert.

`ReceptaclePrior` reads the training games' initial states (their PDDL problems and metadata):
how often an object type starts in one receptacle of a type, how often a receptacle type is
closed, and how much rarer the task's object starts in the goal's receptacle type than other
objects do. Only training games are read; the expert never reads the game it plays.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from reflectrl.envs.alfworld import catalog
from reflectrl.envs.alfworld.games import read_game, read_metadata

SMOOTHING = 2.0  # pseudo-observations pulling a rarely seen object type toward the pooled rate


@dataclass(frozen=True)
class ReceptaclePrior:
    """From the training split's games: for an object type, the chance that one receptacle of
    a type holds one object of that type at the start; how often a receptacle type is closed;
    how much rarer the task's object starts in the goal's receptacle type than others do."""

    rates: dict[str, dict[str, float]]  # object type -> receptacle type -> rate
    pooled: dict[str, float]  # receptacle type -> the same rate over every object type
    openable: dict[str, float]  # receptacle type -> share of its instances that open
    goal_factor: float  # observed / expected starts of targets in the goal's type
    holds: dict[str, frozenset[str]]  # the package's rule: receptacle type -> object types

    @classmethod
    def of(cls, games: Iterable[Path]) -> ReceptaclePrior:
        placed: Counter[tuple[str, str]] = Counter()
        exposed: Counter[tuple[str, str]] = Counter()
        instances: Counter[str] = Counter()
        openables: Counter[str] = Counter()
        targets: list[tuple[str, str, str, Counter[str]]] = []  # (obj, start type, goal, counts)
        for path in games:
            state = _initial_state(path)
            counts = Counter(state.receptacles.values())
            instances.update(counts)
            openables.update(state.receptacles[r] for r in state.openable)
            for obj, otype in state.objects.items():
                where = state.receptacles.get(state.inside.get(obj, ""))
                if where is None:
                    continue
                placed[otype, where] += 1
                for rtype, n in counts.items():
                    exposed[otype, rtype] += n
            params = read_metadata(path.parent).get("pddl_params", {})
            goal = str(params.get("parent_target", "")).lower()
            target = str(params.get("object_target", "")).lower()
            for obj, otype in state.objects.items():
                start = state.receptacles.get(state.inside.get(obj, ""))
                if goal and otype == target and start is not None:
                    targets.append((otype, start, goal, counts))
        by_type: dict[str, Counter[str]] = {}
        for (otype, rtype), n in exposed.items():
            by_type.setdefault(rtype, Counter())[otype] = n
        pooled = {
            rtype: sum(placed[o, rtype] for o in seen) / max(1, sum(seen.values()))
            for rtype, seen in by_type.items()
        }
        rates: dict[str, dict[str, float]] = {}
        for (otype, rtype), n in exposed.items():
            rate = (placed[otype, rtype] + SMOOTHING * pooled[rtype]) / (n + SMOOTHING)
            rates.setdefault(otype, {})[rtype] = rate
        observed = sum(start == goal for _, start, goal, _ in targets)
        expected = sum(
            counts[goal] * rates.get(otype, {}).get(goal, 0.0) for otype, _, goal, counts in targets
        )
        return cls(
            rates=rates,
            pooled=pooled,
            openable={r: openables[r] / n for r, n in instances.items()},
            goal_factor=(observed + 1.0) / (expected + 1.0),
            holds=_package_holds(),
        )

    def chance(self, obj_type: str, receptacle_type: str) -> float:
        """The chance one receptacle of the type holds one object of the type: 0 where the
        package's rules forbid it (for types the rules name), else the training rate; an object
        type the training games never had falls back to any object's rate."""
        ruled = any(obj_type in held for held in self.holds.values())
        if ruled and obj_type not in self.holds.get(receptacle_type, frozenset()):
            return 0.0
        known = self.rates.get(obj_type, {})
        if receptacle_type in known:
            return known[receptacle_type]
        return self.pooled.get(receptacle_type, min(self.pooled.values(), default=0.0))

    def likeliest(self, obj_type: str, n: int = 2) -> list[str]:
        """The receptacle types most likely to hold the object type, best first."""
        types = set(self.pooled) | set(self.rates.get(obj_type, {}))
        return sorted(types, key=lambda r: (-self.chance(obj_type, r), r))[:n]


@dataclass(frozen=True)
class _State:
    receptacles: dict[str, str]  # PDDL name -> receptacle type (lower case)
    objects: dict[str, str]  # PDDL name -> object type (lower case)
    inside: dict[str, str]  # object -> receptacle
    openable: frozenset[str]


def _initial_state(path: Path) -> _State:
    """A training game's start, from its PDDL problem (training games only)."""
    problem = read_game(path)["pddl_problem"]
    # Only the initial state: the goal's own facts ("(inReceptacle ?o ?r)") say where things
    # must end, not where they start.
    start, end = problem.find("(:init"), problem.find("(:goal")
    problem = problem[max(0, start) : end if end > start else len(problem)]

    def facts(predicate: str) -> list[tuple[str, str]]:
        return re.findall(rf"\({predicate} (\S+) (\S+)\)", problem)

    receptacles = {r: t.removesuffix("Type").lower() for r, t in facts("receptacleType")}
    objects = {o: t.removesuffix("Type").lower() for o, t in facts("objectType")}
    return _State(
        receptacles=receptacles,
        objects=objects,
        inside=dict(facts("inReceptacle")),
        openable=frozenset(re.findall(r"\(openable (\S+)\)", problem)),
    )


@cache
def _package_holds() -> dict[str, frozenset[str]]:
    """ALFRED's rule of which object types each receptacle type can hold (lower case)."""
    table = catalog.constants().VAL_RECEPTACLE_OBJECTS
    return {r.lower(): frozenset(o.lower() for o in objs) for r, objs in table.items()}
