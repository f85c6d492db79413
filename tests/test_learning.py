"""The method learns: PPO from reward alone, and SFT alone, clearly beat the untrained policy
on small tasks.

PPO: DangerousTaxi `pickup` from a handful of train starts, sampling overlapped with learning
(one update stale). That the update is the same PPO math with or without the overlap is
tests/test_rllib_batch.py's (`test_fast_update_path_equals_rllibs_own` and the log-prob ratio).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from reflectrl.config import load_config
from reflectrl.evaluation.episodes import evaluate

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.integration


# Five train starts, each 1-2 actions from a pick-up: at 2, 84 and 408 the taxi is at the
# passenger's cell (the status line says so; "pick up passenger"), at 21 and 492 it is one cell
# east of the passenger ("go west", then the pick-up). Every other first action ends the
# episode or wastes a step. The decision rests on what the observation says; telling grids
# apart by the taxi's cell alone is what a random-init trunk cannot do quickly
# (diagnostics/grid_separation.py).
HANDFUL = [2, 21, 84, 408, 492]
# Over run.seed 0-2 with each estimator below, greedy success on the five starts reaches 1.0
# within 2-4 iterations and is 1.0 after the 6th, and the sampled success of the last three
# tops the first by 0.3-0.8 (diagnostics/learning_test_budget.py).
ITERATIONS = 6


# From reward alone: no SFT, no reflection, a random-init model, LoRA over every layer.
FROM_REWARD = [
    "reflection.enabled=false",
    "sft.enabled=false",
    "policy.model=scratch:dangerous_taxi",  # the CPU recipe's model (512 token ids)
    f"env.options.starts={HANDFUL}",
    "env.options.max_steps=8",
    "env.envs_per_worker=8",  # 2 workers x 8 envs x 16 = 256 env steps per iteration
    "curriculum.stages=[{name: pickup}]",
    "ppo.lr=0.003",
    "ppo.entropy_coeff=0.0",
    "ppo.num_epochs=4",
    "ppo.minibatch_size=64",
    "policy.lora.target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]",
]


def handful_greedy_success(config: Any) -> Any:
    """A function giving a policy's greedy success on the five starts, each played once."""
    from reflectrl.data.scratch import resolve_or_build
    from reflectrl.evaluation.episodes import play
    from reflectrl.models.loading import load_tokenizer
    from reflectrl.rollout.vector_env import ReflectRLVectorEnv

    tokenizer = load_tokenizer(resolve_or_build(config.policy.model))
    eval_env = ReflectRLVectorEnv(config, tokenizer, None, num_envs=len(HANDFUL))
    eval_env.set_stage("pickup")
    starts = [str(s) for s in HANDFUL]

    def greedy_success(policy: Any) -> float:
        played = play(policy, eval_env, len(starts), greedy=True, starts=starts)
        assert sorted(int(e["start"]) for e in played) == sorted(HANDFUL)
        return sum(e["success"] for e in played) / len(played)

    return greedy_success


def train_on_the_handful(
    tmp_path: Path, overrides: list[str], iterations: int, each: Any = None
) -> tuple[float, float, list[dict[str, Any]]]:
    """(greedy success on the five starts before, after, the iteration rows): a real run of
    2 rollout workers; `each(run)` is called after every iteration."""
    import ray

    from reflectrl.rl.driver import Run
    from tests.support.policy_copy import policy_copy

    config = load_config(REPO / "configs" / "smoke.yaml", [*FROM_REWARD, *overrides])
    greedy_success = handful_greedy_success(config)
    ray.init(address="local", num_cpus=3, include_dashboard=False, log_to_driver=False)
    run = Run(config, tmp_path / "run", workers=2)
    try:
        run.start()
        policy = policy_copy(run)
        before = greedy_success(policy)
        rows = []
        for _ in range(iterations):
            rows.append(run.train_iteration())
            if each is not None:
                each(run)
        policy.load_trainable_state(run.algo.policy_state())
        after = greedy_success(policy)
    finally:
        run.close()
        ray.shutdown()
    print("training success per iteration:", [round(r["success_rate"], 2) for r in rows])
    print("greedy success on the five starts, before/after:", before, after)
    return before, after, rows


def sampling_got_better(rows: list[dict[str, Any]]) -> bool:
    """The sampled policy's success in one of the last three iterations tops the first's."""
    return max(r["success_rate"] for r in rows[-3:]) > rows[0]["success_rate"] + 0.2


