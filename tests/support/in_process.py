"""RLlib's rollout worker (EnvRunner) and PPO learner in this process, without Ray actors.

The same pieces a run builds (`rl.ppo.build_ppo_config`), for tests, benchmarks and debugging:
`sample` returns episodes exactly as a rollout worker sends them, `train_batch` runs the
learner's connector pipeline on them (bootstrap rows, LOSS_MASK, GAE) and `update` is one PPO
iteration's update (epochs x minibatches), as `PPO.training_step` calls it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME

from reflectrl.config import ReflectRLConfig
from reflectrl.preflight import preflight
from reflectrl.reflection.endpoint import ReflectionEndpoint
from reflectrl.rl.ppo import build_ppo_config
from reflectrl.rollout.episode_runner import WholeEpisodeEnvRunner

# Short Taxi episodes without reflections, so that one round of 3 envs x 12 steps holds
# terminated, env-truncated and cut chunks.
SHORT_EPISODES = [
    "reflection.enabled=false",
    "env.options.max_steps=6",
    "env.options.split=all",
    "env.envs_per_worker=3",
    "ppo.rollout_fragment_length=12",
]


@dataclass
class InProcess:
    config: ReflectRLConfig
    runner: WholeEpisodeEnvRunner
    learner: Any
    ppo_config: Any

    @property
    def module(self) -> Any:
        """The learner's RLModule (a ReflectRLModule)."""
        return self.learner.module[DEFAULT_MODULE_ID]

    def sync_weights(self) -> None:
        """Learner -> rollout worker, as RLlib does after every update."""
        self.runner.module.set_state(self.module.get_state(inference_only=True))

    def sample(self, env_steps: int | None = None) -> list[Any]:
        """Episodes (chunks) of at least `env_steps` env steps (default: one round)."""
        steps = env_steps or self.config.ppo.rollout_fragment_length * self.runner.num_envs
        if self.config.ppo.batch_mode == "truncate_episodes":
            return self.runner.sample(num_timesteps=steps, explore=True)
        # Whole episodes, as `synchronous_parallel_sample` collects them: a runner's call
        # returns the episodes that began within its cut (rollout/episode_runner.py); calls
        # repeat until the batch has `steps` env steps.
        episodes: list[Any] = []
        while sum(len(e) for e in episodes) < steps:
            episodes += self.runner.sample(explore=True)
        return episodes

    def train_batch(self, episodes: list[Any]) -> dict[str, Any]:
        """The learner's batch for `episodes`: {module id: {column: tensor}}, GAE included."""
        return self.learner._learner_connector(  # the pipeline Learner.update runs first
            rl_module=self.learner.module,
            batch={},
            episodes=copy.deepcopy(episodes),  # the pipeline adds a step to each
            shared_data={},
            metrics=self.learner.metrics,
        )

    def update(self, episodes: list[Any]) -> dict[str, Any]:
        return ppo_update(self.learner, self.ppo_config, episodes)


def ppo_update(learner: Any, ppo_config: Any, episodes: list[Any]) -> dict[str, Any]:
    """One iteration's PPO update on `episodes`, with the run's epochs and minibatches."""
    return learner.update(
        episodes=copy.deepcopy(episodes),  # the connector pipeline adds a step to each
        timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: sum(len(e) for e in episodes)},
        num_epochs=ppo_config.num_epochs,
        minibatch_size=ppo_config.minibatch_size,
        shuffle_batch_per_epoch=ppo_config.shuffle_batch_per_epoch,
    )


def in_process_ppo_config(
    config: ReflectRLConfig,
    *,
    reflection: ReflectionEndpoint | None = None,
    learner_class: type | None = None,
    policy_overrides: dict[str, Any] | None = None,
) -> Any:
    """The run's PPOConfig for one rollout worker. `learner_class` and `policy_overrides`
    (`policy` settings of the config) build other variants, e.g. RLlib's stock PPO learner."""
    if policy_overrides:
        policy = config.policy.model_validate({**config.policy.model_dump(), **policy_overrides})
        config = config.model_copy(update={"policy": policy})
    ppo_config = build_ppo_config(config, preflight(config), 1, reflection)
    if learner_class is not None:
        ppo_config = ppo_config.learners(learner_class=learner_class)
    return ppo_config


def build_learner(ppo_config: Any, env: Any) -> Any:
    """The PPO learner (built) for a vector env's spaces."""
    spaces = {DEFAULT_MODULE_ID: (env.single_observation_space, env.single_action_space)}
    return ppo_config.build_learner(spaces=spaces)


def build_in_process(
    config: ReflectRLConfig,
    *,
    reflection: ReflectionEndpoint | None = None,
    learner_class: type | None = None,
    policy_overrides: dict[str, Any] | None = None,
) -> InProcess:
    """One rollout worker (index 1, `env.envs_per_worker` envs) and one learner whose module
    starts from the same weights."""
    ppo_config = in_process_ppo_config(
        config,
        reflection=reflection,
        learner_class=learner_class,
        policy_overrides=policy_overrides,
    )
    runner = WholeEpisodeEnvRunner(config=ppo_config, worker_index=1)
    learner = build_learner(ppo_config, runner.env)
    result = InProcess(config=config, runner=runner, learner=learner, ppo_config=ppo_config)
    result.sync_weights()
    return result
