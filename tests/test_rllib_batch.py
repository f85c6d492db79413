"""What RLlib does with a batch between the rollout worker and our loss, pinned (no Ray actors).

Real RLlib pieces in this process (`tests/support/in_process.py`): the EnvRunner samples our vector
env with our RLModule; the learner's connector pipeline builds the train batch. These tests
fail if RLlib changes the behaviour we rely on (docs/architecture.md, "What RLlib does with a
batch"), or if our faster update path stops computing what RLlib's own path computes.
"""

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

from reflectrl.config import load_config
from tests.helpers import perturb
from tests.support.in_process import SHORT_EPISODES, build_in_process

MID = DEFAULT_MODULE_ID
SMOKE = Path(__file__).resolve().parents[1] / "configs" / "smoke.yaml"
OVERRIDES = [*SHORT_EPISODES, "policy.lora.target_modules=[q_proj,k_proj,v_proj,o_proj]"]
# Today's launch path before the learner work: RLlib's stock learner, every row through the LM
# at full width, a separate value pass over all rows, gradient checkpointing.
REFERENCE = {
    "trim_padding": False,
    "values_from_rollouts": False,
    "gradient_checkpointing": True,
    "micro_batch_size": 16,
}


def sample_in_process(*overrides: str) -> tuple[Any, list[Any]]:
    config = load_config(SMOKE, [*OVERRIDES, "policy.micro_batch_size=5", *overrides])
    local = build_in_process(config)
    perturb(local.module)
    local.sync_weights()
    torch.manual_seed(0)
    episodes = local.sample()
    return local, episodes


@pytest.fixture(scope="module")
def sampled() -> tuple[Any, list[Any]]:
    return sample_in_process()


@pytest.fixture(scope="module")
def sampled_text_head() -> tuple[Any, list[Any]]:
    return sample_in_process("policy.action_head=text")


def test_batch_layout_nextstep_autoreset_and_bootstrap_rows(sampled: tuple) -> None:
    local, episodes = sampled
    batch = local.train_batch(episodes)[MID]
    loss = batch[Columns.LOSS_MASK].numpy()
    steps = sum(len(e) for e in episodes)
    # NEXT_STEP autoreset: the reset after a done is not a timestep; every env step is a row...
    assert steps >= local.config.ppo.rollout_fragment_length * 3
    assert loss.sum() == steps
    # ... and no row that carries loss is an episode's last observation (their action is
    # ignored by the env; the policy gives them placeholder logits).
    assert batch[Columns.OBS]["live"].numpy()[loss].min() == 1
    # One bootstrap row per episode chunk, LOSS_MASK false, holding the chunk's last obs.
    assert (~loss).sum() == len(episodes)
    ends = np.cumsum([len(e) + 1 for e in episodes]) - 1
    assert not loss[ends].any()
    for episode, end in zip(episodes, ends, strict=True):
        last_obs = episode.get_observations(-1)["input_ids"]
        assert np.array_equal(batch[Columns.OBS]["input_ids"][end].numpy(), last_obs)
        term = batch[Columns.TERMINATEDS].numpy()[end - 1]
        trunc = batch[Columns.TRUNCATEDS].numpy()[end - 1]
        # Terminated: no bootstrap. Env-truncated or cut by the fragment: bootstrapped.
        assert (term, trunc) == (episode.is_terminated, not episode.is_terminated)
    kinds = {(e.is_terminated, e.is_truncated) for e in episodes}
    assert kinds == {(True, False), (False, True), (False, False)}  # all three kinds of end


@pytest.mark.parametrize("samples", ["sampled", "sampled_text_head"])
def test_rollout_log_probs_equal_the_learner_log_probs(
    samples: str, request: pytest.FixtureRequest
) -> None:
    # PPO's ratio is exp(logp_learner - logp_rollout): 1 before any update, or the update is
    # biased (dropout, trimming, skipped rows and the placeholder must not change a thing).
    # With the text head too: its rollout scores come from batches of other widths and menus.
    local, episodes = request.getfixturevalue(samples)
    batch = local.train_batch(episodes)[MID]
    rows = torch.nonzero(batch[Columns.LOSS_MASK])[:, 0]
    obs = {k: v[rows] for k, v in batch[Columns.OBS].items()}
    module = local.module
    module.train()
    logits = module.forward_train({Columns.OBS: obs})[Columns.ACTION_DIST_INPUTS]
    logp = torch.distributions.Categorical(logits=logits).log_prob(batch[Columns.ACTIONS][rows])
    ratio = torch.exp(logp - batch[Columns.ACTION_LOGP][rows])
    torch.testing.assert_close(ratio, torch.ones_like(ratio), atol=1e-5, rtol=0)


