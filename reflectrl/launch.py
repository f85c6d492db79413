"""The RL stage of `reflectrl launch`: build the RLlib PPO algorithm and run the iterations.

Reads like the method: start (or join) Ray -> start the reflection server -> build PPO with
our RLModule and vector env -> each iteration: sample on all rollout workers, update the
policy's LoRA, sync it, let the coordinator move the curriculum -> log and checkpoint.
"""

from __future__ import annotations

import logging
import time
import uuid
from pathlib import Path
from typing import Any

import ray
from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.core.rl_module.rl_module import RLModuleSpec
from ray.tune.registry import register_env

from reflectrl.checkpoints import read_state, write_checkpoint
from reflectrl.config import ReflectRLConfig, dump_config
from reflectrl.coordinator import CoordinatorCallback, Curriculum
from reflectrl.envs.registry import make_text_env
from reflectrl.errors import ReflectionServerError
from reflectrl.evaluation.runner import Evaluator, PolicySource
from reflectrl.learner.ppo_learner import ReflectRLPPOLearner
from reflectrl.learner.rl_module import ReflectRLModule, state_nbytes
from reflectrl.metrics import MetricsSink, format_progress
from reflectrl.preflight import PolicySpec, check_run
from reflectrl.rollout_workers.error_sink import start_error_sink
from reflectrl.rollout_workers.runner_env import env_config_for, make_vector_env
from reflectrl.worker_failures import WorkerFailureWatch

logger = logging.getLogger(__name__)

ENV_ID = "reflectrl_vector_env"


