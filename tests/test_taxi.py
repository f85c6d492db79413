"""DangerousTaxi: stages, danger on every step, rewards, seeding, the BFS expert, options."""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Callable

import numpy as np
import pytest
from gymnasium.envs.toy_text.taxi import TaxiEnv

from reflectrl.envs.registry import env_names, make_text_env
from reflectrl.envs.taxi import (
    ACTIONS,
    IN_TAXI,
    DangerousTaxiEnv,
    TaxiOptions,
    expert_action,
)
from reflectrl.errors import ConfigError

SOUTH, NORTH, EAST, WEST, PICKUP, DROPOFF = range(6)
LOCS = [(0, 0), (0, 4), (4, 0), (4, 3)]


def make(stage: str = "full", **options: object) -> DangerousTaxiEnv:
    env = DangerousTaxiEnv(TaxiOptions(**options))
    env.set_stage(stage)
    return env


def find_seed(env: DangerousTaxiEnv, predicate: Callable[..., bool]) -> int:
    """The first seed whose start state satisfies `predicate(row, col, passenger, dest)`."""
    for seed in range(1000):
        env.reset(seed=seed)
        if predicate(*env.decoded_state()):
            env.reset(seed=seed)
            return seed
    raise AssertionError("no seed found")


def grid_letters(text: str) -> str:
    return "".join(ch for line in text.splitlines()[:7] for ch in line if ch in "TXPD")


def test_action_menu_is_fixed_and_in_gymnasium_order() -> None:
    env = make()
    obs, info = env.reset(seed=0)
    assert env.max_actions == 6
    assert obs.actions == ACTIONS == info["valid_actions"]
    assert ACTIONS[SOUTH] == "go south" and ACTIONS[NORTH] == "go north"
    assert ACTIONS[EAST] == "go east" and ACTIONS[WEST] == "go west"
    assert ACTIONS[PICKUP] == "pick up passenger" and ACTIONS[DROPOFF] == "drop off passenger"
    assert DangerousTaxiEnv.stages == ("pickup", "dropoff", "full")


@pytest.mark.parametrize("stage", ["pickup", "full"])
def test_pickup_and_full_start_with_passenger_waiting(stage: str) -> None:
    env = make(stage)
    for seed in range(50):
        obs, info = env.reset(seed=seed)
        row, col, passenger, dest = env.decoded_state()
        assert passenger < 4 and passenger != dest
        assert info == {
            "success": False,
            "valid_actions": ACTIONS,
            "stage": stage,
            "danger": False,
        }
        assert "X" not in grid_letters(obs.observation)
        assert "The passenger is at P" in obs.observation
        if (row, col) != LOCS[passenger]:
            assert "P" in grid_letters(obs.observation)
    assert "pick them up" in make("pickup").reset(seed=0)[0].instruction
    assert "drop them off" in make("full").reset(seed=0)[0].instruction


def test_full_stage_start_is_gymnasiums_start() -> None:
    env, reference = make("full", split="all"), TaxiEnv()
    for seed in range(30):
        env.reset(seed=seed)
        state, _ = reference.reset(seed=seed)
        assert env.decoded_state() == tuple(int(v) for v in reference.decode(state))


def test_dropoff_stage_starts_with_passenger_aboard() -> None:
    env = make("dropoff")
    cells, dests = set(), set()
    for seed in range(200):
        obs, info = env.reset(seed=seed)
        row, col, passenger, dest = env.decoded_state()
        assert passenger == IN_TAXI
        assert (row, col) != LOCS[dest]  # never solved by a single drop-off
        assert grid_letters(obs.observation).count("X") == 1
        assert "P" not in grid_letters(obs.observation)
        assert "in the taxi" in obs.observation
        assert info["stage"] == "dropoff"
        cells.add((row, col))
        dests.add(dest)
    assert len(dests) == 4 and len(cells) >= 20  # seeded, but spread over the grid


def test_observation_is_compact_and_marks_every_piece() -> None:
    env = make("full")
    for seed in range(100):
        obs, _ = env.reset(seed=seed)
        row, col, passenger, dest = env.decoded_state()
        letters = grid_letters(obs.observation)
        assert letters.count("T") == 1
        assert ("D" in letters) == ((row, col) != LOCS[dest])
        assert ("P" in letters) == ((row, col) != LOCS[passenger])
        lines = obs.observation.splitlines()
        assert lines[1 + row][2 * col + 1] == "T"
        assert len((obs.instruction + " " + obs.observation).split()) < 150


