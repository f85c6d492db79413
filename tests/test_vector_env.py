"""The rollout worker's vector env: batched reflection, autoreset, shuffling, seeds, stages."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from reflectrl.config import load_config
from reflectrl.envs.taxi import ACTIONS, expert_action
from reflectrl.rollout.vector_env import ReflectRLVectorEnv


class RecordingReflector:
    """Stands in for the reflection client inside this unit test of the code around it."""

    def __init__(self) -> None:
        self.requests: list[list[str]] = []
        self.calls = 0
        self.seed: int | None = None

        self.quotable: list[list[list[str]] | None] = []

    def reflect(self, prompts: list[str], quotable: list[list[str]] | None = None) -> list[str]:
        self.requests.append(list(prompts))
        self.quotable.append(quotable)
        self.calls += len(prompts)
        return [f"reflection {i}" for i in range(len(prompts))]


def make_env(
    tokenizer: Any,
    *overrides: str,
    num_envs: int = 3,
    reflector: Any = None,
    reflector_overrides: bool = False,
) -> Any:
    quote = ["reflection.quote_valid_actions=true", "env.shuffle_options=true"]
    config = load_config(
        None, ["policy.model=tiny", *overrides, *(quote if reflector_overrides else [])]
    )
    return ReflectRLVectorEnv(config, tokenizer, reflector, num_envs=num_envs, worker_index=1)


def test_one_batched_reflection_request_per_step(tokenizer: Any) -> None:
    reflector = RecordingReflector()
    env = make_env(tokenizer, reflector=reflector)
    env.reset()
    assert len(reflector.requests) == 1 and len(reflector.requests[0]) == 3
    assert all(
        p.endswith(" # Analyze:\n") and "Valid actions" not in p for p in reflector.requests[0]
    )
    env.step(np.array([0, 1, 2]))
    assert len(reflector.requests) <= 2
    assert "reflection 0" in env.last_prompts[0] and env.last_prompts[0].endswith(" # Action:\n")
    assert env.pop_stats()["reflection_calls"] == reflector.calls


def test_quote_valid_actions_lets_each_reflection_quote_its_menu_and_the_episode_s_actions(
    tokenizer: Any,
) -> None:
    reflector = RecordingReflector()
    env = make_env(tokenizer, reflector=reflector, num_envs=2, reflector_overrides=True)
    env.reset()
    assert reflector.quotable[-1] == [list(ACTIONS), list(ACTIONS)]  # Taxi: every action valid
    shown = [view.menu for view in env.last_views]
    # The expert's move in each env (never an episode's end), at its place on the shuffled menu.
    taken = [ACTIONS[expert_action(e)] for e in env.envs]
    env.step(np.array([shown[i].index(taken[i]) for i in range(2)]))
    assert reflector.quotable[-1] == [[*ACTIONS, taken[0]], [*ACTIONS, taken[1]]]
    off = RecordingReflector()
    plain = make_env(tokenizer, reflector=off, num_envs=2)
    plain.reset()
    assert off.quotable == [None]  # the flag off: plain requests


def test_no_reflection_ablation_never_calls(tokenizer: Any) -> None:
    reflector = RecordingReflector()
    env = make_env(tokenizer, "reflection.enabled=false", reflector=reflector)
    env.reset()
    env.step(np.array([0, 0, 0]))
    assert reflector.requests == [] and "# Analyze" not in env.last_prompts[0]


def test_next_step_autoreset(tokenizer: Any) -> None:
    env = make_env(tokenizer, "reflection.enabled=false", num_envs=1)
    env.reset()
    # "drop off passenger" with no passenger aboard is a dangerous no-op: the episode ends.
    _, reward, terminated, _, _ = env.step(np.array([ACTIONS.index("drop off passenger")]))
    assert terminated[0] and reward[0] == pytest.approx(-0.5)
    # The next step resets that env, ignores the action, and pays nothing.
    _, reward, terminated, truncated, _ = env.step(np.array([0]))
    assert reward[0] == 0 and not terminated[0] and not truncated[0]
    stats = env.pop_stats()
    assert stats["env_steps"] == 1 and len(stats["episodes"]) == 1
    assert stats["episodes"][0]["success"] is False


def test_shuffled_menu_maps_labels_to_the_shown_action(tokenizer: Any) -> None:
    for i in range(2):
        env = make_env(
            tokenizer, "reflection.enabled=false", "env.shuffle_options=true", num_envs=2
        )
        env.reset()
        assert any(list(o) != sorted(o) for o in env._orders)  # seeded shuffles, not identity
        # Label 'k' on the menu shows ACTIONS[order[k]]; choosing it must take that action.
        order = list(env._orders[i])
        lines = env.last_prompts[i].split("Valid actions:\n")[1].splitlines()
        assert lines[1] == f"2. {ACTIONS[order[1]]}"
        taken: list[int] = []
        inner_step = env.envs[i].step
        env.envs[i].step = lambda a, _t=taken, _s=inner_step: (_t.append(a), _s(a))[1]
        env.step(np.array([1, 1]))
        env.envs[i].step = inner_step
        assert taken == [order[1]]


def test_masked_label_is_rejected(tokenizer: Any) -> None:
    env = make_env(tokenizer, "reflection.enabled=false", num_envs=1)
    env.reset()
    with pytest.raises(ValueError, match="not on env 0's menu"):
        env.step(np.array([6]))


def test_observation_space_and_seeds(tokenizer: Any) -> None:
    first = make_env(tokenizer, "reflection.enabled=false", "run.seed=5")
    second = make_env(tokenizer, "reflection.enabled=false", "run.seed=5")
    other = make_env(tokenizer, "reflection.enabled=false", "run.seed=6")
    obs1, _ = first.reset()
    obs2, _ = second.reset()
    obs3, _ = other.reset()
    assert first.observation_space.contains(obs1)
    assert np.array_equal(obs1["input_ids"], obs2["input_ids"])
    assert not np.array_equal(obs1["input_ids"], obs3["input_ids"])
    assert obs1["option_mask"].sum() == 3 * 6


def test_stage_switch_applies_at_next_reset(tokenizer: Any) -> None:
    env = make_env(tokenizer, "reflection.enabled=false", num_envs=1)
    env.reset()
    env.set_stage("dropoff")
    assert env.stage == "dropoff"
    env.step(np.array([ACTIONS.index("drop off passenger")]))  # the old episode ends
    env.step(np.array([0]))  # reset into the new stage
    assert "in the taxi" in env.last_prompts[0].lower()
    with pytest.raises(ValueError, match="unknown stage"):
        env.set_stage("nope")


def test_episodes_are_credited_to_the_stage_they_were_played_in(tokenizer: Any) -> None:
    # Across a curriculum switch, episodes still running finish in their old stage: the real
    # path (vector env -> pop_stats) must say so, or the new stage is passed on old successes.
    env = make_env(tokenizer, "reflection.enabled=false", num_envs=2)
    env.set_stage("pickup")
    env.reset()
    env.set_stage("dropoff")  # the coordinator switches while both episodes are running
    drop = ACTIONS.index("drop off passenger")  # no passenger aboard: a dangerous no-op
    env.step(np.array([drop, drop]))
    assert [e["stage"] for e in env.pop_stats()["episodes"]] == ["pickup", "pickup"]
    env.step(np.array([0, 0]))  # NEXT_STEP: both reset, now in the new stage
    env.step(np.array([drop, drop]))  # in dropoff the passenger is aboard: a legal delivery?
    finished = env.pop_stats()["episodes"]
    assert finished and all(e["stage"] == "dropoff" for e in finished)


def test_counters_are_per_iteration(tokenizer: Any) -> None:
    reflector = RecordingReflector()
    env = make_env(tokenizer, reflector=reflector, num_envs=2)
    env.reset()
    expert = [expert_action(e) for e in env.envs]  # never a terminal no-op
    env.step(np.array(expert))
    first = env.pop_stats()
    assert first["reflection_calls"] == 4 and first["env_steps"] == 2
    env.step(np.array([expert_action(e) for e in env.envs]))
    second = env.pop_stats()
    assert second["reflection_calls"] == 2 and second["env_steps"] == 2  # not cumulative


def test_the_last_observation_of_an_episode_is_not_live(tokenizer: Any) -> None:
    env = make_env(tokenizer, "reflection.enabled=false", num_envs=2)
    obs, _ = env.reset()
    assert obs["live"].tolist() == [[1], [1]]
    drop = ACTIONS.index("drop off passenger")
    obs, _, terminated, _, _ = env.step(np.array([drop, 0]))
    assert terminated.tolist() == [True, False] and obs["live"].tolist() == [[0], [1]]
    obs, *_ = env.step(np.array([0, 0]))  # env 0 resets: its new first observation is live
    assert obs["live"].tolist() == [[1], [1]]


def first_observations(env: Any, episodes: int) -> list[str]:
    """The start state (prompt before the menu) of env 0's next `episodes` episodes."""
    drop = ACTIONS.index("drop off passenger")
    starts = []
    for _ in range(episodes):
        starts.append(env.last_prompts[0].split("Valid actions")[0])
        env.step(np.array([drop]))  # ends the episode (or, once aboard, still ends it)
        env.step(np.array([0]))  # NEXT_STEP reset
    return starts


