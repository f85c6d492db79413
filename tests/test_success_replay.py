"""Success replay (reflectrl/rl/success_replay.py): the buffer, its rows in a real train batch,
and the self-imitation term of the learner's update."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.core.columns import Columns
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from ray.rllib.evaluation.postprocessing import Postprocessing

from reflectrl.config import load_config
from reflectrl.rl.success_replay import REPLAY_COLUMN, SuccessReplay, is_replay
from tests.support.in_process import build_in_process

MID = DEFAULT_MODULE_ID
SMOKE = Path(__file__).resolve().parents[1] / "configs" / "smoke.yaml"


def episode(steps: int, success: bool, stage: str, done: bool = True) -> SingleAgentEpisode:
    """An episode of `steps` steps whose last info says how it ended."""
    result = SingleAgentEpisode()
    result.add_env_reset(observation=0, infos={"stage": stage})
    for t in range(steps):
        last = t == steps - 1
        result.add_env_step(
            observation=t + 1,
            action=t % 2,
            reward=1.0 if last and success else 0.0,
            infos={"success": last and success and done, "stage": stage},
            terminated=last and done,
        )
    return result


def test_keeps_the_current_stages_successes_and_clears_at_a_switch(tmp_path: Path) -> None:
    replay = SuccessReplay(capacity=2)
    batch = [episode(3, True, "pickup"), episode(2, False, "pickup"), episode(4, True, "full")]
    replay.observe(batch, "pickup")
    assert [len(e) for e in replay.episodes] == [3]  # the failure and the other stage: out
    replay.observe([episode(5, True, "pickup"), episode(6, True, "pickup")], "pickup")
    assert [len(e) for e in replay.episodes] == [5, 6]  # the last `capacity` ones
    copies = replay.for_update()
    assert all(is_replay(e) for e in copies) and not any(is_replay(e) for e in replay.episodes)
    # Saved and restored as it was.
    replay.save(tmp_path / "replay.pkl")
    restored = SuccessReplay(capacity=2)
    restored.load(tmp_path / "replay.pkl")
    assert restored.stage == "pickup" and [len(e) for e in restored.episodes] == [5, 6]
    assert list(restored.episodes[0].get_actions()) == list(replay.episodes[0].get_actions())
    # A stage switch empties it.
    replay.observe([episode(2, True, "pickup")], "dropoff")
    assert not replay.episodes and replay.stage == "dropoff"


def successful_rest(running: SingleAgentEpisode) -> SingleAgentEpisode:
    """The next chunk of a running episode: one step that succeeds."""
    rest = running.cut()
    infos = {"success": True, "stage": "full"}
    rest.add_env_step(observation=9, action=1, reward=1.0, infos=infos, terminated=True)
    return rest


def test_joins_an_episode_cut_across_iterations() -> None:
    replay = SuccessReplay(capacity=5)
    running = episode(2, False, "full", done=False)
    rest = successful_rest(running)
    replay.observe([running], "full")
    assert not replay.episodes
    replay.observe([rest], "full")
    assert [len(e) for e in replay.episodes] == [3]
    # A chunk whose start was never seen (a resume in mid-episode) is not kept.
    replay.observe([successful_rest(episode(2, False, "full", done=False))], "full")
    assert [len(e) for e in replay.episodes] == [3]


@pytest.fixture(scope="module")
def local() -> Any:
    config = load_config(
        SMOKE,
        [
            "reflection.enabled=false",
            "env.options.max_steps=6",
            "env.envs_per_worker=3",
            "ppo.rollout_fragment_length=12",
            "rl.success_replay.episodes=50",
            "rl.success_replay.weight=10",
        ],
    )
    return build_in_process(config)


def replays_of(episodes: list[Any]) -> list[Any]:
    replay = SuccessReplay(capacity=50)
    replay.episodes.extend(copy.deepcopy(e) for e in episodes if e.is_done)
    return replay.for_update()


def test_replayed_rows_leave_the_ppo_loss_and_are_marked(local: Any) -> None:
    torch.manual_seed(0)
    episodes = local.sample()
    replays = replays_of(episodes)
    batch = local.train_batch([*episodes, *replays])[MID]
    marked = batch[REPLAY_COLUMN].numpy().astype(bool)
    loss = batch[Columns.LOSS_MASK].numpy().astype(bool)
    assert marked.sum() == sum(len(e) for e in replays)
    assert not (marked & loss).any()
    assert loss.sum() == sum(len(e) for e in episodes)
    advantages = batch[Postprocessing.ADVANTAGES].numpy()
    assert not advantages[marked].any()
    assert advantages[loss].std() == pytest.approx(1.0, abs=1e-4)


def test_the_update_raises_the_log_prob_of_replayed_actions(local: Any) -> None:
    torch.manual_seed(1)
    replays = replays_of(local.sample())
    batch = local.train_batch(replays)[MID]
    rows = torch.nonzero(batch[REPLAY_COLUMN])[:, 0]

    def mean_log_prob() -> float:
        obs = {k: v[rows] for k, v in batch[Columns.OBS].items()}
        with torch.no_grad():
            logits = local.module.forward_train({Columns.OBS: obs})[Columns.ACTION_DIST_INPUTS]
        dist = torch.distributions.Categorical(logits=logits)
        return float(dist.log_prob(batch[Columns.ACTIONS][rows]).mean())

    before = mean_log_prob()
    results = local.update(replays)
    stats = results[0][MID] if isinstance(results, list) else results[MID]
    nll = stats["success_replay_nll"]  # RLlib's stats object
    assert np.isfinite(float(nll.peek()))
    assert mean_log_prob() > before + 0.01
