"""The real ALFWorld text engine, and the two rules every user of it shares.

`Engine` is textworld's `PddlEnv` wrapped in alfworld's own `AlfredDemangler` (object names such
as "sinkbasin 1") and `AlfredInfos`: the stack alfworld's `AlfredTWEnv` builds per game, minus
its gym registry (no env ids to collide between workers) and its batch processes, plus one saving
(`_pddl_env_class`) that leaves the game logic untouched. Each `Engine` owns one copy of the
fast-downward library (textworld loads a private copy per `PddlEnv`), so several engines in one
process share no planner state; one engine serves every game its env plays (a new library per
game would leak one shared-library copy each time). No engine call writes any file.

`capped_menu` is the rule for engines that admit more commands than the policy's action space;
`replay` checks a walkthrough through the engine (used by the generator and `alfworld-check`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from reflectrl.envs.alfworld.catalog import import_alfworld
from reflectrl.envs.alfworld.games import GameDataError, read_game

BANNER = "-= Welcome to TextWorld, ALFRED! =-"
TASK_PREFIX = "Your task is to: "


@dataclass(frozen=True)
class EngineState:
    feedback: str  # the engine's text for the last command (or the intro after reset)
    admissible: tuple[str, ...]  # every command the engine admits now, sorted (its own order)
    won: bool


class Engine:
    def __init__(self) -> None:
        # Imported here: textworld takes ~1 s to import and the registry must stay light.
        import textworld

        alfred_tw_env = import_alfworld("alfworld.agents.environment.alfred_tw_env")
        AlfredDemangler, AlfredInfos = alfred_tw_env.AlfredDemangler, alfred_tw_env.AlfredInfos
        infos = textworld.EnvInfos(admissible_commands=True, won=True)
        self._pddl = _pddl_env_class()(infos)
        self._env = AlfredInfos(AlfredDemangler(self._pddl, shuffle=False))
        self.game: Path | None = None

    def load(self, game: Path | dict[str, Any], *, name: str | None = None) -> None:
        """Load a game file (checked first) or an in-memory game (the generator's, unwritten)."""
        data = read_game(game) if isinstance(game, Path) else game
        where = name or str(game if isinstance(game, Path) else "generated game")
        argv = list(sys.argv)  # the planner's translator sets sys.argv for itself
        try:
            # A mapping, not the path: the engine then never opens files itself.
            self._env.load(data)
        except Exception as err:  # tatsu/fast-downward parse errors have no common base class
            first = str(err).strip().splitlines()[0] if str(err).strip() else ""
            raise GameDataError(
                f"{where}: the alfworld engine cannot load this game ({type(err).__name__}: "
                f"{first[:200]})"
            ) from None
        finally:
            sys.argv[:] = argv
        self.game = game if isinstance(game, Path) else None

    def reset(self) -> EngineState:
        """Back to the start of the loaded game (the first reset after `load` costs least)."""
        return self._state(self._env.reset())

    def step(self, command: str) -> EngineState:
        state, _, _ = self._env.step(command)
        return self._state(state)

    def entity_names(self) -> dict[str, str]:
        """Engine id (lower-case, mangled ALFRED id) -> the name the player sees ("apple 2")."""
        return {key: info.name.strip() for key, info in self._env._entity_infos.items()}

    @staticmethod
    def _state(state: Any) -> EngineState:
        return EngineState(
            feedback=str(state.feedback),
            admissible=tuple(state["admissible_commands"]),
            won=bool(state["won"]),
        )


@cache
def _pddl_env_class() -> type:
    """textworld's PddlEnv, except that the first reset after a load reuses the state the load
    just built. Both translate the PDDL problem with fast-downward (most of their ~1-3 s), and
    right after a load the two states are the same: nothing has touched the planner since."""
    from textworld.envs import PddlEnv
    from textworld.envs.pddl import logic as pddl_logic

    class FreshStatePddlEnv(PddlEnv):  # type: ignore[misc,valid-type]
        def load(self, filename_or_data: Any) -> None:
            super().load(filename_or_data)
            self._fresh_state = self._pddl_state

        def reset(self) -> Any:
            fresh, self._fresh_state = getattr(self, "_fresh_state", None), None
            if fresh is None:
                return super().reset()
            # PddlEnv.reset starts with `pddl_logic.PddlState(...)`: hand it the loaded state.
            original = pddl_logic.PddlState
            pddl_logic.PddlState = lambda *args, **kwargs: fresh
            try:
                return super().reset()
            finally:
                pddl_logic.PddlState = original

    return FreshStatePddlEnv


def split_intro(feedback: str) -> tuple[str, str]:
    """The reset text -> (room description, task), e.g. ("You are in the middle of a room...",
    "put some apple in fridge")."""
    text = feedback.replace(BANNER, "").strip()
    description, _, task = text.rpartition(TASK_PREFIX)
    if not _:
        return text, ""
    return description.strip(), task.strip().rstrip(".")


# The cap rule. When the engine admits more commands than `max_actions`, commands are dropped by
# kind, least useful kind first, and within a kind from the end of the engine's (alphabetical)
# order: "help", then "examine ...", then "look"/"inventory", then "close ...", then "go to ...".
# Commands that act on objects (take, move, open, clean, heat, cool, use, slice) are kept
# first. The rule sees only the command texts, never the walkthrough, so it gives no hint.
_DROP_ORDER = ("help", "examine ", "look", "inventory", "close ", "go to ")


def _keep_rank(command: str) -> int:
    for rank, prefix in enumerate(_DROP_ORDER):
        if command == prefix or (prefix.endswith(" ") and command.startswith(prefix)):
            return len(_DROP_ORDER) - rank  # "go to" 1 ... "help" 6
    return 0  # object actions: kept first


def capped_menu(admissible: Sequence[str], max_actions: int) -> tuple[str, ...]:
    """The menu: the engine's commands in its own order, at most `max_actions` of them."""
    if len(admissible) <= max_actions:
        return tuple(admissible)
    ranked = sorted(range(len(admissible)), key=lambda i: (_keep_rank(admissible[i]), i))
    kept = set(ranked[:max_actions])
    return tuple(c for i, c in enumerate(admissible) if i in kept)


@dataclass(frozen=True)
class ReplayResult:
    ok: bool
    reason: str  # why not, for a report line; "" when ok
    steps: int  # commands played
    largest_menu: int  # the most commands the engine admitted at any step


def replay(engine: Engine, walkthrough: Sequence[str], max_actions: int) -> ReplayResult:
    """Play the walkthrough in the loaded game from its start: each command must be on the capped
    menu, the game won exactly at the last command (a game won early would be a broken task)."""
    state = engine.reset()
    largest = len(state.admissible)
    if state.won:
        return ReplayResult(False, "won before any command", 0, largest)
    if not walkthrough:
        return ReplayResult(False, "empty walkthrough", 0, largest)
    for step, command in enumerate(walkthrough, start=1):
        if command not in state.admissible:
            return ReplayResult(False, f"step {step}: {command!r} is not admissible", step, largest)
        if command not in capped_menu(state.admissible, max_actions):
            reason = f"step {step}: {command!r} is cut by the {max_actions}-command cap"
            return ReplayResult(False, reason, step, largest)
        state = engine.step(command)
        largest = max(largest, len(state.admissible))
        if state.won and step < len(walkthrough):
            return ReplayResult(False, f"won early, at step {step}", step, largest)
    if not state.won:
        return ReplayResult(False, "not won after the last command", len(walkthrough), largest)
    return ReplayResult(True, "", len(walkthrough), largest)
