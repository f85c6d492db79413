"""The RLlib PPO algorithm of a run, configured from our config: our RLModule and learner, the
vector env on every rollout worker, the coordinator callback, fault tolerance and seeding.

`ReflectRLPPO.training_step` is one iteration, step by step: sample -> advantages -> update ->
weight sync (the curriculum follows, in the coordinator's callback). It is RLlib's PPO step
(`ray.rllib.algorithms.ppo.PPO.training_step`, env steps counted) with the weights pushed to
every worker instead of RLlib's `sync_weights`, which can skip a busy worker.

`ppo.max_staleness=1` runs an iteration the other way: the workers sample the next batch while
the learner updates on the one just collected, so sampling and learning overlap and each batch
is learned from one update after the weights that sampled it.
"""

from __future__ import annotations

import time
from typing import Any

import ray
import torch
from ray.rllib.algorithms.ppo import PPO, PPOConfig
from ray.rllib.core import COMPONENT_LEARNER, COMPONENT_RL_MODULE, DEFAULT_MODULE_ID
from ray.rllib.core.rl_module.rl_module import RLModuleSpec
from ray.rllib.execution.rollout_ops import synchronous_parallel_sample
from ray.rllib.utils.metrics import (
    ALL_MODULES,
    ENV_RUNNER_RESULTS,
    ENV_RUNNER_SAMPLING_TIMER,
    LEARNER_RESULTS,
    LEARNER_UPDATE_TIMER,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    NUM_MODULE_STEPS_TRAINED_LIFETIME,
    SYNCH_WORKER_WEIGHTS_TIMER,
    TIMERS,
    WEIGHTS_SEQ_NO,
)
from ray.tune.registry import register_env

from reflectrl.config import ReflectRLConfig
from reflectrl.preflight import PolicySpec
from reflectrl.reflection.endpoint import ReflectionEndpoint
from reflectrl.rl.coordinator import CoordinatorCallback, coordinator_of
from reflectrl.rl.learner import ReflectRLPPOLearner, advantage_config
from reflectrl.rl.rl_module import (
    POLICY_PREFIX,
    WEIGHTS_VERSION,
    ReflectRLModule,
    module_config,
    state_nbytes,
)
from reflectrl.rl.success_replay import SuccessReplay
from reflectrl.rollout.env_creator import env_config_for, make_vector_env
from reflectrl.rollout.episode_runner import WholeEpisodeEnvRunner
from reflectrl.seeding import capture_streams, restore_streams

ENV_ID = "reflectrl_vector_env"
SAMPLE_TAG = "reflectrl_sample"


def _sample_with_stats(runner: Any) -> tuple[Any, Any, Any]:
    # The worker's own counts leave with its batch: asked for later, the call would queue on
    # the worker behind the next batch, which is already being sampled.
    return runner.sample(), runner.get_metrics(), runner.env.unwrapped.pop_stats()


class ReflectRLPPOConfig(PPOConfig):
    def __init__(self, algo_class: Any = None) -> None:
        super().__init__(algo_class=algo_class or ReflectRLPPO)
        self.max_staleness = 0  # ppo.max_staleness
        self.success_replay_episodes = 0  # rl.success_replay.episodes


