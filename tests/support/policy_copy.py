"""A copy of a run's learner policy in the driver process, to evaluate it there."""

from __future__ import annotations

from reflectrl.models.policy import OptionPolicy, build_policy
from reflectrl.rl.driver import Run


def policy_copy(run: Run) -> OptionPolicy:
    """The learner's current policy, built here; `policy.load_trainable_state(
    run.algo.policy_state())` brings it up to date later."""
    policy = build_policy(
        run.config.policy,
        run.spec.model_dir,
        run.spec.label_token_ids,
        run.config.run.seed,
        for_rollouts=False,
        critic=run.config.rl.critic,
    )
    policy.load_trainable_state(run.algo.policy_state())
    return policy
