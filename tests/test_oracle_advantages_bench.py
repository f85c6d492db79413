"""`diagnostics/oracle_advantages.py`'s exact advantage of a policy on DangerousTaxi, against the
oracle's shortest-path table and a value computed by hand."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
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


def test_with_the_step_limit_far_off_the_advantage_is_the_step_limit_free_one() -> None:
    """`step_limit_advantages` with k steps left: at k = 1 only the step's own reward counts
    (Q(s, a) = r(s, a)); with the limit far off it is `exact_advantages`."""
    from diagnostics.oracle_advantages import step_limit_advantages

    prompts = every_state()
    uniform = np.full((len(prompts.oracle), len(ACTIONS)), 1 / len(ACTIONS))
    far = TaxiOptions(max_steps=3000)
    limited = step_limit_advantages(prompts, uniform, far, 0.9)
    free = exact_advantages(prompts, uniform, far, 0.9)
    assert np.allclose(limited["full"][3000], free["full"], atol=1e-6)
    # A pickup state beside a wall: a move into it against a legal move (reward -1), one step
    # before the limit, differ by their own rewards alone.
    state, row = next(
        (s, prompts.oracle[i]) for (pickup, s), i in prompts.index.items()
        if pickup and DANGER_ADVANTAGE in prompts.oracle[i][:4]
    )  # fmt: skip
    wall = row.index(DANGER_ADVANTAGE)
    move = next(a for a in range(4) if row[a] != DANGER_ADVANTAGE)
    one_step = limited["pickup"][1][state]
    assert np.isclose(one_step[wall] - one_step[move], (far.danger_penalty + 1) * far.reward_scale)
    assert not np.allclose(limited["full"][1], free["full"])


def test_a_cut_episode_goes_on_from_its_last_states_table_value() -> None:
    """`TableCritics.bootstrap`: the steps of an episode the step limit cut get
    gamma^(T - t + 1) V(s_T); a terminated episode's get 0."""
    from diagnostics.taxi_rollouts import TableCritics

    critics = TableCritics(prompts=1, actions=6)
    critics.value[("full", 7)] = [-6.0, 3]  # V = -2
    cut = [
        {"stage": "full"},
        {"stage": "full"},
        {"stage": "full", "last": True, "truncated": True, "next_state": 7},
    ]
    ended = [{"stage": "full", "last": True, "truncated": False, "next_state": 7}]
    out = critics.bootstrap(ended + cut, 0.5)  # fmt: skip
    assert np.allclose(out, [0.0, -2 * 0.5**3, -2 * 0.5**2, -2 * 0.5])


def test_a_batch_gradient_of_one_step_moves_its_action_against_the_rest() -> None:
    """`advantage_noise.batch_gradient`: A (onehot(a) - pi) at the step's prompt."""
    from diagnostics.advantage_noise import batch_gradient, cosine

    probs = np.array([[0.5, 0.25, 0.25], [1 / 3, 1 / 3, 1 / 3]])
    grad = batch_gradient([{"row": 0, "action": 1}], np.array([2.0]), probs)
    assert np.allclose(grad, [[-1.0, 1.5, -0.5], [0, 0, 0]])
    assert np.isclose(cosine(grad, 3 * grad), 1.0) and np.isclose(cosine(grad, -grad), -1.0)


def test_the_model_table_evaluates_the_transitions_seen_without_the_step_limit() -> None:
    """`TableCritics` `td_model` by hand, gamma 0.5: from state 1 one episode goes on to 2
    (reward -1) and ends there (+1), another ends at once (+3); a third, cut by the step limit,
    goes 3 -> 1 (-1). So V(2) = 1, V(1) = (-1 + 0.5 V(2) + 3) / 2 = 1.25, V(3) = -1 + 0.5 V(1):
    the cut episode goes on from state 1 as if there were no limit."""
    from diagnostics.taxi_rollouts import TableCritics

    def step(state: int, reward: float, **end: object) -> dict:
        return {"stage": "full", "state": state, "reward": reward, **end}

    steps = [
        step(1, -1.0), step(2, 1.0, last=True, truncated=False),
        step(1, 3.0, last=True, truncated=False),
        step(3, -1.0, last=True, truncated=True, next_state=1),
    ]  # fmt: skip
    critics = TableCritics(prompts=1, actions=6)
    adv = critics.advantages("td_model", steps, np.ones((1, 6)), 0.5, 0.0)
    values = {("full", 1): 1.25, ("full", 2): 1.0, ("full", 3): -1 + 0.5 * 1.25}
    assert critics.model_values(0.5) == pytest.approx(values)
    # A = r + 0.5 V(next) - V(s): the two ways out of state 1 differ; the others are sure.
    np.testing.assert_allclose(adv, [-1 + 0.5 - 1.25, 0.0, 3 - 1.25, 0.0], atol=1e-9)


def test_the_q_model_weighs_the_actions_tried_by_the_current_policy() -> None:
    """`TableCritics` `q_model` by hand, gamma 0.5: at state 1 (prompt row 0) action 0 leads to
    state 2 (-1) whose one tried action ends it (+1), action 1 ends at once (+3). The policy puts
    0.2 and 0.6 on them (0.2 on an action never tried): weights 0.25 / 0.75 over the tried
    ones, V(1) = 0.25 (-1 + 0.5) + 0.75 x 3 = 2.125, and A = Q(s, a) - V(s). An episode cut
    after 3 -> 1 goes on from state 1."""
    from diagnostics.taxi_rollouts import TableCritics

    def step(row: int, state: int, action: int, reward: float, **end: object) -> dict:
        return {"row": row, "stage": "full", "state": state, "action": action,
                "reward": reward, **end}  # fmt: skip

    steps = [
        step(0, 1, 0, -1.0), step(1, 2, 0, 1.0, last=True, truncated=False),
        step(0, 1, 1, 3.0, last=True, truncated=False),
        step(2, 3, 0, -1.0, last=True, truncated=True, next_state=1),
    ]  # fmt: skip
    probs = np.array([[0.2, 0.6, 0.2, 0, 0, 0], [0.5, 0.5, 0, 0, 0, 0], [1.0, 0, 0, 0, 0, 0]])
    adv = TableCritics(prompts=3, actions=6).advantages("q_model", steps, probs, 0.5, 0.0)
    np.testing.assert_allclose(adv, [-0.5 - 2.125, 0.0, 3 - 2.125, 0.0], atol=1e-9)