def build_ppo_config(
    config: ReflectRLConfig,
    spec: PolicySpec,
    workers: int,
    reflection_url: str | None,
    error_sink: str | None = None,
) -> PPOConfig:
    ppo, policy = config.ppo, config.policy
    lora = policy.lora
    train_batch = ppo.batch_size(workers, config.env.envs_per_worker)
    # RLlib takes a registered name; the name lives in Ray's KV store, so workers find it.
    register_env(ENV_ID, make_vector_env)
    return (
        PPOConfig()
        .environment(env=ENV_ID, env_config=env_config_for(config, reflection_url, error_sink))
        .env_runners(
            num_env_runners=workers,
            num_envs_per_env_runner=config.env.envs_per_worker,
            gym_env_vectorize_mode="vector_entry_point",
            # The driver holds the learner's copy of the LM; no second one for sampling.
            create_local_env_runner=False,
            # Explicit: "auto" is batch / (workers x envs), 1-2 steps per env with many workers,
            # so almost every chunk would be cut and bootstrapped from the critic.
            rollout_fragment_length=ppo.rollout_fragment_length,
            sample_timeout_s=config.run.sample_timeout_s,
            num_cpus_per_env_runner=1,
        )
        .learners(
            num_learners=0,
            num_gpus_per_learner=config.run.num_gpus_per_learner,
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
            train_batch_size_per_learner=train_batch,
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
                    "values_from_rollouts": policy.values_from_rollouts,
                    "gradient_checkpointing": policy.gradient_checkpointing,
                    "init_adapter": policy.init_adapter,
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


class Run:
    """One training run: the algorithm, its run directory and its progress."""

    def __init__(self, config: ReflectRLConfig, run_dir: Path, workers: int) -> None:
        self.config = config
        self.spec = check_run(config, workers)
        self.last_saved = -1
        self.restarts_seen = 0
        self.adapter_version = 0
        self.run_dir = run_dir
        self.workers = workers
        self.iteration = 0
        self.reflection_actor: Any = None
        self.reflection_url: str | None = None
        self.algo: Any = None
        self.evaluator: Evaluator | None = None  # held-out eval every `eval.every` iterations
        self.error_sink: Any = None
        self.sink: MetricsSink | None = None
        self.failures = WorkerFailureWatch(config.run.max_failed_iterations)

    # -- set-up --------------------------------------------------------------------------
    def start(self, resume_from: Path | None = None) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if not (self.run_dir / "config.yaml").exists():  # the pipeline writes the user's config
            (self.run_dir / "config.yaml").write_text(dump_config(self.config))
        r = self.config.reflection
        if r.enabled and r.server == "local":
            from reflectrl.reflection.actor import start_reflection_actor

            served = r.model + (f" + adapter {r.adapter}" if r.adapter else "")
            print(f"starting the reflection server ({served}); log: {self.log_path}", flush=True)
            self.reflection_actor, self.reflection_url = start_reflection_actor(r, self.log_path)
        elif r.enabled:
            self.reflection_url = r.url
        sink_name = f"reflectrl-errors-{uuid.uuid4().hex[:12]}"
        self.error_sink = start_error_sink(sink_name)
        self.algo = build_ppo_config(
            self.config, self.spec, self.workers, self.reflection_url, sink_name
        ).build_algo()
        callback = self.coordinator
        stages = make_text_env(self.config.env.name, self.config.env.options).stages
        callback.curriculum = Curriculum(self.config.curriculum, stages)
        if resume_from is not None:
            self._restore(resume_from)
        # Every worker gets the stage; after a resume also its env random streams.
        callback.push_stage(self.algo.env_runner_group, with_random_state=True)
        self.sink = MetricsSink(
            self.run_dir, resume_from=self.iteration if resume_from is not None else None
        )
        if self.config.eval.every:
            self.evaluator = Evaluator(self.config, self.reflection_url, self.workers)

    @property
    def log_path(self) -> Path:
        return self.run_dir / "reflection_server.log"

    @property
    def coordinator(self) -> CoordinatorCallback:
        callbacks = self.algo.callbacks
        for cb in callbacks if isinstance(callbacks, list) else [callbacks]:
            if isinstance(cb, CoordinatorCallback):
                return cb
        raise RuntimeError("the coordinator callback is missing from the algorithm")

    # -- the loop ------------------------------------------------------------------------
    @property
    def env_steps(self) -> int:
        return int(self.coordinator.totals["env_steps"])

    def train_iteration(self) -> dict[str, Any]:
        started = time.perf_counter()
        with self.failures:
            result = self.algo.train()
        seconds = time.perf_counter() - started
        self.iteration += 1
        ours = result.get("reflectrl", {})
        restarted = int(ours.get("restarted_workers", 0)) - self.restarts_seen
        self.restarts_seen += restarted
        if restarted:
            self._check_reflection_alive()
        group = self.algo.env_runner_group
        reports = ray.get(self.error_sink.pop.remote())
        self.failures.end_iteration(group.num_healthy_remote_workers(), self.workers, reports)
        counts, totals = ours.get("iteration_counts", {}), ours.get("totals", {})
        steps = int(counts.get("env_steps", 0))
        learner = result.get("learners", {}).get(DEFAULT_MODULE_ID, {})
        updated = _scalar(learner.get("policy_loss")) is not None
        self.adapter_version += int(updated)  # what the workers sample with from now on
        row = {
            "iteration": self.iteration,
            "env_steps": self.env_steps,
            "episodes": ours.get("episodes", 0),
            "success_rate": ours.get("success_rate", 0.0),
            "episode_return_mean": ours.get("episode_return_mean"),
            "episode_len_mean": ours.get("episode_len_mean"),
            "stage": ours.get("stage"),
            "next_stage": ours.get("next_stage"),
            "reflection_calls": totals.get("reflection_calls", 0),
            "env_steps_per_s": steps / seconds if seconds > 0 else 0.0,
            "iteration_s": seconds,
            "weight_sync_bytes": self.weight_sync_bytes(),
            "adapter_version": self.adapter_version,
            "updated": updated,
            "restarted_workers": ours.get("restarted_workers", 0),
            "truncated_prompts": totals.get("truncated_prompts", 0),
            "clipped_reflection_prompts": totals.get("clipped_reflection_prompts", 0),
            "policy_loss": _scalar(learner.get("policy_loss")),
            "vf_loss": _scalar(learner.get("vf_loss")),
            "entropy": _scalar(learner.get("entropy")),
        }
        if self.evaluator is not None and self.iteration % self.config.eval.every == 0:
            row.update(self.evaluate_now())
        assert self.sink is not None
        self.sink.write(row)
        if self.iteration % self.config.run.checkpoint_every == 0:
            self.save()
        return row

    def evaluate_now(self) -> dict[str, Any]:
        """Held-out success of the learner's current weights (the `eval_*` metrics)."""
        assert self.evaluator is not None
        state = {
            k: v.detach().cpu() for k, v in self.learner_module().policy.trainable_state().items()
        }
        report = self.evaluator.run(PolicySource(state=state))
        greedy, sampled = report["greedy"]["all"], report["sampled"]["all"]
        return {
            "eval_success_rate": greedy["success_rate"],
            "eval_success_rate_sampled": sampled["success_rate"],
            "eval_return_mean": greedy["return_mean"],
            "eval_length_mean": greedy["length_mean"],
        }

    def _check_reflection_alive(self) -> None:
        """Workers crashed: if the reflection server is gone, stop with a clear error."""
        if not (self.config.reflection.enabled and self.reflection_url):
            return
        from reflectrl.rollout_workers.runner_env import make_reflection_client

        if not make_reflection_client(self.config, self.reflection_url, 0).health():
            raise ReflectionServerError(
                f"the reflection server at {self.reflection_url} stopped answering and rollout "
                f"workers failed; see {self.log_path} (local server) and restart with --resume"
            )

    def weight_sync_bytes(self) -> int:
        """Bytes sent to each rollout worker per sync (the LoRA tensors only)."""
        return state_nbytes(self.learner_module().get_state(inference_only=True))

    def learner_module(self) -> ReflectRLModule:
        return self.algo.learner_group._learner.module[DEFAULT_MODULE_ID]

    # -- checkpoints ---------------------------------------------------------------------
    def save(self) -> Path:
        state = {
            "iteration": self.iteration,
            "env_steps": self.env_steps,
            "adapter_version": self.adapter_version,
            # curriculum, run totals, each worker's env random streams
            **self.coordinator.state_dict(),
        }
        policy = self.learner_module().policy
        path = write_checkpoint(self.run_dir, self.iteration, self.algo, policy, state)
        self.last_saved = self.iteration
        return path

    def _restore(self, checkpoint: Path) -> None:
        self.algo.restore_from_path(str((checkpoint / "rllib").resolve()))  # not a URI
        state = read_state(checkpoint)
        self.iteration = int(state["iteration"])
        self.adapter_version = int(state["adapter_version"])
        self.coordinator.load_state_dict(state)
        self.restarts_seen = self.coordinator.restarted_workers
        self.last_saved = self.iteration

    def close(self) -> None:
        """Release everything; never raises over the error that may be stopping the run."""
        if self.sink is not None:
            self.sink.close()
        if self.evaluator is not None:
            self.evaluator.close()
            self.evaluator = None
        if self.algo is not None:
            self.algo.stop()
        if self.reflection_actor is not None:
            try:
                ray.get(self.reflection_actor.stop.remote(), timeout=60)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as err:
                logger.warning("reflection server actor was already gone: %s", type(err).__name__)
            ray.kill(self.reflection_actor)
            self.reflection_actor = None
        if self.error_sink is not None:
            ray.kill(self.error_sink)
            self.error_sink = None


def _scalar(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def train(config: ReflectRLConfig, run_dir: Path, workers: int, resume_from: Path | None) -> Run:
    """The RL stage on a running Ray: iterations until `run.iterations`, one progress line
    each; what was learned is saved on every exit, also on Ctrl-C or a failure."""
    run = Run(config, run_dir, workers)
    failure: BaseException | None = None
    try:
        run.start(resume_from)
        print(f"run directory: {run_dir}", flush=True)
        first, started = run.iteration, time.perf_counter()
        while run.iteration < config.run.iterations:
            row = run.train_iteration()
            per_iteration = (time.perf_counter() - started) / (run.iteration - first)
            eta = per_iteration * (config.run.iterations - run.iteration)
            print(format_progress(row, config.run.iterations, eta), flush=True)
    except BaseException as err:  # re-raised below, once everything is saved and closed
        failure = err
    # Outside the except block on purpose: Ray and RLlib log with exc_info while shutting down,
    # which would print the failure's traceback above its one-line message.
    try:
        if run.algo is not None and run.iteration > 0 and run.last_saved != run.iteration:
            print(f"saved {run.save()}", flush=True)
    finally:
        run.close()
    if failure is not None:
        raise failure
    return run
