"""The RLlib PPO algorithm of a run, configured from our config: our RLModule and learner, the
vector env on every rollout worker, the coordinator callback, fault tolerance and seeding."""

from __future__ import annotations

from pathlib import Path

from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.core.rl_module.rl_module import RLModuleSpec
from ray.tune.registry import register_env

from reflectrl.config import ReflectRLConfig
from reflectrl.coordinator import CoordinatorCallback
from reflectrl.learner.ppo_learner import ReflectRLPPOLearner
from reflectrl.learner.rl_module import ReflectRLModule
from reflectrl.node_files import pack_dir
from reflectrl.preflight import PolicySpec
from reflectrl.reflection.endpoint import ReflectionEndpoint
from reflectrl.rollout_workers.runner_env import env_config_for, make_vector_env

ENV_ID = "reflectrl_vector_env"


def build_ppo_config(
    config: ReflectRLConfig,
    spec: PolicySpec,
    workers: int,
    reflection: ReflectionEndpoint | None,
    error_sink: str | None = None,
    progress_board: str | None = None,
) -> PPOConfig:
    ppo, policy, run = config.ppo, config.policy, config.run
    lora = policy.lora
    train_batch = ppo.batch_size(workers, config.env.envs_per_worker)
    per_learner = train_batch // max(1, run.num_learners)  # check_run: it divides
    # RLlib takes a registered name; the name lives in Ray's KV store, so workers find it.
    register_env(ENV_ID, make_vector_env)
    return (
        PPOConfig()
        .environment(
            env=ENV_ID,
            env_config=env_config_for(config, reflection, error_sink, progress_board),
        )
        .env_runners(
            num_env_runners=workers,
            num_envs_per_env_runner=config.env.envs_per_worker,
            gym_env_vectorize_mode="vector_entry_point",
            # The driver holds the learner's copy of the LM; no second one for sampling.
            create_local_env_runner=False,
            # Explicit: "auto" is batch / (workers x envs), 1-2 steps per env with many workers,
            # so almost every chunk would be cut and bootstrapped from the critic.
            rollout_fragment_length=ppo.rollout_fragment_length,
            batch_mode=ppo.batch_mode,
            sample_timeout_s=config.run.sample_timeout_s,
            num_cpus_per_env_runner=1,
            num_gpus_per_env_runner=run.num_gpus_per_worker,
            custom_resources_per_env_runner=dict(run.worker_resources),
        )
        .learners(
            num_learners=run.num_learners,
            num_gpus_per_learner=run.num_gpus_per_learner,
            custom_resources_per_learner=dict(run.learner_resources),
            learner_class=ReflectRLPPOLearner,
        )
        .training(
            lr=ppo.lr,
            gamma=ppo.gamma,
            lambda_=ppo.lambda_,
            clip_param=ppo.clip_param,
            vf_clip_param=ppo.vf_clip_param,
            vf_loss_coeff=ppo.vf_loss_coeff,
            entropy_coeff=ppo.entropy_coeff,
            use_kl_loss=ppo.kl_coeff > 0,
            kl_coeff=ppo.kl_coeff,
            num_epochs=ppo.num_epochs,
            minibatch_size=ppo.minibatch_size,
            train_batch_size_per_learner=per_learner,
            grad_clip=ppo.grad_clip,
        )
        .rl_module(
            rl_module_spec=RLModuleSpec(
                module_class=ReflectRLModule,
                model_config={
                    "model_dir": str(spec.model_dir),
                    "label_token_ids": spec.label_token_ids,
                    "lora_r": lora.r,
                    "lora_alpha": lora.alpha,
                    "lora_target_modules": list(lora.target_modules),
                    "seed": config.run.seed,
                    "micro_batch_size": policy.micro_batch_size,
                    "trim_padding": policy.trim_padding,
                    "share_prefix": policy.share_prefix,
                    "values_from_rollouts": policy.values_from_rollouts,
                    "gradient_checkpointing": policy.gradient_checkpointing,
                    "init_adapter": policy.init_adapter,
                    # Its files travel with the module: learners and workers on other nodes.
                    "init_adapter_files": pack_dir(Path(policy.init_adapter))
                    if policy.init_adapter
                    else None,
                    "rollout_dtype": policy.dtype,
                },
            )
        )
        .callbacks(CoordinatorCallback)
        .fault_tolerance(
            restart_failed_env_runners=config.run.restart_failed_workers,
            delay_between_env_runner_restarts_s=config.run.worker_restart_delay_s,
        )
        .debugging(seed=config.run.seed, log_level="WARN")
    )