def test_random_state_round_trip_continues_the_streams(tokenizer: Any) -> None:
    args = ("reflection.enabled=false", "curriculum.enabled=false")
    running = make_env(tokenizer, *args, num_envs=1)
    running.set_stage("full")
    running.reset()
    first_observations(running, 3)
    saved = running.random_state()
    json.loads(json.dumps(saved))  # checkpointed as JSON
    expected = first_observations(running, 4)[1:]  # [0] is the episode in flight at the save

    resumed = make_env(tokenizer, *args, num_envs=1)
    resumed.set_stage("full")
    resumed.reset()
    resumed.set_random_state(saved)
    assert resumed.random_state() == saved  # env streams, menu shuffles, seeded flags
    resumed.step(np.array([0]))  # every env starts a fresh episode from the restored streams
    assert first_observations(resumed, 3) == expected

    fresh = make_env(tokenizer, *args, num_envs=1)
    fresh.set_stage("full")
    fresh.reset()
    assert first_observations(fresh, 4)[1:] != expected  # without it: iteration 1's starts


def test_reflection_prompts_are_clipped_to_the_server_limit(tokenizer: Any) -> None:
    # vLLM answers HTTP 400 to a prompt over max_model_len - max_tokens; that error is not
    # retried and used to crash the worker on every restart. The prompt is clipped instead.
    reflector = RecordingReflector()
    env = make_env(
        tokenizer,
        "reflection.max_model_len=128",
        "reflection.max_tokens=16",
        reflector=reflector,
        num_envs=2,
    )
    env.reset()
    sent = reflector.requests[0]
    assert len(sent) == 2
    for prompt in sent:
        assert len(tokenizer.encode(prompt, add_special_tokens=False)) <= 128 - 16
        assert prompt.startswith("You drive a taxi") and prompt.endswith(" # Analyze:\n")
    assert env.pop_stats()["clipped_reflection_prompts"] == 2
    roomy = make_env(tokenizer, reflector=RecordingReflector(), num_envs=2)
    roomy.reset()
    assert roomy.pop_stats()["clipped_reflection_prompts"] == 0