def test_fast_update_path_equals_rllibs_own(sampled: tuple) -> None:
    """Same loss and LoRA/value-head gradients as RLlib's stock PPO learner over all rows at
    full width: trimming, skipped bootstrap rows, micro-batches of 5 sorted by length, and GAE
    values taken from the rollouts change nothing but the cost."""
    fast, episodes = sampled
    config = fast.config
    reference = build_in_process(config, learner_class=PPOTorchLearner, policy_overrides=REFERENCE)
    perturb(reference.module)
    batches = {
        name: env.train_batch(episodes) for name, env in (("fast", fast), ("ref", reference))
    }
    # GAE from rollout values equals GAE from a fresh value pass. (The advantages differ by
    # design: RLlib's stock learner standardises them over the bootstrap rows too;
    # tests/test_advantages.py.)
    loss = batches["ref"][MID][Columns.LOSS_MASK].bool()
    torch.testing.assert_close(
        batches["fast"][MID][Postprocessing.VALUE_TARGETS][loss],
        batches["ref"][MID][Postprocessing.VALUE_TARGETS][loss],
        atol=1e-4,
        rtol=1e-4,
    )
    batch = batches["ref"]
    fast_loss = fast.learner.accumulate_gradients(batch)[MID]
    ref = reference.learner
    ref_loss = ref.compute_losses(fwd_out=ref.module.forward_train(batch), batch=batch)[MID]
    ref.compute_gradients({MID: ref_loss})
    torch.testing.assert_close(fast_loss, ref_loss.detach(), atol=1e-6, rtol=1e-5)
    fast_grads = {n: p.grad for n, p in fast.module.named_parameters() if p.requires_grad}
    ref_grads = {n: p.grad for n, p in reference.module.named_parameters() if p.requires_grad}
    assert fast_grads.keys() == ref_grads.keys() and len(fast_grads) > 2
    for name, grad in fast_grads.items():
        assert grad is not None and grad.abs().sum() > 0, name
        torch.testing.assert_close(grad, ref_grads[name], atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize(("vf_clip_param", "frozen"), [(10.0, True), (None, False)])
def test_default_vf_clip_keeps_the_critic_learning(
    vf_clip_param: float | None, frozen: bool
) -> None:
    # RLlib clamps the squared value error at vf_clip_param: past it the value gradient is 0.
    # A value of 1.8 against a return of -1.5 (error 3.3) froze the critic at the old 10.
    overrides = [*OVERRIDES, "ppo.entropy_coeff=0"]
    if vf_clip_param is not None:
        overrides.append(f"ppo.vf_clip_param={vf_clip_param}")
    local = build_in_process(load_config(SMOKE, overrides))
    batch = local.train_batch(local.sample())
    torch.nn.init.constant_(local.module.policy.value_head.bias, 1.8)
    batch[MID][Postprocessing.VALUE_TARGETS] = torch.full_like(
        batch[MID][Postprocessing.VALUE_TARGETS], -1.5
    )
    batch[MID][Postprocessing.ADVANTAGES] = torch.zeros_like(batch[MID][Postprocessing.ADVANTAGES])
    local.learner.accumulate_gradients(batch)
    grad = local.module.policy.value_head.bias.grad
    assert (grad is None or float(grad.abs()) == 0.0) == frozen


def test_an_update_bumps_the_weights_version_and_stales_old_rollout_values(sampled: tuple) -> None:
    config = sampled[0].config
    local = build_in_process(config)
    episodes = local.sample()
    assert local.module.weights_version == 0
    local.update(episodes)
    minibatches = config.ppo.num_epochs * -(-sum(len(e) + 1 for e in episodes) // 32)
    assert local.module.weights_version >= config.ppo.num_epochs
    assert local.module.weights_version <= minibatches
    batch = local.train_batch(episodes)[MID]  # rows sampled before the update: all stale
    _, fresh = local.module._rollout_values(batch)
    assert not fresh.any()
    local.sync_weights()
    assert local.runner.module.weights_version == local.module.weights_version
    batch = local.train_batch(local.sample())[MID]
    _, fresh = local.module._rollout_values(batch)
    assert torch.equal(fresh, batch[Columns.LOSS_MASK].bool())  # now every sampled row is


def test_rllibs_ppo_step_is_the_one_ours_spells_out() -> None:
    """`ReflectRLPPO.training_step` (rl/ppo.py) is RLlib's PPO step with the weights pushed to
    every worker instead of `sync_weights`. If RLlib's step gains or drops a call, ours must be
    read against it again."""
    import ast
    import inspect
    import textwrap

    from ray.rllib.algorithms.ppo import PPO

    from reflectrl.rl.ppo import ReflectRLPPO

    def calls(function: Any) -> set[str]:
        tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
        return {
            node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
        }

    rllib = calls(PPO.training_step)
    assert rllib == {
        "_training_step_old_api_stack", "override", "log_time", "synchronous_parallel_sample",
        "aggregate", "update", "peek", "keys", "set", "sync_weights",
    }  # fmt: skip
    ours = calls(ReflectRLPPO.training_step) | calls(ReflectRLPPO._update)
    assert rllib - ours == {"_training_step_old_api_stack", "override", "keys", "sync_weights"}
    assert "push_weights" in ours


def test_full_rl_updates_and_syncs_every_lm_weight() -> None:
    """policy.rl_trainable=full: the PPO update moves the LM's own weights, and the weights a
    rollout worker receives make it score exactly as the learner."""
    config = load_config(SMOKE, [*OVERRIDES, "policy.rl_trainable=full"])
    local = build_in_process(config)
    name = next(k for k in local.module.policy.trainable_state() if "mlp.down_proj" in k)
    before = local.module.policy.state_dict()[name].clone()
    torch.manual_seed(0)
    episodes = local.sample()
    local.update(episodes)
    after = local.module.policy.state_dict()[name]
    assert not torch.equal(before, after)
    local.sync_weights()
    torch.testing.assert_close(local.runner.module.policy.state_dict()[name], after)
    obs = local.train_batch(episodes)[MID][Columns.OBS]
    rows = slice(0, 4)
    args = (obs["input_ids"][rows], obs["attention_mask"][rows], obs["option_mask"][rows])
    with torch.no_grad():
        torch.testing.assert_close(
            local.runner.module.policy(*args)[0], local.module.policy(*args)[0]
        )
