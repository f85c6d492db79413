"""The loop learns: on a small fixed-seed task, PPO clearly beats the untrained policy.

Task: DangerousTaxi `pickup` from one fixed start (seed 7: two moves, "go south" then
"pick up passenger"; every other first move ends the episode or wastes a step). The untrained
greedy policy fails it; after a few iterations the greedy policy solves it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from reflectrl.config import load_config
from reflectrl.evaluate import evaluate

REPO = Path(__file__).resolve().parents[1]
ITERATIONS = 12

pytestmark = pytest.mark.integration


def test_ppo_beats_the_untrained_policy(tmp_path: Path, tokenizer: Any) -> None:
    import ray

    from reflectrl.launch import Run
    from reflectrl.rollout_workers.vector_env import ReflectRLVectorEnv

    config = load_config(
        REPO / "configs" / "smoke.yaml",
        [
            "reflection.enabled=false",
            "env.options.fixed_start_seed=7",
            "env.options.max_steps=8",
            "curriculum.stages=[{name: pickup}]",
            "ppo.lr=0.003",
            "ppo.entropy_coeff=0.0",
            "ppo.num_epochs=4",
            "policy.lora.target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]",
        ],
    )
    eval_env = ReflectRLVectorEnv(config, tokenizer, None, num_envs=2)
    eval_env.set_stage("pickup")
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False)
    run = Run(config, tmp_path / "run", workers=2)
    try:
        run.start()
        policy = run.learner_module().policy
        before_greedy = evaluate(policy, eval_env, episodes=4, greedy=True)
        before_sampled = evaluate(policy, eval_env, episodes=40, greedy=False, seed=1)
        rows = [run.train_iteration() for _ in range(ITERATIONS)]
        after_greedy = evaluate(policy, eval_env, episodes=4, greedy=True)
        after_sampled = evaluate(policy, eval_env, episodes=40, greedy=False, seed=1)
    finally:
        run.close()
        ray.shutdown()
    returns = [r["episode_return_mean"] for r in rows]
    print("returns per iteration:", [round(x, 3) for x in returns])
    print("greedy before/after:", before_greedy, after_greedy)
    print("sampled before/after:", before_sampled, after_sampled)
    assert before_greedy.success_rate == 0.0
    assert after_greedy.success_rate == 1.0
    assert after_greedy.return_mean > before_greedy.return_mean + 1.0
    assert after_sampled.success_rate > before_sampled.success_rate + 0.3
    assert max(returns[-3:]) > returns[0] + 0.3