def test_the_worker_index_seeds_the_streams(tokenizer: Any) -> None:
    # RLlib's vector entry point passes no worker index: the callback sets it before the first
    # reset, or every worker would play the same start states.
    first = make_env(tokenizer, "reflection.enabled=false")
    second = make_env(tokenizer, "reflection.enabled=false")
    second.set_worker_index(2)
    assert second.worker_index == 2
    obs1, _ = first.reset()
    obs2, _ = second.reset()
    assert not np.array_equal(obs1["input_ids"], obs2["input_ids"])
    with pytest.raises(RuntimeError, match="before the first reset"):
        second.set_worker_index(3)


def play_with_interruptions(env: Any) -> tuple[list[Any], int]:
    """60 random steps across a stage switch, listed starts and a restored checkpoint: what
    came out (arrays as lists, the process RNG left out), and how many resets were pending
    after a step."""
    rng = np.random.default_rng(0)
    obs, _ = env.reset()
    out: list[Any] = [obs["input_ids"].tolist()]
    pending = saved = 0
    for t in range(60):
        actions = [rng.choice(np.flatnonzero(m)) for m in obs["option_mask"]]
        obs, reward, terminated, truncated, _ = env.step(np.array(actions))
        out.append([obs[k].tolist() for k in sorted(obs)])
        out.append([reward.tolist(), terminated.tolist(), truncated.tolist()])
        pending += 0 if env._prefetch is None else len(env._prefetch.pending)
        if t == 20:
            env.set_stage("dropoff")
        if t == 30:
            env.set_starts([[s] for s in env.envs[0].start_ids("full")[:3]])
        if t == 40:
            saved = env.random_state()
        if t == 50:
            env.set_random_state(saved)
        if t % 7 == 0:
            out.append({**env.random_state(), "process": None})
            out.append(env.pop_stats()["episodes"])
    return out, pending


def test_prefetched_resets_change_nothing_but_when_resets_run(tokenizer: Any) -> None:
    # Each of the interruptions undoes a prefetched reset; the results must not tell.
    args = ("env.options={max_steps: 3}", "curriculum.enabled=false")
    inline, inline_pending = play_with_interruptions(
        make_env(tokenizer, *args, "env.prefetch_resets=false", reflector=RecordingReflector())
    )
    prefetched, pending = play_with_interruptions(
        make_env(tokenizer, *args, "env.prefetch_resets=true", reflector=RecordingReflector())
    )
    assert inline_pending == 0 and pending >= 40  # most steps had a reset running behind
    assert sum(len(x) for x in inline if isinstance(x, list) and x and isinstance(x[0], dict)) > 20
    assert prefetched == inline