def test_ppo_from_reward_alone_learns_pickup_from_a_handful_of_starts(tmp_path: Path) -> None:
    """No SFT, no reflection, a random-init model: PPO from the env's reward alone takes the
    greedy policy from none of the five starts to at least 4 of 5, each start played once.
    Sampling overlaps learning here (`ppo.max_staleness=1`): each batch after the first is one
    update old when learned from, which the rows' own weights versions confirm."""
    from reflectrl.rl.rl_module import WEIGHTS_VERSION

    sampled_with, learner_versions = [], [0]

    def record(run: Any) -> None:
        sampled_with.append(list(run.algo.sampled_versions))
        learner_versions.append(int(run.algo.module_state()[WEIGHTS_VERSION]))

    before, after, rows = train_on_the_handful(
        tmp_path, ["ppo.max_staleness=1"], ITERATIONS, record
    )
    # The first batch is sampled before any update; batch k with the weights after update k-2.
    assert [r["staleness"] for r in rows] == [0] + [1] * (ITERATIONS - 1)
    assert sampled_with[0] == [0] and learner_versions[1] > 0
    assert sampled_with[1:] == [[v] for v in learner_versions[: ITERATIONS - 1]]
    assert before == 0.0
    assert after >= 0.8
    assert sampling_got_better(rows)
    # The advantages reach the loss centred on the loss rows; the critic's fit is logged.
    assert all(r["vf_explained_var"] is not None for r in rows)


def test_gigpo_without_a_critic_learns_pickup_from_a_handful_of_starts(tmp_path: Path) -> None:
    """The same task with GiGPO (whole episodes, the episode return against the batch plus a
    step advantage over the steps that saw the same prompt): no value head, no value loss."""
    overrides = ["rl.advantage=gigpo", "ppo.batch_mode=complete_episodes"]
    before, after, rows = train_on_the_handful(tmp_path, overrides, ITERATIONS)
    assert before == 0.0
    assert after >= 0.8
    assert sampling_got_better(rows)
    assert all(r["vf_loss"] is None and r["vf_explained_var"] is None for r in rows)
    assert all(r["advantage_raw_std"] > 0 for r in rows)
    assert any(r["advantage_anchor_steps"] > 0 for r in rows)  # starts repeat: prompts do


def test_ppo_with_the_text_action_head_learns_pickup_from_a_handful_of_starts(
    tmp_path: Path,
) -> None:
    """The same task with `policy.action_head=text`: each action scored by the log-probability
    of its own tokens, not by a label logit, through rollouts, GAE and the PPO update."""
    before, after, rows = train_on_the_handful(tmp_path, ["policy.action_head=text"], ITERATIONS)
    assert before <= 0.2
    assert after >= 0.8
    assert sampling_got_better(rows)


@pytest.mark.parametrize("head", ["label", "text"])
def test_sft_beats_the_untrained_policy_on_held_out_starts(
    head: str, tmp_path: Path, tiny_dir: Path, tokenizer: Any
) -> None:
    """Warm-up SFT alone (no reflection, the tiny model trained in full for ~1 minute) on expert
    `pickup` episodes from the train start states; greedy success on the 60 held-out ones.
    With the text action head, SFT trains the chosen action's own tokens and the policy scores
    each action by them."""
    from reflectrl.data.dataset import write_dataset
    from reflectrl.models.policy import OptionPolicy
    from reflectrl.rollout.vector_env import ReflectRLVectorEnv
    from reflectrl.sft.trainer import train_player

    overrides = [
        "reflection.enabled=false",
        "curriculum.stages=[{name: pickup}]",
        "sft.method=full",
        "sft.lr=0.001",
        "sft.batch_size=32",
        "sft.max_steps=200",
        "sft.eval_steps=1000",
        f"policy.action_head={head}",
    ]
    config = load_config(REPO / "configs" / "smoke.yaml", overrides)
    write_dataset(config, tmp_path / "data", episodes=120, seed=0, progress=False)
    result = train_player(config, tmp_path / "data", "policy", tmp_path / "sft", progress=False)
    held_out = load_config(REPO / "configs" / "smoke.yaml", [*overrides, "env.options.split=test"])

    def greedy_success(model_dir: Path) -> float:
        env = ReflectRLVectorEnv(held_out, tokenizer, None, num_envs=4)
        env.set_stage("pickup")
        policy = OptionPolicy(model_dir, env.label_ids, action_head=head)
        return evaluate(policy, env, episodes=40, greedy=True).success_rate

    before, after = greedy_success(tiny_dir), greedy_success(tmp_path / "sft" / "policy")
    print("SFT:", result["loss_before"], "->", result["loss_after"], "greedy", before, "->", after)
    assert result["loss_after"]["eval"] < 1.0 < result["loss_before"]["eval"]
    assert before <= 0.05 and after >= before + 0.2
