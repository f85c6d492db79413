"""Whole-episode sampling (reflectrl/rollout/episode_runner.py) against RLlib's own, on a real
rollout worker in this process: RLlib drops the episodes still running when `num_envs` have
ended, so the long ones are the ones lost; ours plays every episode that began within the cut
to its end, and the vector env's records hold exactly those episodes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner
from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME

from reflectrl.config import load_config
from reflectrl.rollout.episode_runner import WholeEpisodeEnvRunner
from tests.support.in_process import SHORT_EPISODES, in_process_ppo_config

SMOKE = Path(__file__).resolve().parents[1] / "configs" / "smoke.yaml"
# Episodes of 1-6 steps (a dangerous no-op ends one at once), 3 envs, a cut at 12 steps.
WHOLE = [*SHORT_EPISODES, "ppo.batch_mode=complete_episodes"]
CALLS = 6


def _sample(runner_class: type) -> tuple[list[list], list[int], int]:
    """Episodes returned per call, the vector env's recorded episode lengths, env steps run."""
    ppo_config = in_process_ppo_config(load_config(SMOKE, WHOLE))
    runner = runner_class(config=ppo_config, worker_index=1)
    returned, recorded = [], []
    for _ in range(CALLS):
        returned.append(runner.sample(explore=True))
        recorded += [e["length"] for e in runner.env.unwrapped.pop_stats()["episodes"]]
    sampled = runner.metrics.peek(NUM_ENV_STEPS_SAMPLED_LIFETIME)
    runner.stop()
    return returned, recorded, int(sampled)


@pytest.fixture(scope="module")
def stock() -> tuple[list[list], list[int], int]:
    return _sample(SingleAgentEnvRunner)


@pytest.fixture(scope="module")
def whole() -> tuple[list[list], list[int], int]:
    return _sample(WholeEpisodeEnvRunner)


def test_rllibs_complete_episodes_drop_the_running_ones(stock: tuple) -> None:
    """Why the runner exists: RLlib returns the first `num_envs` episodes to end and drops the
    rest, steps and all. If RLlib stops doing that, this fails and the runner can go."""
    returned, _, sampled = stock
    assert all(len(call) < 3 + 3 for call in returned)  # num_envs .. num_envs + num_envs - 1
    kept = sum(len(e) for call in returned for e in call)
    assert kept < sampled


def test_every_episode_that_began_within_the_cut_is_played_to_its_end(whole: tuple) -> None:
    returned, recorded, sampled = whole
    episodes = [e for call in returned for e in call]
    assert all(e.is_done for e in episodes)
    # Each env's episodes fill at least its first 12 steps: at least 3 x 12 steps a call.
    assert all(sum(len(e) for e in call) >= 3 * 12 for call in returned)
    for episode in episodes:  # joined from chunks: one reset, every step in order
        assert episode.t_started == 0 and len(episode.get_rewards()) == len(episode)
        assert len(episode.observations) == len(episode) + 1
    # The vector env recorded exactly the episodes the learner gets (the curriculum's success
    # rate is over the same episodes).
    assert sorted(recorded) == sorted(len(e) for e in episodes)
    assert sum(len(e) for e in episodes) <= sampled


def test_whole_episodes_are_not_shorter_than_the_env_plays_them(stock: tuple, whole: tuple) -> None:
    """RLlib's returned episodes are the short end of what the env played; ours are not."""
    stock_lengths = [len(e) for call in stock[0] for e in call]
    whole_lengths = [len(e) for call in whole[0] for e in call]
    assert np.mean(whole_lengths) > np.mean(stock_lengths)