def test_a_worker_takes_its_seeds_and_reflection_replica_from_its_index() -> None:
    """RLlib builds the env without the worker index; `set_worker_index` (from the callback)
    is the one place that picks the worker's streams, reflection seed and replica."""
    from reflectrl.reflection.endpoint import ReflectionEndpoint
    from reflectrl.rollout.env_creator import make_vector_env
    from reflectrl.seeding import hash_seed

    config = load_config(None, ["policy.model=tiny", "reflection.model=tiny", "run.seed=7"])
    urls = [f"http://127.0.0.1:{port}/v1" for port in (9101, 9102, 9103)]
    ctx = {
        "reflectrl": config.model_dump(mode="json"),
        "reflection": ReflectionEndpoint(urls=urls).to_dict(),
        "num_envs": 2,
    }
    streams = {}
    for worker in (1, 2, 3, 5):
        env = make_vector_env(ctx)
        assert (env.worker_index, env.reflector.replica) == (0, 0)
        env.set_worker_index(worker)
        assert env.reflector.seed == hash_seed(7, worker)
        assert env.reflector.base_url == urls[(worker - 1) % 3]
        streams[worker] = env.random_state()
    assert len({json.dumps(s, sort_keys=True, default=str) for s in streams.values()}) == 4


def new_episodes(env: Any, steps: int, last: list[str]) -> list[tuple[int, int, int]]:
    """(group index, draw, start state) of every episode that begins in `steps` steps of
    "go south" (episodes of a few steps); `last` holds each env's group id so far."""
    begun = []
    for _ in range(steps):
        _, _, _, _, infos = env.step(np.array([0] * env.num_envs))
        for i, group in enumerate(str(g) for g in infos["group"]):
            if group != last[i]:  # a reset step: the taxi is still at its start
                _, index, draw = (int(x) for x in group.split(":"))
                begun.append((index, draw, int(env.envs[i].taxi.s)))
                last[i] = group
    return begun


@pytest.mark.parametrize("prefetch", [True, False])
def test_a_group_of_envs_starts_from_one_start_and_a_resume_draws_the_same_groups(
    tokenizer: Any, prefetch: bool
) -> None:
    args = (
        "reflection.enabled=false",
        "curriculum.enabled=false",
        "rl.group_size=3",
        "env.envs_per_worker=6",
        "env.options={max_steps: 4}",
        f"env.prefetch_resets={str(prefetch).lower()}",
    )
    env = make_env(tokenizer, *args, num_envs=6)
    env.set_stage("full")
    env.reset()
    # The first episodes: envs 0-2 one draw, envs 3-5 another, each group one start.
    starts = [int(e.taxi.s) for e in env.envs]
    assert len(set(starts[:3])) == 1 and len(set(starts[3:])) == 1
    last = [""] * 6
    first = new_episodes(env, 1, last)
    assert sorted((g, d) for g, d, _ in first) == [(0, 0)] * 3 + [(1, 0)] * 3
    # Later episodes: three to a draw, every episode of a draw from the draw's start.
    straight = first + new_episodes(env, 9, last)
    starts_of = {(g, d): s for g, d, s in straight}
    assert all(starts_of[(g, d)] == s for g, d, s in straight)
    saved = env.random_state()
    json.loads(json.dumps(saved))
    after_save = new_episodes(env, 12, last)
    assert len(after_save) > 6

    resumed = make_env(tokenizer, *args, num_envs=6)
    resumed.set_stage("full")
    resumed.reset()
    resumed.set_random_state(saved)
    again = new_episodes(resumed, 1, [""] * 6)  # every env starts a fresh episode
    assert len(again) == 6
    for group in (0, 1):
        next_draw = saved["group_resets"][group] // 3
        # The straight run's next episode in the group and the resumed run's first: one draw.
        assert min(d for g, d, _ in after_save if g == group) == next_draw
        assert min(d for g, d, _ in again if g == group) == next_draw
    # The same draws, the same starts.
    later = {(g, d): s for g, d, s in after_save}
    assert all(later[(g, d)] == s for g, d, s in again if (g, d) in later)
    assert sum((g, d) in later for g, d, _ in again) >= 4


def test_episode_records_say_how_an_episode_ended(tokenizer: Any) -> None:
    env = make_env(tokenizer, "reflection.enabled=false", "env.options={max_steps: 1}", num_envs=2)
    env.set_stage("full")
    env.reset()
    drop = ACTIONS.index("drop off passenger")  # no passenger aboard: a dangerous no-op
    env.step(np.array([drop, expert_action(env.envs[1])]))  # a legal move hits the step limit
    danger, limit = env.pop_stats()["episodes"]
    assert (danger["success"], danger["step_limit"]) == (False, False)  # ended in failure
    assert (limit["success"], limit["step_limit"]) == (False, True)
