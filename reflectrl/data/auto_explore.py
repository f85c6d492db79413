"""AutoExplore's demonstrator: the shortest-route expert; mistakes read a wrong file or enter a
wrong folder (never `id`, which ends the episode); the expert's route recovers from there."""

from __future__ import annotations

from typing import Any

import numpy as np

from reflectrl.data.demos import Demonstrator, mistake_among
from reflectrl.envs.auto_explore.env import AutoExploreEnv
from reflectrl.envs.auto_explore.expert import expert_action
from reflectrl.envs.auto_explore.shell import path_text


class AutoExploreDemonstrator(Demonstrator):
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


def _where(cwd: tuple[str, ...]) -> str:
    return path_text(cwd) if cwd else "the repository root"


DEMONSTRATOR = AutoExploreDemonstrator()