class ReflectRLPPO(PPO):
    """RLlib's PPO, its iteration spelled out, with overlapped sampling as an option.

    Staleness 1: wait for the batch in flight -> send the weights of the last update and start
    the next batch (a worker runs its calls in order, so that batch uses those weights) ->
    update on the collected batch in the meantime. Its rows carry the log-probs and the weights
    version they were sampled with: the PPO ratio is against the sampling policy, and GAE
    recomputes the values of rows sampled with older weights (`ReflectRLModule`).
    """

    @classmethod
    def get_default_config(cls) -> ReflectRLPPOConfig:
        return ReflectRLPPOConfig()

    def setup(self, config: Any) -> None:
        super().setup(config)
        # Set by each overlapped iteration, read by the coordinator and the run: the collected
        # batch's worker stats (None: the coordinator pops them itself), the policy updates
        # between its weights and the learner's, the weights versions its rows were sampled with.
        self.sampled_stats: list[Any] | None = None
        self.staleness = 0
        self.sampled_versions: list[int] = []
        self._updates = 0  # policy updates so far (in this process)
        self._synced = 0  # updates the workers' weights include
        self._sampled_at = 0  # `_synced` when the batch in flight was started
        self._in_flight = 0  # workers sampling a batch
        self._modules_to_sync: set[str] = set()
        self._sync_bytes: int | None = None
        capacity = self.config.success_replay_episodes
        self.success_replay = SuccessReplay(capacity) if capacity else None

    def training_step(self) -> None:
        """One PPO iteration. `Algorithm.train()` runs it, then the coordinator's
        `on_train_result` (rl/coordinator.py): the curriculum step."""
        if self.config.max_staleness:
            return self._overlapped_step()
        # 1. sample: every rollout worker steps its vector env (text env -> reflection ->
        # prompt -> policy's pick) until the batch is full.
        with self.metrics.log_time((TIMERS, ENV_RUNNER_SAMPLING_TIMER)):
            episodes, worker_metrics = synchronous_parallel_sample(
                worker_set=self.env_runner_group,
                max_env_steps=self.config.total_train_batch_size,
                sample_timeout_s=self.config.sample_timeout_s,
                _uses_new_env_runners=True,
                _return_metrics=True,
            )
            if not episodes:  # every worker failed; RLlib restarts them before the next call
                return
            self.metrics.aggregate(worker_metrics, key=ENV_RUNNER_RESULTS)
        # 2. advantages (rl.advantage, in the learner's connector) and 3. the PPO update, with
        # success replay's episodes if it is on.
        modules = self._update(self._with_replay(episodes))
        # 4. weight sync: the new LoRA to every worker, which applies it before its next sample.
        # (Not RLlib's `sync_weights`: it drops a worker's sync while it still counts that
        # worker's previous one as in flight, one request per worker and tag looked up without
        # waiting. On a loaded machine the previous reply is often not in yet, and the worker
        # would sample with the weights of the update before; `tests/test_launch_e2e.py`.)
        with self.metrics.log_time((TIMERS, SYNCH_WORKER_WEIGHTS_TIMER)):
            self.push_weights(modules)
        self._updates += 1
        self._synced = self._updates

    @property
    def updates(self) -> int:
        """Policy updates so far in this process."""
        return self._updates

    def wait_for_a_rollout_worker(self, timeout_s: float) -> bool:
        """When every rollout worker has crashed, wait (up to `timeout_s`) until Ray has
        restarted one, and restore it as `Algorithm.train()` would: the learner's weights, then
        the `on_env_runners_recreated` callbacks (the coordinator pushes the stage and the
        worker's random state). Otherwise each iteration until then would sample nothing.
        False if none came back in time."""
        group = self.env_runner_group
        deadline = time.monotonic() + timeout_s
        while group.num_remote_env_runners() and not group.num_healthy_remote_env_runners():
            restored = self.restore_env_runners(group)
            if restored:
                self._make_on_env_runners_recreated_callbacks(
                    config=self.config,
                    env_runner_group=group,
                    restored_env_runner_indices=restored,
                )
            elif time.monotonic() > deadline:
                return False
            else:
                time.sleep(1.0)
        return True

    def _with_replay(self, episodes: list[Any]) -> list[Any]:
        """The sampled episodes, plus copies of success replay's (which first takes this
        batch's successes of the current stage)."""
        if self.success_replay is None:
            return episodes
        stage = coordinator_of(self.callbacks).curriculum
        self.success_replay.observe(episodes, stage.stage if stage is not None else "")
        return episodes + self.success_replay.for_update()

    def _update(self, episodes: list[Any]) -> set[str]:
        """GAE over the episodes (the learner connector, with the module's values and the
        bootstrap rows of cut episodes), then `num_epochs` x minibatches of the PPO loss
        (rl/learner.py). The modules updated."""
        with self.metrics.log_time((TIMERS, LEARNER_UPDATE_TIMER)):
            learner_results = self.learner_group.update(
                episodes=episodes,
                timesteps={
                    NUM_ENV_STEPS_SAMPLED_LIFETIME: self.metrics.peek(
                        (ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME)
                    ),
                    NUM_MODULE_STEPS_TRAINED_LIFETIME: self.metrics.peek(
                        (LEARNER_RESULTS, ALL_MODULES, NUM_MODULE_STEPS_TRAINED_LIFETIME),
                        default=0,
                    ),
                },
                num_epochs=self.config.num_epochs,
                minibatch_size=self.config.minibatch_size,
                shuffle_batch_per_epoch=self.config.shuffle_batch_per_epoch,
            )
            self.metrics.aggregate(learner_results, key=LEARNER_RESULTS)
        return set(learner_results[0]) - {ALL_MODULES}

    def _overlapped_step(self) -> None:
        """Staleness 1: wait for the batch in flight -> send the weights of the last update and
        start the next batch -> update on the collected one meanwhile."""
        group = self.env_runner_group
        with self.metrics.log_time((TIMERS, ENV_RUNNER_SAMPLING_TIMER)):
            if not self._in_flight:  # the first iteration (or every worker had failed)
                self._start_sampling()
            sampled_at = self._sampled_at
            ready = group.fetch_ready_async_reqs(
                tags=SAMPLE_TAG, timeout_seconds=self.config.sample_timeout_s
            )
            self._in_flight = 0
            if not ready:
                return
            self._send_weights()
            self._start_sampling()
        results = [result for _, result in ready]
        episodes = [episode for batch, _, _ in results for episode in batch]
        self.metrics.aggregate([metrics for _, metrics, _ in results], key=ENV_RUNNER_RESULTS)
        self.sampled_stats = [stats for _, _, stats in results]
        self.staleness = self._updates - sampled_at
        self.sampled_versions = _weights_versions(episodes)
        self._modules_to_sync = self._update(self._with_replay(episodes))
        self._updates += 1

    def _send_weights(self) -> None:
        if self._synced == self._updates:
            return
        with self.metrics.log_time((TIMERS, SYNCH_WORKER_WEIGHTS_TIMER)):
            self.push_weights(self._modules_to_sync)
        self._synced = self._updates

    def push_weights(self, modules: set[str] | None = None) -> None:
        """Send the learner's weights of `modules` (default: the policy) to every worker, fire
        and forget: each applies them before the next call it is sent. (RLlib's `sync_weights`
        skips a worker whose previous sync it has not yet seen answered, after an update and
        after a restore alike.)"""
        paths = [
            f"{COMPONENT_LEARNER}/{COMPONENT_RL_MODULE}/{m}" for m in modules or {DEFAULT_MODULE_ID}
        ]
        learner = self.learner_group.get_state(components=paths, inference_only=True)
        weights = {
            k: v
            for k, v in learner[COMPONENT_LEARNER].items()
            if k in (COMPONENT_RL_MODULE, WEIGHTS_SEQ_NO)
        }
        self.env_runner_group.foreach_env_runner(
            "set_state",
            kwargs={"state": ray.put(weights)},
            local_env_runner=False,
            timeout_seconds=0.0,
        )

    # -- what the learner holds ----------------------------------------------------------
    def module_state(self) -> dict[str, Any]:
        """The learner's module state (LoRA + value head + weights version, numpy), read
        through the learner group's public API: the same call for a learner in the driver
        and for learner actors on other nodes (they hold equal weights under DDP)."""
        return self.learner_group.get_weights(module_ids=[DEFAULT_MODULE_ID])[DEFAULT_MODULE_ID]

    def policy_state(self) -> dict[str, torch.Tensor]:
        """The learner's `OptionPolicy.trainable_state()`, as CPU tensors."""
        return {
            k.removeprefix(POLICY_PREFIX): torch.tensor(v)
            for k, v in self.module_state().items()
            if k.startswith(POLICY_PREFIX)
        }

    def weight_sync_bytes(self) -> int:
        """Bytes sent to each rollout worker per sync (the LoRA tensors only). Their shapes
        never change, so the learner is asked once, not every iteration."""
        if self._sync_bytes is None:
            self._sync_bytes = state_nbytes(self.module_state())
        return self._sync_bytes

    def learner_streams(self) -> dict[str, Any]:
        """Every learner's process random streams, by DDP rank (0 for a single learner)."""
        results = self.learner_group.foreach_learner(lambda _: (_rank(), capture_streams()))
        return {str(rank): state for rank, state in (r.get() for r in results)}

    def restore_learner_streams(self, streams: dict[str, Any]) -> None:
        self.learner_group.foreach_learner(lambda _: restore_streams(streams[str(_rank())]))

    def _start_sampling(self) -> None:
        self._in_flight = self.env_runner_group.foreach_env_runner_async(
            _sample_with_stats, tag=SAMPLE_TAG
        )
        self._sampled_at = self._synced


