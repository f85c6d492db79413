"""Advantages (reflectrl/rl/advantages.py) against hand computations, and the learner connector
that puts them in a real RLlib train batch (reflectrl/rl/advantage_connector.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.core.columns import Columns
from ray.rllib.evaluation.postprocessing import Postprocessing
from ray.rllib.utils.postprocessing.value_predictions import compute_value_targets

from reflectrl.config import load_config
from reflectrl.rl.advantages import (
    AdvantageSettings,
    Episode,
    StateTable,
    estimate,
    standardise,
)
from reflectrl.rl.learner import STATE_TABLE
from tests.helpers import perturb
from tests.support.in_process import SHORT_EPISODES, build_in_process

MID = DEFAULT_MODULE_ID
SMOKE = Path(__file__).resolve().parents[1] / "configs" / "smoke.yaml"
OVERRIDES = SHORT_EPISODES

# --- hand-made episodes ------------------------------------------------------------------
# A terminated episode and a chunk cut after two steps (bootstrapped from V = 1.0).
TERMINATED = Episode(np.array([1.0, 0.0, 2.0]), True, values=np.array([0.5, 0.2, 0.1, 9.0]))
CUT = Episode(np.array([0.0, 1.0]), False, values=np.array([0.3, 0.4, 1.0]))
# Three episodes of one group (returns 2, 0, 1) and one alone in its group (return 3). The
# observation "x" opens both of group s1's first two episodes and "y" ends both: anchor groups
# that span two trajectories. "x" also opens the lone episode, which is in another group.
GROUPED = [
    Episode(np.array([1.0, 1.0]), True, group="s1", digests=["x", "y"]),
    Episode(np.array([0.0, 0.0, 0.0]), False, group="s1", digests=["x", "z", "y"]),
    Episode(np.array([1.0]), True, group="s1", digests=["w"]),
    Episode(np.array([3.0]), True, group="s2", digests=["x"]),
]


def _estimate(episodes: list[Episode], **settings: Any) -> list[list[float]]:
    result = estimate(episodes, AdvantageSettings(**settings))
    return [list(a) for a in result.advantages]


def test_gae_by_hand() -> None:
    # gamma 0.9, lambda 0.8: delta_t = r_t + 0.9 V_{t+1} (0 after the terminal) - V_t, and
    # A_t = delta_t + 0.72 A_{t+1}. Terminated: 1.9; -0.11 + 0.72 * 1.9; 0.68 + 0.72 * 1.258.
    # Cut (bootstraps V = 1.0): 1 + 0.9 - 0.4 = 1.5; 0.9 * 0.4 - 0.3 + 0.72 * 1.5 = 1.14.
    result = estimate([TERMINATED, CUT], AdvantageSettings("gae", gamma=0.9, lambda_=0.8))
    np.testing.assert_allclose(result.advantages[0], [1.58576, 1.258, 1.9])
    np.testing.assert_allclose(result.advantages[1], [1.14, 1.5])
    assert result.value_targets is not None
    np.testing.assert_allclose(result.value_targets[0], [2.08576, 1.458, 2.0])
    np.testing.assert_allclose(result.value_targets[1], [1.44, 1.9])


def test_reinforce_is_the_discounted_return_to_go() -> None:
    advantages = _estimate([TERMINATED, CUT], estimator="reinforce", gamma=0.9)
    np.testing.assert_allclose(advantages[0], [1 + 0.9 * 1.8, 1.8, 2.0])
    np.testing.assert_allclose(advantages[1], [0.9, 1.0])


def test_rloo_leaves_one_out_and_a_lone_episode_uses_the_batch() -> None:
    result = estimate(GROUPED, AdvantageSettings("rloo"))
    # s1: 2 - (0 + 1)/2, 0 - (2 + 1)/2, 1 - (2 + 0)/2; the lone one: 3 - (2 + 0 + 1)/3.
    assert [a[0] for a in result.advantages] == pytest.approx([1.5, -1.5, 0.0, 2.0])
    assert [len(a) for a in result.advantages] == [2, 3, 1, 1]  # broadcast to every step
    assert result.fallback_episodes == 1
    # A batch of one episode: no one to compare with, the baseline is 0.
    assert _estimate([GROUPED[3]], estimator="rloo") == [[3.0]]


def test_grpo_scales_by_the_group_std() -> None:
    advantages = _estimate(GROUPED, estimator="grpo")
    s1_std, batch_std = np.std([2.0, 0.0, 1.0]), np.std([2.0, 0.0, 1.0, 3.0])
    expected = [1 / s1_std, -1 / s1_std, 0.0, 1.5 / batch_std]
    assert [a[0] for a in advantages] == pytest.approx(expected, rel=1e-5)


def test_gigpo_adds_a_step_advantage_over_anchor_states() -> None:
    result = estimate(
        GROUPED,
        AdvantageSettings("gigpo", gamma=0.9, step_advantage_weight=0.5, scale_by_std=False),
    )
    # Episode part: return - group mean (s1: 2, 0, 1 -> 1, -1, 0; the lone one: 3 - 1.5).
    # Step part, returns-to-go [1.9, 1], [0, 0, 0], [1], [3]: "x" in s1 is 1.9 and 0 (mean
    # 0.95), "y" is 1 and 0 (mean 0.5); "z", "w" and the other group's "x" are alone: 0.
    expected = [[1.475, 1.25], [-1.475, -1.0, -1.25], [0.0], [1.5]]
    for got, want in zip(result.advantages, expected, strict=True):
        np.testing.assert_allclose(got, want)
    assert result.anchor_steps == 4
    assert result.fallback_episodes == 1


def test_gigpo_needs_a_digest_per_step() -> None:
    with pytest.raises(ValueError, match="digest"):
        estimate([TERMINATED], AdvantageSettings("gigpo"))


def test_state_table_subtracts_the_running_mean_of_every_visit_so_far() -> None:
    settings = AdvantageSettings("state_table", gamma=0.9)
    table = StateTable()
    first = estimate(GROUPED, settings, table)
    # Returns-to-go [1.9, 1], [0, 0, 0], [1], [3]. "x": 1.9, 0 and 3 (mean 4.9 / 3; groups do
    # not matter), "y": 1 and 0 (mean 0.5); "z" and "w" are seen once: 0.
    x = 4.9 / 3
    expected = [[1.9 - x, 0.5], [-x, 0.0, -0.5], [0.0], [3 - x]]
    for got, want in zip(first.advantages, expected, strict=True):
        np.testing.assert_allclose(got, want)
    assert first.anchor_steps == 0  # the table was empty before this batch
    assert first.value_targets is None
    # The next batch is measured against the table with this batch in it: "x" has 1.9, 0, 3
    # and now 1.0 (mean 1.475); "q" is new.
    second = estimate([Episode(np.array([1.0]), True, digests=["x"])], settings, table)
    np.testing.assert_allclose(second.advantages[0], [1.0 - 1.475])
    assert second.anchor_steps == 1
    assert table.counts["x"] == 4 and table.value("y") == pytest.approx(0.5)
    restored = StateTable()
    restored.load(table.state())
    assert restored == table


def test_state_table_bootstraps_a_truncated_episode_from_its_last_observation() -> None:
    """rl.bootstrap_step_limit: a return the step limit cut goes on from the table's value of
    the observation after its last step, as the table stood before this batch; a terminated
    episode, or a truncated one whose last observation the table has not seen, keeps its own."""
    table = StateTable()
    table.add("end", -4.0)
    table.add("end", -2.0)  # V(end) = -3
    cut = Episode(np.array([1.0, 0.0]), False, digests=["a", "b"], bootstrap_digest="end")
    ended = Episode(np.array([1.0]), True, digests=["a"], bootstrap_digest="end")
    unseen = Episode(np.array([2.0]), False, digests=["c"], bootstrap_digest="new")
    settings = AdvantageSettings("state_table", gamma=0.5, bootstrap_step_limit=True)
    result = estimate([cut, ended, unseen], settings, table)
    # cut's returns: [1 + 0.5 * 0, 0] plus [0.5^2, 0.5] x -3 = [0.25, -1.5]; ended's 1.
    # "a": 0.25 and 1 (mean 0.625); "b" and "c" are seen once: 0.
    np.testing.assert_allclose(result.advantages[0], [0.25 - 0.625, 0.0])
    np.testing.assert_allclose(result.advantages[1], [1.0 - 0.625])
    np.testing.assert_allclose(result.advantages[2], [0.0])
    assert table.value("b") == pytest.approx(-1.5) and table.value("c") == pytest.approx(2.0)
    # Without the setting, the cut return stops at the limit.
    plain = StateTable()
    plain.load(StateTable(sums={"end": -6.0}, counts={"end": 2}).state())
    estimate([cut], AdvantageSettings("state_table", gamma=0.5), plain)
    assert plain.value("a") == pytest.approx(1.0)


def test_state_model_evaluates_the_transitions_seen_so_far() -> None:
    """state_model by hand, gamma 0.5. Batch 1: a -> b (reward 1), b -> a (0; the step limit
    cut the episode there), a -> end (2). V(a) = (1 + 2) / 2 + 0.5 * V(b) / 2 and V(b) =
    0.5 V(a): V(a) = 12/7, V(b) = 6/7; A = r + 0.5 V(next) - V(s), V = 0 after the end."""
    settings = AdvantageSettings("state_model", gamma=0.5)
    table = StateTable()
    looped = Episode(np.array([1.0, 0.0]), False, digests=["a", "b"], bootstrap_digest="a")
    ended = Episode(np.array([2.0]), True, digests=["a"], bootstrap_digest="after")
    first = estimate([looped, ended], settings, table)
    np.testing.assert_allclose(first.advantages[0], [1 + 3 / 7 - 12 / 7, 0.0], atol=1e-7)
    np.testing.assert_allclose(first.advantages[1], [2 - 12 / 7], atol=1e-7)
    assert first.anchor_steps == 0 and first.value_targets is None
    assert table.transitions["a"] == {"b": [1, 1.0], None: [1, 2.0]}
    # Batch 2: b -> "new", a state never left (V 0). Now V(b) = 0.5 V(a) / 2 and V(a) =
    # 1.5 + 0.25 V(b): V(a) = 1.6, V(b) = 0.4; the cut step's A = 0 + 0.5 * 0 - 0.4.
    cut = Episode(np.array([0.0]), False, digests=["b"], bootstrap_digest="new")
    second = estimate([cut], settings, table)
    np.testing.assert_allclose(second.advantages[0], [-0.4], atol=1e-7)
    assert second.anchor_steps == 1
    restored = StateTable()
    restored.load(table.state())
    assert restored == table


def test_state_table_needs_its_table_and_digests() -> None:
    with pytest.raises(ValueError, match="StateTable"):
        estimate(GROUPED, AdvantageSettings("state_table"))
    with pytest.raises(ValueError, match="digest"):
        estimate([TERMINATED], AdvantageSettings("state_table"), StateTable())


# --- the connector on a real train batch ---------------------------------------------------


@pytest.fixture(scope="module")
def sampled() -> tuple[Any, list[Any]]:
    local = build_in_process(load_config(SMOKE, OVERRIDES))
    perturb(local.module)  # values and logits away from 0, so advantages are not trivial
    local.sync_weights()
    torch.manual_seed(0)
    return local, local.sample()


def test_advantages_are_standardised_over_the_loss_rows_only(sampled: tuple) -> None:
    local, episodes = sampled
    batch = local.train_batch(episodes)[MID]
    loss = batch[Columns.LOSS_MASK].numpy().astype(bool)
    advantages = batch[Postprocessing.ADVANTAGES].numpy()
    assert (~loss).sum() == len(episodes)  # one bootstrap row per chunk
    assert advantages[loss].mean() == pytest.approx(0.0, abs=1e-5)
    assert advantages[loss].std() == pytest.approx(1.0, abs=1e-4)
    assert not advantages[~loss].any()  # a bootstrap row carries no advantage
    # The raw advantages are RLlib's GAE (its value targets minus the values), row by row.
    values = local.module.compute_values(batch).detach().numpy()
    targets = compute_value_targets(
        values=values,
        rewards=batch[Columns.REWARDS].numpy(),
        terminateds=batch[Columns.TERMINATEDS].numpy().astype(float),
        truncateds=batch[Columns.TRUNCATEDS].numpy().astype(float),
        gamma=local.ppo_config.gamma,
        lambda_=local.ppo_config.lambda_,
    )
    np.testing.assert_allclose(
        batch[Postprocessing.VALUE_TARGETS].numpy()[loss], targets[loss], atol=1e-5
    )
    np.testing.assert_allclose(advantages[loss], standardise((targets - values)[loss]), atol=1e-4)


def test_rllibs_own_gae_leaves_the_loss_rows_off_centre(sampled: tuple) -> None:
    """Why the connector exists: RLlib 2.60 standardises over every row, bootstrap rows
    included, so the loss rows' advantages are not centred. If RLlib fixes that, this fails
    and our connector can go."""
    local, episodes = sampled
    stock = build_in_process(local.config, learner_class=PPOTorchLearner)
    stock.module.set_state(local.module.get_state())
    batch = stock.train_batch(episodes)[MID]
    loss = batch[Columns.LOSS_MASK].numpy().astype(bool)
    advantages = batch[Postprocessing.ADVANTAGES].numpy()
    assert advantages.mean() == pytest.approx(0.0, abs=1e-5)  # over all rows
    assert abs(advantages[loss].mean()) > 1e-3
    assert advantages[~loss].any()


def test_a_critic_free_estimator_builds_no_value_head() -> None:
    config = load_config(
        SMOKE,
        [*OVERRIDES, "rl.advantage=gigpo", "ppo.batch_mode=complete_episodes", "rl.group_size=3"],
    )
    free = build_in_process(config)
    assert free.module.policy.value_head is None
    assert not any("value_head" in k for k in free.module.get_state())
    assert not free.ppo_config.use_critic
    episodes = free.sample()
    assert all(e.is_done for e in episodes)  # whole episodes
    batch = free.train_batch(episodes)[MID]
    # The three envs are one group: each episode is compared with its group, not the batch.
    groups = {e.get_infos(-1)["group"] for e in episodes}
    alone = free.learner.metrics.peek((MID, "advantage_batch_baseline_episodes"))
    assert len(groups) < len(episodes) and alone < len(episodes)
    loss = batch[Columns.LOSS_MASK].numpy().astype(bool)
    assert batch[Postprocessing.ADVANTAGES].numpy()[loss].std() == pytest.approx(1.0, abs=1e-4)
    results = free.update(episodes)
    stats = results[0][MID] if isinstance(results, list) else results[MID]
    assert "vf_loss" not in stats and "policy_loss" in stats


def _visits(table: dict[str, Any], estimator: str) -> int:
    if estimator == "state_table":
        return sum(table["counts"].values())
    return sum(count for out in table["transitions"].values() for count, _ in out.values())


@pytest.mark.parametrize("estimator", ["state_table", "state_model"])
def test_the_table_lives_on_in_the_learner_and_its_checkpoint_state(estimator: str) -> None:
    """The table grows over iterations in the learner's connector, goes into the learner's
    checkpoint state (not into a weight sync), and a fresh learner restored from that state
    holds the same table."""
    overrides = [*OVERRIDES, f"rl.advantage={estimator}", "ppo.batch_mode=complete_episodes"]
    config = load_config(SMOKE, overrides)
    local = build_in_process(config)
    assert local.module.policy.value_head is None
    episodes = local.sample()
    local.train_batch(episodes)
    state = local.learner.get_state()
    visits = _visits(state[STATE_TABLE], estimator)
    assert visits == sum(len(e) for e in episodes)  # every step, keyed by its prompt
    local.train_batch(local.sample())
    assert _visits(local.learner.get_state()[STATE_TABLE], estimator) > visits
    assert STATE_TABLE not in local.learner.get_state(components="rl_module")

    fresh = build_in_process(config)
    fresh.learner.set_state(local.learner.get_state())
    assert fresh.learner.get_state()[STATE_TABLE] == local.learner.get_state()[STATE_TABLE]
    # Without a table estimator, the learner state has no table.
    assert STATE_TABLE not in build_in_process(load_config(SMOKE, OVERRIDES)).learner.get_state()


def test_the_connector_bootstraps_truncated_episodes_from_the_table() -> None:
    """rl.bootstrap_step_limit on a real batch: the same two batches of one start with a
    3-step limit fill the two learners' tables with the same visits, and the bootstrapped
    one's returns sum lower (a step costs, so V of a state after the cut is below 0)."""
    overrides = [
        *OVERRIDES, "rl.advantage=state_table", "ppo.batch_mode=complete_episodes",
        "env.options.starts=[2]", "env.options.max_steps=3",
    ]  # fmt: skip
    plain = build_in_process(load_config(SMOKE, overrides))
    boot = build_in_process(load_config(SMOKE, [*overrides, "rl.bootstrap_step_limit=true"]))
    boot.module.set_state(plain.module.get_state())
    batches = [plain.sample(), plain.sample()]
    assert any(e.is_truncated for e in batches[1])
    for episodes in batches:
        plain.train_batch(episodes)
        boot.train_batch(episodes)
    tables = [local.learner.get_state()[STATE_TABLE] for local in (plain, boot)]
    assert tables[0]["counts"] == tables[1]["counts"]
    assert sum(tables[1]["sums"].values()) < sum(tables[0]["sums"].values()) - 1e-6