def test_coordinates_name_the_cells_the_grid_shows() -> None:
    import re

    plain, named = make("full"), make("full", coordinates=True)
    for stage in DangerousTaxiEnv.stages:
        plain.set_stage(stage)
        named.set_stage(stage)
        for seed in range(40):
            obs, _ = named.reset(seed=seed)
            row, col, passenger, dest = named.decoded_state()
            # The same grid and status as without the option, plus one line naming the cells.
            assert obs.observation.startswith(plain.reset(seed=seed)[0].observation + "\n")
            last = obs.observation.splitlines()[-1]
            cells = dict(re.findall(r"([TXPD]) (\d,\d)", last))
            taxi = "X" if passenger == IN_TAXI else "T"
            assert cells.pop(taxi) == f"{row},{col}"
            assert cells.pop("D") == "{},{}".format(*LOCS[dest])
            if passenger != IN_TAXI:
                assert cells.pop("P") == "{},{}".format(*LOCS[passenger])
            assert not cells
            obs, *_ = named.step(expert_action(named))  # a moved taxi is named where it went
            if "delivered" not in obs.observation:
                row, col = named.decoded_state()[:2]
                assert f" {row},{col}" in obs.observation.splitlines()[-1]


def test_first_step_wall_bump_is_dangerous_in_every_stage() -> None:
    for stage in DangerousTaxiEnv.stages:
        env = make(stage)
        find_seed(env, lambda row, *_: row == 0)
        before = env.decoded_state()
        _, reward, terminated, truncated, info = env.step(NORTH)
        assert env.decoded_state() == before
        assert terminated and not truncated
        assert reward == pytest.approx(-10 / 20)
        assert info["danger"] is True and info["success"] is False
        with pytest.raises(RuntimeError):
            env.step(SOUTH)


def test_inner_wall_bump_is_dangerous() -> None:
    env = make("full")
    find_seed(env, lambda row, col, *_: (row, col) == (0, 1))  # wall to the east of (0, 1)
    _, reward, terminated, _, info = env.step(EAST)
    assert terminated and info["danger"] and reward == pytest.approx(-0.5)


@pytest.mark.parametrize("stage", ["pickup", "full"])
def test_illegal_dropoff_on_first_step(stage: str) -> None:
    env = make(stage)
    env.reset(seed=7)
    _, reward, terminated, _, info = env.step(DROPOFF)  # the passenger is never aboard yet
    assert terminated and info["danger"] and not info["success"]
    assert reward == pytest.approx(-0.5)


def test_illegal_pickup() -> None:
    env = make("full")
    find_seed(env, lambda row, col, passenger, _: (row, col) != LOCS[passenger])
    _, reward, terminated, _, info = env.step(PICKUP)
    assert terminated and info["danger"] and reward == pytest.approx(-0.5)
    # With the passenger already aboard, a pick-up is a no-op too.
    env = make("dropoff")
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step(PICKUP)
    assert terminated and info["danger"] and reward == pytest.approx(-0.5)


def test_danger_on_a_later_step() -> None:
    env = make("full")
    find_seed(env, lambda row, *_: row == 1)
    _, reward, terminated, _, info = env.step(NORTH)  # a legal move to row 0
    assert not terminated and not info["danger"] and reward == pytest.approx(-0.05)
    _, reward, terminated, _, info = env.step(NORTH)  # now a wall bump
    assert terminated and info["danger"] and reward == pytest.approx(-0.5)


def test_dropoff_at_a_wrong_landmark_is_legal() -> None:
    env = make("dropoff")
    find_seed(env, lambda row, col, _, dest: (row, col) in LOCS and (row, col) != LOCS[dest])
    row, col, _, _ = env.decoded_state()
    _, reward, terminated, _, info = env.step(DROPOFF)
    assert not terminated and not info["danger"] and reward == pytest.approx(-0.05)
    assert env.decoded_state()[2] == LOCS.index((row, col))  # the passenger waits there now


def test_reward_scaling_and_custom_rewards() -> None:
    env = make("pickup", reward_scale=1.0, pickup_bonus=7.0)
    find_seed(env, lambda row, col, passenger, _: (row, col) == LOCS[passenger])
    _, reward, terminated, _, info = env.step(PICKUP)
    assert reward == 7.0 and terminated and info["success"] and not info["danger"]

    env = make("full", reward_scale=0.5, danger_penalty=-3.0)
    env.reset(seed=1)
    assert env.step(DROPOFF)[1] == -1.5

    env = make("full", reward_scale=1.0)
    env.reset(seed=2)
    rewards = []
    while True:
        _, reward, terminated, truncated, info = env.step(expert_action(env))
        rewards.append(reward)
        if terminated or truncated:
            break
    assert info["success"] and rewards[-1] == 20.0 and set(rewards[:-1]) == {-1.0}
    # In the full game a pick-up is an ordinary step, not the end.
    assert len(rewards) >= 2


