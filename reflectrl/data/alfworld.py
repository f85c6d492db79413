"""ALFWorld's demonstrators. The default (`data.expert: observable`) searches as an agent could:
its decisions (`envs/alfworld/explorer.py`) and the facts its reflections state come from the
task text, the room description, the agent's own commands and the engine's answers, the menu,
and statistics of the training split's games. The oracle (`data.expert: oracle`, a named
variant) plays the walkthrough written at generation time, which knows what every closed
receptacle holds.

Mistakes go to a wrong receptacle; the observable expert goes on from where that leads (what it
showed there counts as seen), the oracle goes back and rejoins the walkthrough."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from reflectrl.data.demos import Demonstrator, mistake_among
from reflectrl.envs.alfworld.env import AlfWorldEnv
from reflectrl.envs.alfworld.expert import expert_action
from reflectrl.envs.alfworld.explorer import NAME, ReceptaclePrior, Sight, decide, kind, parse_goal
from reflectrl.envs.alfworld.games import scan_games

MAX_FEEDBACK = 80  # characters of the engine's answer a reflection fact quotes


class AlfWorldDemonstrator(Demonstrator):
    """The walkthrough (privileged: the oracle variant)."""

    def expert(self, env: AlfWorldEnv) -> int:
        return expert_action(env)

    def mistake(self, env: AlfWorldEnv, rng: np.random.Generator) -> int | None:
        best = env.menu[self.expert(env)]
        wrong = [
            i
            for i, command in enumerate(env.menu)
            if command != best and command.startswith("go to ")
        ]
        return mistake_among(wrong, rng)

    def describe(self, before: Any, action: str, env: AlfWorldEnv) -> str:
        return _first_sentence(env.last_feedback)

    def situation(self, env: AlfWorldEnv) -> str:
        return f"Nothing done yet; the task is to {env.task.rstrip('.')}."

    def task_id(self, env: AlfWorldEnv) -> str:
        return str(env.game.path) if env.game is not None else ""


class ObservableDemonstrator(AlfWorldDemonstrator):
    """Searches from what the agent sees; its reflections state only what the screen shows."""

    def __init__(self) -> None:
        self._priors: dict[Path, ReceptaclePrior] = {}

    def expert(self, env: AlfWorldEnv) -> int:
        return env.menu.index(decide(sight_of(env), self.prior(env)).command)

    def describe(self, before: Any, action: str, env: AlfWorldEnv) -> str:
        sight = sight_of(env)
        shown = what_it_showed(sight, action)
        # Why the next command: stated from the same observable facts it is chosen from.
        return f"{shown}; {decide(sight, self.prior(env)).why}"

    def situation(self, env: AlfWorldEnv) -> str:
        goal = parse_goal(env.task)
        places = " or ".join(self.prior(env).likeliest(goal.obj))
        return (
            f"Nothing searched yet; the task is to {env.task.rstrip('.')}. A {goal.obj} is "
            f"likeliest at a {places}."
        )

    def prior(self, env: AlfWorldEnv) -> ReceptaclePrior:
        """Statistics of the data folder's training games, whichever split the env plays."""
        if env.root not in self._priors:
            games = [g.path for g in scan_games(env.root, "train")]
            self._priors[env.root] = ReceptaclePrior.of(games)
        return self._priors[env.root]


def sight_of(env: AlfWorldEnv) -> Sight:
    """What the agent has seen and done so far (never what an unopened receptacle holds)."""
    return Sight.observe(env.task, env.description, env.history, env.menu)


def what_it_showed(sight: Sight, action: str) -> str:
    """The last command's effect in a few words, from the engine's answer to it (the command,
    quoted before it in the reflection, already names the place)."""
    goal = parse_goal(sight.task)
    text = sight.history[-1][1] if sight.history else ""
    if action.startswith(("go to ", "open ")):
        where = action.removeprefix("go to ").removeprefix("open ")
        if f"The {where} is closed" in text:
            return "found it closed"
        if where not in sight.seen:
            return _first_sentence(text)
        wanted = {goal.obj, goal.toggle} - {""}
        found = [o for o in sight.seen[where] if kind(o) in wanted]
        inside = " inside" if action.startswith("open ") else ""
        # Holding the object of a "look at" task, it seeks the lamp.
        held = sight.holding is not None and kind(sight.holding) == goal.obj
        sought = goal.toggle if goal.toggle and held else goal.obj
        return f"showed {' and '.join(found) if found else f'no {sought}'}{inside}"
    # The engine's answers to the task's own actions, worded shorter.
    for pattern, words in (
        (rf"You pick up the ({NAME}) from", "picked it up"),
        (rf"You (clean|heat|cool) the ({NAME}) using", "{0}ed it"),
        (rf"You move the ({NAME}) to the ({NAME})\.", "put it there"),
        (rf"You turn on the ({NAME})\.", "turned it on"),
    ):
        if match := re.match(pattern, text):
            return words.format(*match.groups())
    return _first_sentence(text)


def _first_sentence(text: str) -> str:
    first = text.split(". ")[0].strip().rstrip(".")
    if len(first) > MAX_FEEDBACK:
        first = first[: MAX_FEEDBACK - 3] + "..."
    return f'got "{first}"' if first else "changed nothing"


DEMONSTRATORS: dict[str, Demonstrator] = {
    "observable": ObservableDemonstrator(),
    "oracle": AlfWorldDemonstrator(),
}
