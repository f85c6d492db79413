"""AutoExplore's demonstrators. The default (`data.expert: observable`) explores as an agent
could: its decisions (`envs/auto_explore/explorer.py`) and the facts its reflections state come
from the screen, the agent's own history and statistics of the training split. The oracle
(`data.expert: oracle`, a named variant) walks the shortest route to the target it knows, and
its reflections say whether a folder is on the way to the answer.

Mistakes read a wrong file or enter a wrong folder (never `id`, which ends the episode); the
expert goes on from where they lead."""

from __future__ import annotations

from typing import Any

import numpy as np

from reflectrl.data.demos import Demonstrator, mistake_among
from reflectrl.envs.auto_explore.env import AutoExploreEnv
from reflectrl.envs.auto_explore.expert import expert_action
from reflectrl.envs.auto_explore.explorer import Sight, TrainingPrior, explore, states_answer
from reflectrl.envs.auto_explore.shell import path_text


class OracleDemonstrator(Demonstrator):
    """The shortest route to the known target (privileged: the oracle variant)."""

    def expert(self, env: AutoExploreEnv) -> int:
        return expert_action(env)

    def mistake(self, env: AutoExploreEnv, rng: np.random.Generator) -> int | None:
        best = env.actions[self.expert(env)]
        wrong = [
            i
            for i, command in enumerate(env.actions)
            if command != best and command.startswith(("cat ", "cd "))
        ]
        return mistake_among(wrong, rng)

    def snapshot(self, env: AutoExploreEnv) -> Any:
        return {"cwd": env.shell.cwd}

    def describe(self, before: Any, action: str, env: AutoExploreEnv) -> str:
        target = env.task.parts
        if action == "cd ..":
            return f"went back up to {_where(env.shell.cwd)}"
        if action.startswith("cd "):
            on_way = env.shell.cwd == target[: len(env.shell.cwd)]
            where = "on the way to the answer" if on_way else "off the way to the answer"
            return f"entered {path_text(env.shell.cwd)}, which is {where}"
        if action.startswith("cat "):
            name = action[4:]
            answers = (*before["cwd"], name) == target
            return (
                f"showed {name}, which {'answers' if answers else 'does not answer'} the question"
            )
        return "did something unexpected"

    def situation(self, env: AutoExploreEnv) -> str:
        return f"Nothing explored yet; we are in {_where(env.shell.cwd)}."

    def task_id(self, env: AutoExploreEnv) -> str:
        return env.task.target


class ObservableDemonstrator(OracleDemonstrator):
    """Explores from what the agent sees; its reflections state only what the screen shows."""

    def __init__(self) -> None:
        self._prior_of: tuple[list[Any], TrainingPrior] | None = None

    def expert(self, env: AutoExploreEnv) -> int:
        return env.actions.index(explore(sight_of(env), self._prior(env)))

    def describe(self, before: Any, action: str, env: AutoExploreEnv) -> str:
        if action == "cd ..":
            return f"went back up to {_where(env.shell.cwd)}"
        if action.startswith("cd "):
            listing = env.shell.listing().entries
            files = sum(not e.is_dir for e in listing)
            return (
                f"entered {path_text(env.shell.cwd)}, which shows {files} files and "
                f"{len(listing) - files} folders"
            )
        if action.startswith("cat "):
            sight = sight_of(env)
            found = states_answer(sight.kind, sight.key, sight.last_output)
            verdict = "which states" if found else "which does not state"
            return f"showed {action[4:]}, {verdict} {sight.key}"
        return "did something unexpected"

    def _prior(self, env: AutoExploreEnv) -> TrainingPrior:
        # The env holds the training split's tasks (data is drawn from `train` only).
        if self._prior_of is None or self._prior_of[0] is not env.tasks:
            self._prior_of = (env.tasks, TrainingPrior.of(env.tasks))
        return self._prior_of[1]


def sight_of(env: AutoExploreEnv) -> Sight:
    """What the agent has seen and done so far (never where the target is)."""
    shell = env.shell
    entries = shell.listing().entries
    return Sight(
        kind=env.task.kind,
        key=env.task.key,
        cwd=shell.cwd,
        files=tuple(e.name for e in entries if not e.is_dir),
        dirs=tuple(e.name for e in entries if e.is_dir),
        read=frozenset(shell.read),
        entered=frozenset(shell.visited),
        last_command=shell.history[-1] if shell.history else None,
        last_output=shell.last.output if shell.last else "",
    )


def _where(cwd: tuple[str, ...]) -> str:
    return path_text(cwd) if cwd else "the repository root"


DEMONSTRATORS: dict[str, Demonstrator] = {
    "observable": ObservableDemonstrator(),
    "oracle": OracleDemonstrator(),
}
