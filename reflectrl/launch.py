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
import torch
from ray.rllib.core import DEFAULT_MODULE_ID

from reflectrl import rng_state
from reflectrl.algorithm import build_ppo_config
from reflectrl.atomic_files import write_json, write_text
from reflectrl.checkpoints import read_state, write_checkpoint
from reflectrl.config import ReflectRLConfig, dump_config
from reflectrl.coordinator import CoordinatorCallback, Curriculum
from reflectrl.envs.registry import make_text_env
from reflectrl.errors import LearnerDiedError, ReflectionServerError
from reflectrl.evaluation.report import BEFORE_RL_FILE, sft_observations
from reflectrl.evaluation.runner import Evaluator, PolicySource
from reflectrl.learner.rl_module import POLICY_PREFIX, state_nbytes
from reflectrl.metrics import MetricsSink, format_progress
from reflectrl.models.policy import lora_config, save_adapter_state
from reflectrl.preflight import check_run
from reflectrl.progress import Heartbeat, start_progress_board
from reflectrl.reflection.actor import ReflectionServers
from reflectrl.reflection.endpoint import ReflectionEndpoint
from reflectrl.rollout_workers.error_sink import start_error_sink
from reflectrl.run_dir import CONFIG_FILE
from reflectrl.worker_failures import WorkerFailureWatch

logger = logging.getLogger(__name__)


