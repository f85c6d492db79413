"""DangerousTaxi's demonstrator: the BFS expert; mistakes are moves that do not bring the taxi
closer to success (never a wall bump or an illegal pick-up/drop-off, which end the episode)."""

from __future__ import annotations

from typing import Any

import numpy as np

from reflectrl.data.demos import Demonstrator, mistake_among
from reflectrl.envs.taxi import (
    ACTIONS,
    IN_TAXI,
    DangerousTaxiEnv,
    actions_to_success,
    expert_action,
)

MOVES = range(4)  # south, north, east, west
PLACES = {
    (0, 0): "the top-left corner",
    (0, 4): "the top-right corner",
    (4, 0): "the bottom-left corner",
    (4, 3): "the fourth cell of the bottom row",
}


class TaxiDemonstrator(Demonstrator):
    def expert(self, env: DangerousTaxiEnv) -> int:
        return expert_action(env)

    def mistake(self, env: DangerousTaxiEnv, rng: np.random.Generator) -> int | None:
        state, now = int(env.taxi.s), actions_to_success(env)
        wrong = []
        for action in MOVES:
            ((_, next_state, _, _),) = env.taxi.P[state][action]
            if next_state != state and actions_to_success(env, next_state) >= now:
                wrong.append(action)
        return mistake_among(wrong, rng)

    def snapshot(self, env: DangerousTaxiEnv) -> Any:
        return {"steps": actions_to_success(env), "aboard": env.decoded_state()[2] == IN_TAXI}

    def describe(self, before: Any, action: str, env: DangerousTaxiEnv) -> str:
        passenger = env.decoded_state()[2]
        if passenger == IN_TAXI and not before["aboard"]:
            return "picked the passenger up"
        if action not in ACTIONS[:4]:
            return "changed nothing useful"
        goal = "the destination" if passenger == IN_TAXI else "the passenger"
        closer = actions_to_success(env) < before["steps"]
        return f"moved the taxi {'closer to' if closer else 'away from'} {goal}"

    def situation(self, env: DangerousTaxiEnv) -> str:
        _, _, passenger, destination = env.decoded_state()
        goal = PLACES[tuple(env.taxi.locs[destination])]
        if passenger == IN_TAXI:
            return f"The passenger is aboard and wants to go to {goal}."
        start = PLACES[tuple(env.taxi.locs[passenger])]
        return f"The passenger waits at {start} and wants to go to {goal}."

    def task_id(self, env: DangerousTaxiEnv) -> str:
        return str(int(env.taxi.s))


# Taxi is fully observable: the BFS expert decides from what the grid shows.
DEMONSTRATORS = dict.fromkeys(("observable", "oracle"), TaxiDemonstrator())