def test_truncation_at_max_steps() -> None:
    env = make("full", max_steps=3)
    find_seed(env, lambda row, *_: 1 <= row <= 3)
    for i, action in enumerate([SOUTH, NORTH, SOUTH]):
        _, reward, terminated, truncated, info = env.step(action)
        assert not terminated and not info["danger"] and reward == pytest.approx(-0.05)
        assert truncated == (i == 2)
    with pytest.raises(RuntimeError):
        env.step(NORTH)


def trajectory(env: DangerousTaxiEnv, seed: int | None) -> list[object]:
    obs, _ = env.reset(seed=seed)
    out: list[object] = [obs]
    rng = random.Random(0)
    while True:
        step = env.step(rng.randrange(6))
        out.append(step)
        if step[2] or step[3]:
            return out


@pytest.mark.parametrize("stage", DangerousTaxiEnv.stages)
def test_same_seed_same_episode(stage: str) -> None:
    a, b = make(stage), make(stage)
    for seed in range(20):
        assert trajectory(a, seed) == trajectory(b, seed)
    starts = {make(stage).reset(seed=s)[0].observation for s in range(20)}
    assert len(starts) > 10


def test_unseeded_reset_continues_the_rng_independent_of_actions() -> None:
    a, b = make("dropoff"), make("dropoff")
    a.reset(seed=11)
    b.reset(seed=11)
    b.step(expert_action(b))  # steps must not consume the start-state RNG
    starts_a = [a.reset()[0] for _ in range(10)]
    starts_b = [b.reset()[0] for _ in range(10)]
    assert starts_a == starts_b
    assert len({o.observation for o in starts_a}) > 5  # it continues, it does not repeat


def test_fixed_start_seed() -> None:
    for stage in DangerousTaxiEnv.stages:
        env = make(stage, fixed_start_seed=123)
        first = env.reset()[0]
        assert all(env.reset(seed=s)[0] == first for s in range(10))
        assert all(env.reset()[0] == first for _ in range(10))
        assert first == make(stage, split="all").reset(seed=123)[0]  # gymnasium's draw


def test_listed_starts_are_the_only_starts() -> None:
    starts = [21, 44, 101, 308, 492]  # train starts, 2-3 actions from a pick-up
    env = make("pickup", starts=starts)
    drawn = set()
    for _ in range(200):
        env.reset()
        drawn.add(int(env.taxi.s))
    assert drawn == set(starts)
    assert env.start_ids("pickup") == [str(s) for s in starts]
    with pytest.raises(ConfigError, match=r"starts: .*0 is not a start state of the 'train'"):
        make_text_env("dangerous_taxi", {"starts": [21, 0]})
    test_start = min(set(make("full", split="test").start_ids("full") or []), key=int)
    with pytest.raises(ConfigError, match=f"{test_start} is not a start state of the 'train'"):
        make_text_env("dangerous_taxi", {"starts": [int(test_start)]})
    assert make_text_env("dangerous_taxi", {"starts": [int(test_start)], "split": "test"})


def test_set_stage_applies_from_next_reset() -> None:
    env = make("pickup")
    env.reset(seed=0)
    env.set_stage("dropoff")
    assert env.episode_stage == "pickup"
    assert env.step(SOUTH if env.decoded_state()[0] < 4 else NORTH)[4]["stage"] == "pickup"
    assert env.reset(seed=0)[1]["stage"] == "dropoff"
    with pytest.raises(ValueError):
        env.set_stage("bogus")


def test_review_replays_earlier_stages_for_that_share_of_episodes() -> None:
    """`set_stage(stage, review, share)`: that share of resets plays a review stage (its own
    instruction and goal), drawn from the env's seeded stream; share 0 draws nothing, so the
    start states are those of a plain env."""

    def stages_and_starts(review: tuple[str, ...], share: float) -> list[tuple[str, int]]:
        env = make("full")
        env.set_stage("full", review, share)
        played = []
        for episode in range(300):
            obs, info = env.reset(seed=11 if episode == 0 else None)
            played.append((info["stage"], int(env.taxi.s)))
            assert ("pick them up" in obs.instruction) == (info["stage"] == "pickup")
        return played

    mixed = stages_and_starts(("pickup", "dropoff"), 0.4)
    counts = {s: sum(stage == s for stage, _ in mixed) for s in ("pickup", "dropoff", "full")}
    assert 0.3 * 300 < counts["pickup"] + counts["dropoff"] < 0.5 * 300
    assert min(counts["pickup"], counts["dropoff"]) > 30
    assert stages_and_starts(("pickup", "dropoff"), 0.4) == mixed  # seeded
    assert stages_and_starts((), 0.0) == stages_and_starts(("pickup",), 0.0)
    with pytest.raises(ValueError, match="unknown stage 'bogus'"):
        make("full").set_stage("full", ("bogus",), 0.5)


