"""The RL stage of `reflectrl launch`: build RLlib's PPO and run its iterations.

    start (or join) Ray -> start the reflection server -> build PPO with our RLModule and
    vector env -> iterations (`Run.train_iteration`) -> save on every exit

One iteration, and the file of each step:
    1. sample          every rollout worker steps its vector env    rollout/vector_env.py
    2. advantages      GAE in the learner's connector               rl/rl_module.py (values)
    3. update          epochs x minibatches of the PPO loss         rl/learner.py
    4. weight sync     the new LoRA to every worker                 rl/ppo.py
    5. curriculum      every worker's episodes -> the next stage    rl/coordinator.py
    6. log/checkpoint  the typed row, held-out eval, checkpoint     here, rl/iteration_row.py
Steps 1-4 are `ReflectRLPPO.training_step`; RLlib's `Algorithm.train()` runs it, then step 5.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import ray

from reflectrl.atomic_files import write_json, write_text
from reflectrl.config import ReflectRLConfig, dump_config
from reflectrl.data.scratch import build_model
from reflectrl.envs.registry import make_text_env
from reflectrl.errors import LearnerDiedError, ReflectionServerError
from reflectrl.evaluation.held_out import PolicySource
from reflectrl.evaluation.report import BEFORE_RL_FILE, sft_observations
from reflectrl.evaluation.runner import Evaluator
from reflectrl.models.policy import lora_config, save_adapter_state
from reflectrl.preflight import check_run
from reflectrl.reflection.actor import ReflectionServers
from reflectrl.reflection.endpoint import ReflectionEndpoint
from reflectrl.rl.checkpoints import read_state, write_checkpoint
from reflectrl.rl.coordinator import CoordinatorCallback, coordinator_of
from reflectrl.rl.curriculum import Curriculum
from reflectrl.rl.failures import WorkerFailureError
from reflectrl.rl.iteration_row import HeldOutFigures, IterationRow, IterationRows, IterationTiming
from reflectrl.rl.metrics import MetricsSink, format_progress
from reflectrl.rl.monitor import IterationMonitor
from reflectrl.rl.ppo import ReflectRLPPO, build_ppo_config
from reflectrl.rl.success_replay import REPLAY_FILE
from reflectrl.run_dir import CONFIG_FILE
from reflectrl.trackers import open_trackers

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
        self.run_dir = run_dir
        self.workers = workers
        self.iteration = 0
        self.last_saved = -1
        self.rows = IterationRows()
        # The local reflection replicas: the pipeline's (shared with its eval stage), or our own.
        self.servers = servers if servers is not None else ReflectionServers(build_model)
        self.own_servers = servers is None
        self.reflection: ReflectionEndpoint | None = None
        self.algo: ReflectRLPPO | None = None
        self.monitor: IterationMonitor | None = None
        self.evaluator: Evaluator | None = None  # held-out eval every `eval.every` iterations
        self.sink: MetricsSink | None = None

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
        self.monitor = IterationMonitor(self.config, self.workers)
        self.algo = build_ppo_config(
            self.config,
            self.spec,
            self.workers,
            self.reflection,
            self.monitor.error_sink_name,
            self.monitor.progress_board_name,
        ).build_algo()
        stages = make_text_env(self.config.env.name, self.config.env.options).stages
        self.coordinator.curriculum = Curriculum(self.config.curriculum, stages)
        if resume_from is not None:
            self._restore(resume_from)
        # Every worker gets the stage; after a resume also its env random streams.
        self.coordinator.push_stage(self.algo.env_runner_group, with_random_state=True)
        self.sink = MetricsSink(
            self.run_dir,
            resume_from=self.iteration if resume_from is not None else None,
            tensorboard="tensorboard" in self.config.run.trackers,
            trackers=open_trackers(self.run_dir, self.config),  # the run's, or new ones
        )
        if self.config.eval.every:
            seen = sft_observations(self.run_dir)
            self.evaluator = Evaluator(self.config, self.reflection, self.workers, seen)

    @property
    def log_path(self) -> Path:
        return self.run_dir / "reflection_server.log"

    @property
    def coordinator(self) -> CoordinatorCallback:
        assert self.algo is not None
        return coordinator_of(self.algo.callbacks)

    @property
    def env_steps(self) -> int:
        return int(self.coordinator.totals["env_steps"])

    # -- one iteration -------------------------------------------------------------------
    def train_iteration(self) -> IterationRow:
        """sample -> advantages -> update -> weight sync -> curriculum -> log/checkpoint."""
        assert self.algo is not None and self.monitor is not None and self.sink is not None
        group = self.algo.env_runner_group
        if group.num_remote_env_runners() and not group.num_healthy_remote_env_runners():
            print("every rollout worker failed: waiting for Ray to restart one", flush=True)
        if not self.algo.wait_for_a_rollout_worker(self.config.run.sample_timeout_s):
            raise WorkerFailureError(
                f"no rollout worker came back within run.sample_timeout_s="
                f"{self.config.run.sample_timeout_s:g} s after every one failed; last error: "
                f"{self.monitor.failures.last_error or '(none reported)'}"
            )
        updates = self.algo.updates
        started = time.perf_counter()
        with self.monitor.iteration(self.iteration + 1):
            result = self._train()  # steps 1-5: rl/ppo.py, then rl/coordinator.py
        seconds = time.perf_counter() - started
        self.iteration += 1
        row, restarted = self.rows.build(
            self.iteration,
            result,
            IterationTiming(seconds, self.monitor.sampling_s(seconds)),
            updated=self.algo.updates > updates,
            staleness=self.algo.staleness,
            weight_sync_bytes=self.algo.weight_sync_bytes(),
            reflection_restarts=self.servers.restarts(),
            replay_episodes=len(replay.episodes) if (replay := self.algo.success_replay) else 0,
        )
        if restarted:  # workers crashed: was it the reflection server?
            self._check_reflection_alive()
        self.monitor.end_iteration(self.algo.env_runner_group.num_healthy_remote_workers())
        if self.evaluator is not None and self.iteration % self.config.eval.every == 0:
            row.update(self.evaluate_now())
        self.sink.write(row)
        if self.iteration % self.config.run.checkpoint_every == 0:
            self.save()
        return row

    def _train(self) -> dict:
        assert self.algo is not None
        try:
            return self.algo.train()
        except ray.exceptions.RayActorError as err:
            if self.config.run.num_learners == 0:  # no learner actors: not a learner's
                raise
            raise self._learner_died(err) from None

    def evaluate_now(self) -> HeldOutFigures:
        """Held-out success of the learner's current weights (the `eval_*` metrics)."""
        assert self.evaluator is not None and self.algo is not None
        report = self.evaluator.run(PolicySource(state=self.algo.policy_state()))
        greedy, sampled = report["greedy"]["all"], report["sampled"]["all"]
        return HeldOutFigures(
            eval_success_rate=greedy["success_rate"],
            eval_success_rate_sampled=sampled["success_rate"],
            eval_return_mean=greedy["return_mean"],
            eval_length_mean=greedy["length_mean"],
        )

    def evaluate_before_rl(self) -> None:
        """Held-out success of the policy RL starts from (the SFT policy), once per run:
        `eval_before_rl.json`, the first point of the held-out curve."""
        figures = self.evaluate_now()
        write_json(
            self.run_dir / BEFORE_RL_FILE,
            {"iteration": self.iteration, "env_steps": self.env_steps, **figures},
        )
        print(
            f"held-out success before RL: {figures['eval_success_rate']:.2f} greedy / "
            f"{figures['eval_success_rate_sampled']:.2f} sampled",
            flush=True,
        )

    # -- failures ------------------------------------------------------------------------
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
        from reflectrl.rollout.env_creator import make_reflection_client

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

    # -- checkpoints ---------------------------------------------------------------------
    def save(self) -> Path:
        assert self.algo is not None
        state = {
            "iteration": self.iteration,
            "env_steps": self.env_steps,
            "adapter_version": self.rows.adapter_version,
            # Each learner's process streams (NumPy's shuffles the minibatches).
            "learner_rng": self.algo.learner_streams(),
            # curriculum, run totals, each worker's env random streams
            **self.coordinator.state_dict(),
        }
        lora = self.config.policy.lora
        peft_config = lora_config(lora.r, lora.alpha, lora.target_modules, self.spec.model_dir)
        policy_state = self.algo.policy_state()
        path = write_checkpoint(
            self.run_dir,
            self.iteration,
            self.algo,
            lambda directory: save_adapter_state(policy_state, peft_config, directory),
            state,
            self._save_replay,
        )
        self.last_saved = self.iteration
        return path

    def _restore(self, checkpoint: Path) -> None:
        assert self.algo is not None
        self.algo.restore_from_path(str((checkpoint / "rllib").resolve()))  # not a URI
        self.algo.push_weights()  # RLlib's own sync after a restore may skip a busy worker
        state = read_state(checkpoint)
        self.iteration = int(state["iteration"])
        self.rows.adapter_version = int(state["adapter_version"])
        self.coordinator.load_state_dict(state)
        saved_streams = state.get("learner_rng", {})
        if len(saved_streams) == max(1, self.config.run.num_learners):  # same learners as before
            self.algo.restore_learner_streams(saved_streams)
        self.rows.restarts_seen = self.coordinator.restarted_workers
        replay = self.algo.success_replay
        if replay is not None and (checkpoint / REPLAY_FILE).is_file():
            replay.load(checkpoint / REPLAY_FILE)
        self.last_saved = self.iteration

    def _save_replay(self, checkpoint: Path) -> None:
        assert self.algo is not None
        if self.algo.success_replay is not None:
            self.algo.success_replay.save(checkpoint / REPLAY_FILE)

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
        if self.monitor is not None:
            self.monitor.close()
            self.monitor = None


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
