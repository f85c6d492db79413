"""`diagnostics/oracle_advantages.py`'s exact advantage of a policy on DangerousTaxi, against the
oracle's shortest-path table and a value computed by hand."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from diagnostics.oracle_advantages import STAGES, exact_advantages, exit_preferred
from diagnostics.taxi_prompts import DANGER_ADVANTAGE, oracle_advantage
from reflectrl.envs.taxi import ACTIONS, PICKUP, DangerousTaxiEnv, TaxiOptions

OPTIONS = TaxiOptions()


def every_state() -> SimpleNamespace:
    """What `Prompts` holds of each (instruction, state) without models: its index and oracle
    row (one prompt per `pickup` state and per `dropoff`/`full` state, as the diagnostic's)."""
    env = DangerousTaxiEnv(OPTIONS)
    index, oracle = {}, []
    for pickup in (True, False):
        for state in range(500):
            *_, passenger, destination = env.taxi.decode(state)
            if passenger == destination or (pickup and passenger == 4):
                continue
            index[(pickup, state)] = len(oracle)
            stage = "pickup" if pickup else "full"
            oracle.append([oracle_advantage(env.taxi, stage, state, a) for a in range(6)])
    return SimpleNamespace(index=index, oracle=oracle)


def test_an_optimal_policys_exact_advantage_is_zero_exactly_on_shortest_paths() -> None:
    prompts = every_state()
    right = np.array([[float(a == 0) for a in row] for row in prompts.oracle])
    table = exact_advantages(prompts, right / right.sum(1, keepdims=True), OPTIONS, 0.99)
    checked = 0
    for (pickup, state), i in prompts.index.items():
        for stage in ("pickup",) if pickup else ("dropoff", "full"):
            on_path = [a == 0 for a in prompts.oracle[i]]
            zero = list(np.abs(table[stage][state]) < 1e-6)
            assert zero == on_path, (stage, state, table[stage][state], prompts.oracle[i])
            checked += 1
    assert checked == 300 + 2 * 400


def test_exact_advantage_of_a_state_one_pick_up_from_the_goal_by_hand() -> None:
    """The taxi on the passenger's cell in `pickup`, beside a wall: picking up ends the episode
    with the bonus, the move into the wall with the danger penalty, so whatever V is,
    A(pick up) - A(wall) = Q(pick up) - Q(wall) = (bonus - penalty) * scale; and the advantages
    average to 0 under the (uniform) policy."""
    prompts = every_state()
    state = next(
        s for (pickup, s) in prompts.index
        if pickup and prompts.oracle[prompts.index[(True, s)]][PICKUP] == 0
        and any(a == DANGER_ADVANTAGE for a in prompts.oracle[prompts.index[(True, s)]])
    )  # fmt: skip
    uniform = np.full((len(prompts.oracle), len(ACTIONS)), 1 / len(ACTIONS))
    row = exact_advantages(prompts, uniform, OPTIONS, 0.99)["pickup"][state]
    wall = prompts.oracle[prompts.index[(True, state)]].index(DANGER_ADVANTAGE)
    scale = OPTIONS.reward_scale
    assert np.isclose(
        row[PICKUP] - row[wall], (OPTIONS.pickup_bonus - OPTIONS.danger_penalty) * scale
    )
    assert np.isclose((row * uniform[0]).sum(), 0.0)


def test_a_policy_that_walks_into_walls_prefers_the_exit_and_a_high_penalty_stops_it() -> None:
    """A policy that mostly moves into danger is worth about the penalty wherever it stands, so
    under the paper's reward (-10) the exit is its best action in most states; at -100, where
    wandering to the step limit costs less than the penalty, in few."""
    prompts = every_state()
    logits = torch.tensor(
        [[3.0 if a == DANGER_ADVANTAGE else 0.0 for a in row] for row in prompts.oracle]
    )
    paper = exit_preferred(prompts, logits, OPTIONS, 0.99, 1.0)
    priced_out = exit_preferred(prompts, logits, TaxiOptions(danger_penalty=-100.0), 0.99, 1.0)
    assert set(paper) == {f"exit_preferred_{s}" for s in STAGES}
    assert all(paper[k] > 0.5 for k in paper), paper
    assert all(priced_out[k] < min(0.1, paper[k] / 5) for k in paper), (paper, priced_out)
