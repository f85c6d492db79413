"""ALFWorld's demonstrator: the walkthrough written at generation time (never the planner);
mistakes go to a wrong receptacle, from where the expert goes back and rejoins the walkthrough."""

from __future__ import annotations

from typing import Any

import numpy as np

from reflectrl.data.demos import Demonstrator, mistake_among
from reflectrl.envs.alfworld.env import AlfWorldEnv
from reflectrl.envs.alfworld.expert import expert_action

MAX_FEEDBACK = 80  # characters of the engine's answer a reflection fact quotes


class AlfWorldDemonstrator(Demonstrator):
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
        first = env.last_feedback.split(". ")[0].strip().rstrip(".")
        if len(first) > MAX_FEEDBACK:
            first = first[: MAX_FEEDBACK - 3] + "..."
        return f'got "{first}"' if first else "changed nothing"

    def situation(self, env: AlfWorldEnv) -> str:
        return f"Nothing done yet; the task is to {env.task.rstrip('.')}."

    def task_id(self, env: AlfWorldEnv) -> str:
        return str(env.game.path) if env.game is not None else ""


# The walkthrough knows what closed receptacles hold: only the oracle variant exists so far.
DEMONSTRATORS = {"oracle": AlfWorldDemonstrator()}