class Run:
    """One training run: the algorithm, its run directory and its progress."""

    def __init__(
        self,
        config: ReflectRLConfig,
        run_dir: Path,
        workers: int,
        servers: ReflectionServers | None = None,
    ) -> None:
        self.config = config
        self.spec = check_run(config, workers)
        self.last_saved = -1
        self.restarts_seen = 0
        self.adapter_version = 0
        self.run_dir = run_dir
        self.workers = workers
        self.iteration = 0
        # The local reflection replicas: the pipeline's (shared with its eval stage), or our own.
        self.servers = servers if servers is not None else ReflectionServers()
        self.own_servers = servers is None
        self.reflection: ReflectionEndpoint | None = None
        self.algo: Any = None
        self.evaluator: Evaluator | None = None  # held-out eval every `eval.every` iterations
        self.error_sink: Any = None
        self.progress_board: Any = None
        self.heartbeat: Heartbeat | None = None  # phase, env steps, minibatches within an iteration
        self.sink: MetricsSink | None = None
        self.failures = WorkerFailureWatch(config.run.max_failed_iterations)
        self._sync_bytes: int | None = None

    # -- set-up --------------------------------------------------------------------------
    def start(self, resume_from: Path | None = None) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if not (self.run_dir / CONFIG_FILE).exists():  # the pipeline writes the user's config
            write_text(self.run_dir / CONFIG_FILE, dump_config(self.config))
        r = self.config.reflection
        if r.enabled and r.server == "local":
            served = r.model + (f" + adapter {r.adapter}" if r.adapter else "")
            copies = f"{r.replicas} replicas" if r.replicas > 1 else "1 replica"
            print(f"starting the reflection server ({served}; {copies}); log: {self.log_path}")
            self.reflection = self.servers.start(r, self.log_path)
        elif r.enabled:
            self.reflection = ReflectionEndpoint.external(r)
        run_id = uuid.uuid4().hex[:12]
        sink_name, board_name = f"reflectrl-errors-{run_id}", f"reflectrl-progress-{run_id}"
        self.error_sink = start_error_sink(sink_name)
        self.progress_board = start_progress_board(board_name)
        self.heartbeat = Heartbeat(
            self.progress_board,
            self.config.run.iterations,
            self.config.ppo.batch_size(self.workers, self.config.env.envs_per_worker),
            every_s=self.config.run.heartbeat_s,
        )
        self.algo = build_ppo_config(
            self.config, self.spec, self.workers, self.reflection, sink_name, board_name
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
            seen = sft_observations(self.run_dir)
            self.evaluator = Evaluator(self.config, self.reflection, self.workers, seen)

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
        assert self.heartbeat is not None
        self.heartbeat.start(self.iteration + 1)
        with self.failures:
            try:
                result = self.algo.train()
            except ray.exceptions.RayActorError as err:
                if self.config.run.num_learners == 0:  # no learner actors: not a learner's
                    raise
                raise self._learner_died(err) from None
            finally:
                self.heartbeat.stop()
        seconds = time.perf_counter() - started
        board = ray.get(self.progress_board.snapshot.remote())
        sampling_s = seconds if board["sampling_s"] is None else min(board["sampling_s"], seconds)
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
            "earlier_stage_episodes": ours.get("earlier_stage_episodes", 0),
            "success_rate": ours.get("success_rate", 0.0),
            "episode_return_mean": ours.get("episode_return_mean"),
            "episode_len_mean": ours.get("episode_len_mean"),
            "stage": ours.get("stage"),
            "next_stage": ours.get("next_stage"),
            "reflection_calls": totals.get("reflection_calls", 0),
            "reflection_cache_hits": totals.get("reflection_cache_hits", 0),
            "env_steps_per_s": steps / seconds if seconds > 0 else 0.0,
            "iteration_s": seconds,
            # What binds: sampling (rollout workers, reflections) vs the update (learners).
            "sample_s": sampling_s,
            "update_s": seconds - sampling_s,
            "weight_sync_bytes": self.weight_sync_bytes(),
            "adapter_version": self.adapter_version,
            "updated": updated,
            # Policy updates between the weights that sampled this batch and the learner's.
            "staleness": getattr(self.algo, "staleness", 0),
            "restarted_workers": ours.get("restarted_workers", 0),
            "reflection_restarts": self.reflection_restarts(),
            # Worker-seconds of this iteration's sampling, by what they were spent on.
            **{
                key.replace("_ms", "_worker_s"): counts.get(key, 0) / 1000
                for key in ("env_ms", "reflection_ms", "policy_ms")
            },
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
        report = self.evaluator.run(PolicySource(state=self.policy_state()))
        greedy, sampled = report["greedy"]["all"], report["sampled"]["all"]
        return {
            "eval_success_rate": greedy["success_rate"],
            "eval_success_rate_sampled": sampled["success_rate"],
            "eval_return_mean": greedy["return_mean"],
            "eval_length_mean": greedy["length_mean"],
        }

    def evaluate_before_rl(self) -> dict[str, Any]:
        """Held-out success of the policy RL starts from (the SFT policy), once per run:
        `eval_before_rl.json`, the first point of the held-out curve."""
        figures = {"iteration": self.iteration, "env_steps": self.env_steps, **self.evaluate_now()}
        write_json(self.run_dir / BEFORE_RL_FILE, figures)
        print(
            f"held-out success before RL: {figures['eval_success_rate']:.2f} greedy / "
            f"{figures['eval_success_rate_sampled']:.2f} sampled",
            flush=True,
        )
        return figures

    def _learner_died(self, err: BaseException) -> LearnerDiedError:
        """RLlib does not restart learner actors (their DDP group cannot take a newcomer)."""
        cause = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
        saved = (
            f"checkpoint iter_{self.last_saved:06d} is the latest"
            if self.last_saved > 0
            else ("no checkpoint was written yet")
        )
        return LearnerDiedError(
            f"a learner actor died in iteration {self.iteration + 1} ({type(err).__name__}: "
            f"{cause}); RLlib does not restart learners, so the run stopped; {saved}; continue "
            f"with `reflectrl launch --resume {self.run_dir}`"
        )

    def _check_reflection_alive(self) -> None:
        """Workers crashed: if a reflection server is gone for good, stop with a clear error.
        (A local replica that died is restarted by Ray; this waits for it.)"""
        if self.reflection is None:
            return
        from reflectrl.rollout_workers.runner_env import make_reflection_client

        client = make_reflection_client(self.config, self.reflection)
        for replica in range(len(self.reflection.urls)):
            client.use_replica(replica)
            if client.locate is not None:
                client.base_url = client.locate(replica)  # waits for a restart, or raises
            if not client.health():
                raise ReflectionServerError(
                    f"the reflection server at {client.base_url} stopped answering and rollout "
                    f"workers failed; see {self.log_path} (local server) and restart with --resume"
                )

    def reflection_restarts(self) -> int:
        """How many times Ray restarted a reflection replica in this run."""
        return self.servers.restarts()

    @property
    def reflection_actors(self) -> list[Any]:
        return self.servers.actors

    def learner_rng_states(self) -> dict[str, Any]:
        """Every learner's process streams, by DDP rank (0 for a single learner)."""
        results = self.algo.learner_group.foreach_learner(lambda _: (_rank(), rng_state.capture()))
        return {str(rank): state for rank, state in (r.get() for r in results)}

    def restore_learner_rng_states(self, states: dict[str, Any]) -> None:
        self.algo.learner_group.foreach_learner(lambda _: rng_state.restore(states[str(_rank())]))

    def module_state(self) -> dict[str, Any]:
        """The learner's module state (LoRA + value head + weights version, numpy), read
        through the learner group's public API: the same call for a learner in the driver
        and for learner actors on other nodes (they hold equal weights under DDP)."""
        weights = self.algo.learner_group.get_weights(module_ids=[DEFAULT_MODULE_ID])
        return weights[DEFAULT_MODULE_ID]

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

    # -- checkpoints ---------------------------------------------------------------------
    def save(self) -> Path:
        state = {
            "iteration": self.iteration,
            "env_steps": self.env_steps,
            "adapter_version": self.adapter_version,
            # Each learner's process streams (NumPy's shuffles the minibatches).
            "learner_rng": self.learner_rng_states(),
            # curriculum, run totals, each worker's env random streams
            **self.coordinator.state_dict(),
        }
        lora = self.config.policy.lora
        peft_config = lora_config(lora.r, lora.alpha, lora.target_modules, self.spec.model_dir)
        policy_state = self.policy_state()
        path = write_checkpoint(
            self.run_dir,
            self.iteration,
            self.algo,
            lambda directory: save_adapter_state(policy_state, peft_config, directory),
            state,
        )
        self.last_saved = self.iteration
        return path

    def _restore(self, checkpoint: Path) -> None:
        self.algo.restore_from_path(str((checkpoint / "rllib").resolve()))  # not a URI
        self.algo.push_weights()  # RLlib's own sync after a restore may skip a busy worker
        state = read_state(checkpoint)
        self.iteration = int(state["iteration"])
        self.adapter_version = int(state["adapter_version"])
        self.coordinator.load_state_dict(state)
        saved_rng = state.get("learner_rng", {})
        if len(saved_rng) == max(1, self.config.run.num_learners):  # same learners as before
            self.restore_learner_rng_states(saved_rng)
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
        if self.own_servers:
            self.servers.stop()
        for actor in (self.error_sink, self.progress_board):
            if actor is not None:
                ray.kill(actor)
        self.error_sink = self.progress_board = None


def _rank() -> int:
    """This learner's DDP rank (0 without DDP)."""
    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


def _scalar(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def train(
    config: ReflectRLConfig,
    run_dir: Path,
    workers: int,
    resume_from: Path | None,
    servers: ReflectionServers | None = None,
) -> Run:
    """The RL stage on a running Ray: iterations until `run.iterations`, one progress line
    each; what was learned is saved on every exit, also on Ctrl-C or a failure."""
    run = Run(config, run_dir, workers, servers)
    failure: BaseException | None = None
    try:
        run.start(resume_from)
        print(f"run directory: {run_dir}", flush=True)
        if run.evaluator is not None and run.iteration == 0:
            run.evaluate_before_rl()
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
    # A dead learner holds the weights: nothing left to save (the last checkpoint stands).
    unsaved = run.algo is not None and run.iteration > 0 and run.last_saved != run.iteration
    try:
        if unsaved and not isinstance(failure, LearnerDiedError):
            print(f"saved {run.save()}", flush=True)
    finally:
        run.close()
    if failure is not None:
        raise failure
    return run