def test_action_validation() -> None:
    env = make("full")
    with pytest.raises(RuntimeError):
        env.step(0)  # before the first reset
    find_seed(env, lambda row, *_: row < 4)
    with pytest.raises(ValueError):
        env.step(6)
    with pytest.raises(TypeError):
        env.step(1.0)  # type: ignore[arg-type]
    assert not env.step(np.int64(SOUTH))[2]


def shortest_length(env: DangerousTaxiEnv) -> int:
    """Forward BFS over the table, independent of the expert's backward BFS."""
    start, pickup = int(env.taxi.s), env.episode_stage == "pickup"
    seen, queue = {start}, deque([(start, 0)])
    while queue:
        state, depth = queue.popleft()
        for action in range(6):
            ((_, nxt, _, delivered),) = env.taxi.P[state][action]
            if nxt == state:
                continue
            if (pickup and action == PICKUP) or (not pickup and delivered):
                return depth + 1
            if nxt not in seen:
                seen.add(nxt)
                queue.append((nxt, depth + 1))
    raise AssertionError("unreachable goal")


@pytest.mark.parametrize("stage", DangerousTaxiEnv.stages)
def test_expert_solves_every_stage_optimally(stage: str) -> None:
    env = make(stage)
    for seed in range(200):
        env.reset(seed=seed)
        optimal = shortest_length(env)
        steps = 0
        while True:
            _, reward, terminated, truncated, info = env.step(expert_action(env))
            steps += 1
            assert not info["danger"]
            if terminated or truncated:
                break
        assert info["success"] and terminated and not truncated, seed
        assert steps == optimal <= env.options.max_steps
        assert reward == pytest.approx(20 / 20)  # +20 pick-up bonus or delivery, scaled


def test_registry_and_options_validation() -> None:
    assert "dangerous_taxi" in env_names()
    env = make_text_env("dangerous_taxi", {"max_steps": 5, "fixed_start_seed": 3})
    assert isinstance(env, DangerousTaxiEnv)
    assert env.options.max_steps == 5 and env.options.fixed_start_seed == 3
    assert make_text_env("dangerous_taxi").options == TaxiOptions()
    with pytest.raises(ConfigError, match="bogus"):
        make_text_env("dangerous_taxi", {"bogus": 1})
    with pytest.raises(ConfigError, match="max_steps"):
        make_text_env("dangerous_taxi", {"max_steps": 0})
    with pytest.raises(ConfigError, match="reward_scale"):
        make_text_env("dangerous_taxi", {"reward_scale": -1})


def test_throughput_sanity() -> None:
    env = make("full")
    rng = random.Random(0)
    env.reset(seed=0)
    steps = episodes = 0
    start = time.perf_counter()
    while steps < 5000:
        _, reward, terminated, truncated, info = env.step(rng.randrange(6))
        steps += 1
        assert reward in {-0.05, -0.5, 1.0}
        assert terminated == (info["danger"] or info["success"]) or truncated
        if terminated or truncated:
            episodes += 1
            env.reset()
    elapsed = time.perf_counter() - start
    print(f"dangerous_taxi: {steps / elapsed:.0f} random steps/s")
    assert episodes > 100  # random play hits a wall or an illegal action quickly


def test_start_states_split_into_train_and_test() -> None:
    from reflectrl.envs.taxi import start_states

    train, test = start_states("train", 0.2, 0), start_states("test", 0.2, 0)
    assert len(train) == 240 and len(test) == 60 and not set(train) & set(test)
    assert set(train) | set(test) == set(start_states("all", 0.2, 0))
    assert start_states("test", 0.2, 1) != test  # seeded by split_seed
    seen = {"train": set(), "test": set()}
    for split, starts in seen.items():
        env = make("full", split=split)
        for seed in range(1500):
            env.reset(seed=seed)
            starts.add(int(env.taxi.s))
    assert seen["train"] <= set(train) and seen["test"] <= set(test)
    assert len(seen["train"]) > 230 and len(seen["test"]) > 55  # the whole split is drawn