def _rank() -> int:
    """This learner's DDP rank (0 without DDP)."""
    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


def _weights_versions(episodes: list[Any]) -> list[int]:
    """The distinct weights versions (optimizer steps) the episodes' rows were sampled with."""
    versions: set[int] = set()
    for episode in episodes:
        if WEIGHTS_VERSION in episode.extra_model_outputs:
            versions.update(int(v) for v in episode.get_extra_model_outputs(WEIGHTS_VERSION))
    return sorted(versions)


def build_ppo_config(
    config: ReflectRLConfig,
    spec: PolicySpec,
    workers: int,
    reflection: ReflectionEndpoint | None,
    error_sink: str | None = None,
    progress_board: str | None = None,
) -> ReflectRLPPOConfig:
    ppo, run = config.ppo, config.run
    train_batch = ppo.batch_size(workers, config.env.envs_per_worker)
    per_learner = train_batch // max(1, run.num_learners)  # check_run: it divides
    # RLlib takes a registered name; the name lives in Ray's KV store, so workers find it.
    register_env(ENV_ID, make_vector_env)
    algo_config = ReflectRLPPOConfig()
    algo_config.max_staleness = ppo.max_staleness
    algo_config.success_replay_episodes = config.rl.success_replay.episodes
    return (
        algo_config.environment(
            env=ENV_ID,
            env_config=env_config_for(config, reflection, error_sink, progress_board),
        )
        .env_runners(
            num_env_runners=workers,
            num_envs_per_env_runner=config.env.envs_per_worker,
            gym_env_vectorize_mode="vector_entry_point",
            # Whole episodes without favouring short ones (complete_episodes).
            env_runner_cls=WholeEpisodeEnvRunner,
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
            learner_config_dict={
                "advantage": advantage_config(config.rl),
                "replay_weight": config.rl.success_replay.weight,
            },
        )
        .training(
            lr=ppo.lr,
            gamma=ppo.gamma,
            lambda_=ppo.lambda_,
            clip_param=ppo.clip_param,
            vf_clip_param=ppo.vf_clip_param,
            use_critic=config.rl.critic,
            vf_loss_coeff=ppo.vf_loss_coeff if config.rl.critic else 0.0,
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
                model_config=module_config(config, spec.model_dir, spec.label_token_ids),
            )
        )
        .callbacks(CoordinatorCallback)
        .fault_tolerance(
            restart_failed_env_runners=config.run.restart_failed_workers,
            delay_between_env_runner_restarts_s=config.run.worker_restart_delay_s,
        )
        .debugging(seed=config.run.seed, log_level="WARN")
    )
