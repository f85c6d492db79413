"""The rollout worker's vector env: batched reflection, autoreset, shuffling, seeds, stages."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from reflectrl.config import load_config
from reflectrl.envs.taxi import ACTIONS
from reflectrl.rollout_workers.vector_env import ReflectRLVectorEnv


class RecordingReflector:
    """Stands in for the reflection client inside this unit test of the code around it."""

    def __init__(self) -> None:
        self.requests: list[list[str]] = []
        self.calls = 0

    def reflect(self, prompts: list[str]) -> list[str]:
        self.requests.append(list(prompts))
        self.calls += len(prompts)
        return [f"reflection {i}" for i in range(len(prompts))]


def make_env(tokenizer: Any, *overrides: str, num_envs: int = 3, reflector: Any = None) -> Any:
    config = load_config(None, ["policy.model=tiny", *overrides])
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
