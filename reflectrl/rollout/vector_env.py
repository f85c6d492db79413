"""The env a rollout worker (RLlib EnvRunner) steps: several text envs behind one vector env.

Per step it steps every text env, asks the reflection server for all of their reflections in
ONE batched request, renders the policy prompts and tokenizes them into the fixed-shape
observation RLlib needs (a gymnasium `Text` space crashes inside the EnvRunner):
    input_ids      int64 [max_prompt_tokens]  right-padded prompt
    attention_mask int64 [max_prompt_tokens]
    option_mask    float32 [K]                1 for labels on the menu now
    live           int64 [1]                  0 for the last observation of an episode
and with the text action head (policy.action_head=text), each menu slot's own text:
    action_ids     int64 [K, action_max_tokens]  " <action>" + EOS, right-padded
    action_mask    int64 [K, action_max_tokens]
    action_words   float32 [K]                   words in the action (word normalisation)
The action is a label index; it maps to the env's action through the (maybe shuffled) menu.

Autoreset follows gymnasium's NEXT_STEP mode, which RLlib's EnvRunner expects: the step after
an episode ends resets that env and ignores its action. So the action RLlib computes for an
episode's last observation is thrown away: `live` = 0 tells the policy not to run the LM there.

Prompts are rendered and fitted to their budgets by `reflectrl.text.rendering.PromptRenderer` (the
SFT data writer uses the same one); cut prompts are counted: `truncated_prompts`,
`clipped_reflection_prompts`.

With `env.prefetch_resets`, that reset starts on a background thread as soon as the ended
episode's last prompt is rendered (`reset_prefetch.py`), and the step after takes its result.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from reflectrl.config import ReflectRLConfig
from reflectrl.envs.base import TextEnv, TextObservation
from reflectrl.envs.registry import make_text_env
from reflectrl.rollout.group_starts import GroupStarts
from reflectrl.rollout.reset_prefetch import ResetPrefetcher
from reflectrl.rollout.seams import (
    EpisodeRecord,
    Reflector,
    StepView,
    WorkerStats,
    zero_counts,
)
from reflectrl.seeding import capture_streams, hash_seed, restore_streams
from reflectrl.text.rendering import PolicyPrompt, PromptRenderer
from reflectrl.text.tokens import encode_action_texts, pad_tokens


class ReflectRLVectorEnv(gym.vector.VectorEnv):
    metadata: ClassVar[dict[str, Any]] = {"autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(
        self,
        config: ReflectRLConfig,
        tokenizer: Any,
        reflector: Reflector | None,
        num_envs: int,
        worker_index: int = 0,
        reflection_tokenizer: Any = None,
        report_error: Callable[[str], None] | None = None,
        report_progress: Callable[[str, int], None] | None = None,
    ) -> None:
        self.config = config
        # Called with a one-line error before an exception leaves reset/step (the worker dies).
        self.report_error = report_error
        self.report_progress = report_progress  # env steps, for the run's heartbeat
        self.tokenizer = tokenizer
        self.reflector = reflector if config.reflection.enabled else None
        self.num_envs = num_envs
        self.worker_index = worker_index
        self.envs: list[TextEnv] = [
            make_text_env(config.env.name, config.env.options) for _ in range(num_envs)
        ]
        self.max_actions = self.envs[0].max_actions
        self.renderer = PromptRenderer(config, tokenizer, self.max_actions, reflection_tokenizer)
        self.labels, self.label_ids = self.renderer.labels, self.renderer.label_ids
        length = config.env.max_prompt_tokens
        vocab = len(tokenizer)
        self.single_observation_space = gym.spaces.Dict(
            {
                "input_ids": gym.spaces.Box(0, vocab - 1, (length,), np.int64),
                "attention_mask": gym.spaces.Box(0, 1, (length,), np.int64),
                "option_mask": gym.spaces.Box(0.0, 1.0, (self.max_actions,), np.float32),
                "live": gym.spaces.Box(0, 1, (1,), np.int64),
            }
        )
        self.text_head = config.policy.action_head == "text"
        self._action_tokens: dict[str, list[int]] = {}  # text head: each action text's tokens
        if self.text_head:  # each menu slot's own tokens, for the policy to score
            slots = (self.max_actions, config.policy.action_max_tokens)
            self.single_observation_space["action_ids"] = gym.spaces.Box(
                0, vocab - 1, slots, np.int64
            )
            self.single_observation_space["action_mask"] = gym.spaces.Box(0, 1, slots, np.int64)
            self.single_observation_space["action_words"] = gym.spaces.Box(
                0.0, np.inf, (self.max_actions,), np.float32
            )
        self.single_action_space = gym.spaces.Discrete(self.max_actions)
        self.observation_space = gym.vector.utils.batch_space(
            self.single_observation_space, num_envs
        )
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        self._seed_streams(worker_index)
        self._orders: list[list[int]] = [[] for _ in range(num_envs)]
        self._needs_reset = np.zeros(num_envs, dtype=bool)
        self._returns = np.zeros(num_envs)
        self._lengths = np.zeros(num_envs, dtype=np.int64)
        self._seeded = [False] * num_envs
        # Listed starts each env plays next, in order (held-out eval); then drawn ones.
        self._start_queues: list[list[str]] = [[] for _ in range(num_envs)]
        self._starts = [""] * num_envs  # the listed start of each env's running episode
        self._groups = [""] * num_envs  # the group draw of each env's episode (rl.group_size)
        self._grouped = [False] * num_envs  # its start came from the group (not a listed one)
        # Eval turns this on to tell states the SFT data showed from new ones.
        self.record_observations = False
        self._observed: list[list[str]] = [[] for _ in range(num_envs)]
        self.finished: list[EpisodeRecord] = []
        # Whether episodes that begin now are recorded in `finished` (the rollout worker keeps
        # no episode that begins after its cut: rollout/episode_runner.py).
        self.recording = True
        self._recording = [True] * num_envs  # each env's running episode began while recording
        self.counters = zero_counts()  # since the last `pop_stats`
        # Seconds spent since the last `pop_stats`, reported as these counters (in ms).
        self._seconds = {"env_ms": 0.0, "reflection_ms": 0.0, "policy_ms": 0.0}
        self._returned_at: float | None = None  # when the last observation went to RLlib
        self.last_prompts: list[str] = []
        self.last_views: list[StepView] = []  # (`reflectrl play`)
        # The actions each env's episode has taken (reflection.quote_valid_actions lets a
        # reflection quote them besides the valid actions).
        self._taken: list[list[str]] = [[] for _ in range(num_envs)]
        self._prefetch = ResetPrefetcher() if config.env.prefetch_resets else None
        self._stage_args: tuple[str, tuple[str, ...], float] | None = None

    def _seed_streams(self, worker_index: int) -> None:
        """Every random choice derives from run.seed, the worker and the env index. The one
        place a worker's streams, its reflection seed and its reflection replica are chosen."""
        seed = self.config.run.seed
        self.worker_index = worker_index
        self._reset_seeds = [hash_seed(seed, worker_index, i) for i in range(self.num_envs)]
        self._rngs = [np.random.default_rng([seed, worker_index, i]) for i in range(self.num_envs)]
        self.group_starts = GroupStarts(
            self.config.rl.group_size, self.num_envs, seed, worker_index
        )
        if self.reflector is not None:
            self.reflector.seed = hash_seed(seed, worker_index)
            # Worker i asks reflection replica i - 1 (mod replicas): the load is spread.
            use_replica = getattr(self.reflector, "use_replica", None)
            if use_replica is not None:
                use_replica(max(worker_index - 1, 0))

    def set_worker_index(self, worker_index: int) -> None:
        """Re-seed for the rollout worker this env lives in, before its first reset. (RLlib's
        vector entry point gets a plain dict without the worker index, so the callback tells
        it; without this every worker would play the same start states.)"""
        if any(self._seeded):
            raise RuntimeError("set_worker_index must come before the first reset")
        self._seed_streams(worker_index)

    # --- curriculum and the coordinator's view ---------------------------------------------

    @property
    def stage(self) -> str:
        return self.envs[0].stage

    def set_stage(self, stage: str, review: Sequence[str] = (), review_share: float = 0.0) -> None:
        """Switch all envs; in-flight episodes finish in their stage, new ones use this one
        (or, that share of them, one of the `review` stages: `TextEnv.set_stage`)."""
        stage_args = (stage, tuple(review), review_share)
        if stage_args != self._stage_args:
            self._cancel_prefetched_resets()  # they drew their episodes in the old stage
        self._stage_args = stage_args
        for env in self.envs:
            env.set_stage(stage, review, review_share)

    def set_starts(self, starts: list[list[str]]) -> None:
        """Env i plays the listed starts `starts[i]` (ids of `TextEnv.start_ids`) in its next
        episodes, one each, from the next reset on (every env is reset at the next step)."""
        if len(starts) != self.num_envs:
            raise ValueError(f"starts for {len(starts)} envs given to {self.num_envs}")
        self._cancel_prefetched_resets()
        self._start_queues = [list(queue) for queue in starts]
        self._needs_reset[:] = True

    def pop_stats(self) -> WorkerStats:
        """What happened since the last call (the coordinator polls this once per iteration):
        finished episodes and per-iteration counters, which the coordinator sums, so a
        restarted worker (counters at 0) never makes a total go backwards."""
        for key, seconds in self._seconds.items():
            self.counters[key] = round(1000 * seconds)
        stats = WorkerStats(
            worker_index=self.worker_index,
            episodes=self.finished,
            stage=self.stage,
            random_state=self.random_state(),
            **self.counters,
        )
        self.finished = []
        self.counters = zero_counts()
        self._seconds = dict.fromkeys(self._seconds, 0.0)
        self._returned_at = None  # the wait until the next sampling round is not the policy's
        return stats

    def random_state(self) -> dict[str, Any]:
        """Every random stream of this worker's envs (checkpointed; JSON-serialisable). An env
        whose next reset was prefetched reports its streams from before that reset: a resume
        from this state draws the same episode."""
        envs = [env.random_state() for env in self.envs]
        seeded = list(self._seeded)
        # Episodes each group has begun; a prefetched grouped reset is drawn again on resume.
        begun = list(self.group_starts.begun)
        if self._prefetch is not None:
            self._prefetch.settle()
            for i, pending in self._prefetch.pending.items():
                envs[i], seeded[i] = pending.streams_before, pending.seeded_before
                if self._grouped[i]:
                    begun[i // self.group_starts.group_size] -= 1
        return {
            "worker_index": self.worker_index,
            "envs": envs,
            "menu_shuffles": [dict(rng.bit_generator.state) for rng in self._rngs],
            "seeded": seeded,
            "group_resets": begun,
            # The worker process's streams: the policy samples its actions from torch's.
            "process": capture_streams(),
        }

    def set_random_state(self, state: dict[str, Any]) -> None:
        """Continue the streams of a checkpoint: episodes in flight restart from a reset drawn
        from the restored stream, so a resumed run does not replay earlier start states."""
        if len(state["envs"]) != self.num_envs:
            raise ValueError(
                f"random state for {len(state['envs'])} envs given to a worker with "
                f"{self.num_envs}; resume with the same env.envs_per_worker"
            )
        self._cancel_prefetched_resets()
        for env, env_state in zip(self.envs, state["envs"], strict=True):
            env.set_random_state(env_state)
        for rng, shuffle_state in zip(self._rngs, state["menu_shuffles"], strict=True):
            rng.bit_generator.state = shuffle_state
        self._seeded = [bool(s) for s in state["seeded"]]
        if "group_resets" in state:  # (older checkpoints have none)
            self.group_starts.begun = [int(n) for n in state["group_resets"]]
        if "process" in state:  # (older checkpoints have none)
            restore_streams(state["process"])
        self._needs_reset[:] = True  # the next step starts fresh episodes on every env

    # --- gymnasium vector API -------------------------------------------------------------

    def reset(
        self, *, seed: int | list[int] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        # RLlib passes its own seed; ours comes from run.seed so runs are reproducible from
        # the config alone, and each env keeps its RNG stream across resets.
        with self._reporting_errors():
            self._cancel_prefetched_resets()
            return self._reset()

    def step(
        self, actions: np.ndarray
    ) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        started = time.perf_counter()
        if self._returned_at is not None:
            self._seconds["policy_ms"] += started - self._returned_at
        reflecting = self._seconds["reflection_ms"]
        with self._reporting_errors():
            stepped = self._step(actions)
        if self.report_progress is not None:
            self.report_progress("env_steps", self.num_envs)
        self._returned_at = time.perf_counter()
        reflected = self._seconds["reflection_ms"] - reflecting
        self._seconds["env_ms"] += self._returned_at - started - reflected
        return stepped

    def close_extras(self, **kwargs: Any) -> None:
        if self._prefetch is not None:
            self._prefetch.close()
        for env in self.envs:
            env.close()

    # --- internals ------------------------------------------------------------------------

    @contextlib.contextmanager
    def _reporting_errors(self) -> Iterator[None]:
        try:
            yield
        except Exception as err:  # re-raised: only reported on its way out
            if self.report_error is not None:
                message = " ".join(f"{type(err).__name__}: {err}".split())
                self.report_error(f"worker {self.worker_index}: {message}")
            raise

    def _reset(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        text_obs = [self._reset_env(i) for i in range(self.num_envs)]
        for i in range(self.num_envs):
            self._begin_tally(i)
        self._needs_reset[:] = False
        every = [True] * self.num_envs
        return self._observe(text_obs, every, every), {}

    def _step(
        self, actions: np.ndarray
    ) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        text_obs: list[TextObservation] = []
        rewards = np.zeros(self.num_envs, dtype=np.float32)
        terminated = np.zeros(self.num_envs, dtype=bool)
        truncated = np.zeros(self.num_envs, dtype=bool)
        successes = np.zeros(self.num_envs, dtype=bool)
        if self._prefetch is not None:
            self._prefetch.settle()
        for i, env in enumerate(self.envs):
            if self._needs_reset[i]:
                prefetched = None if self._prefetch is None else self._prefetch.take(i)
                text_obs.append(self._reset_env(i) if prefetched is None else prefetched)
                self._begin_tally(i)
                self._needs_reset[i] = False
                continue
            label = int(actions[i])
            if not 0 <= label < len(self._orders[i]):
                raise ValueError(f"label index {label} is not on env {i}'s menu (masked)")
            self._taken[i].append(self.last_views[i].menu[label])
            obs, reward, term, trunc, info = env.step(self._orders[i][label])
            self.counters["env_steps"] += 1
            self._returns[i] += reward
            self._lengths[i] += 1
            rewards[i], terminated[i], truncated[i] = reward, term, trunc
            successes[i] = bool(info.get("success", False))
            if term or trunc:
                self._record_episode(i, successes[i], bool(trunc))
                self._needs_reset[i] = True
            text_obs.append(obs)
        # Read before `_observe` starts the next resets: the stage and group of the episode
        # each env played this step (success replay and group advantages use them).
        infos = {
            "success": successes,
            "stage": np.array([env.episode_stage for env in self.envs]),
            "group": np.array(self._groups),
        }
        # An episode's last observation is not live: its action is ignored (the next step
        # resets). A terminated one needs no reflection either (its value is never used); a
        # truncated one gets one, since GAE bootstraps from its value.
        ended = list(terminated | truncated)
        observation = self._observe(text_obs, list(~terminated), [not e for e in ended], ended)
        return observation, rewards, terminated, truncated, infos

    def _reset_env(self, i: int) -> TextObservation:
        obs, _ = self.envs[i].reset(**self._next_reset_args(i))
        return obs

    def _next_reset_args(self, i: int) -> dict[str, Any]:
        """The seed (first reset only) and listed start of env i's next episode."""
        seed = None if self._seeded[i] else self._reset_seeds[i]
        self._seeded[i] = True
        queue = self._start_queues[i]
        self._starts[i] = queue.pop(0) if queue else ""
        self._grouped[i] = not queue and not self._starts[i] and self.group_starts.enabled
        if self._grouped[i]:
            self._starts[i], self._groups[i] = self.group_starts.next_start(i, self.envs[i])
        return {"seed": seed, "options": {"start": self._starts[i]} if self._starts[i] else None}

    def _begin_tally(self, i: int) -> None:
        self._recording[i] = self.recording
        self._returns[i] = 0.0
        self._lengths[i] = 0
        self._observed[i] = []
        self._taken[i] = []

    def _start_prefetch(self, indices: list[int]) -> None:
        """Start the next reset of these envs (their episodes ended; their prompts are done)."""
        if self._prefetch is None:
            return
        for i in indices:
            seeded_before = self._seeded[i]
            args = self._next_reset_args(i)
            start = self._starts[i]
            self._prefetch.start(i, self.envs[i], seeded_before=seeded_before, start=start, **args)

    def _cancel_prefetched_resets(self) -> None:
        """Undo every prefetched reset: the next step resets those envs in line, from the same
        streams and listed starts, after whatever changed how their episodes are drawn."""
        if self._prefetch is None:
            return
        self._prefetch.settle()
        for i in list(self._prefetch.pending):
            pending = self._prefetch.cancel(i, self.envs[i])
            assert pending is not None
            self._seeded[i] = pending.seeded_before
            if pending.start:
                self._start_queues[i].insert(0, pending.start)

    def _record_episode(self, i: int, success: bool, step_limit: bool) -> None:
        if not self._recording[i]:
            return
        self.finished.append(
            EpisodeRecord(
                stage=self.envs[i].episode_stage,
                success=bool(success),
                step_limit=step_limit and not success,
                episode_return=float(self._returns[i]),
                length=int(self._lengths[i]),
                env_index=i,
                kind=self.envs[i].episode_kind,
                start=self._starts[i],
                observed=tuple(self._observed[i]),
            )
        )

    def _observe(
        self,
        text_obs: list[TextObservation],
        reflect: list[bool],
        live: list[bool],
        ended: list[bool] | None = None,
    ) -> dict[str, Any]:
        for i, obs in enumerate(text_obs):
            if self.record_observations and live[i]:
                self._observed[i].append(obs.digest())
            n = len(obs.actions)
            order = list(range(n))
            if self.config.env.shuffle_options:
                order = [int(j) for j in self._rngs[i].permutation(n)]
            self._orders[i] = order
        ended = ended or [False] * self.num_envs
        # None: the no-reflection layout (ablation); "" where a reflection is not needed.
        reflections: list[str | None] = [None if self.reflector is None else ""] * self.num_envs
        levels = [0] * self.num_envs
        wanted = [i for i, on in enumerate(reflect) if on] if self.reflector is not None else []
        rendered = {i: self.renderer.reflection_prompt(self.envs[i], text_obs[i]) for i in wanted}
        prompts: dict[int, PolicyPrompt] = {}
        render = self.renderer.policy_prompt
        for i in range(self.num_envs):
            if i not in rendered:
                prompts[i] = render(self.envs[i], text_obs[i], reflections[i], self._orders[i])
        # Envs that ended without needing a reflection are done with: their next resets run
        # while the server answers.
        self._start_prefetch([i for i in range(self.num_envs) if ended[i] and i not in rendered])
        if rendered:
            hits_before = getattr(self.reflector, "cache_hits", 0)
            asked = time.perf_counter()
            asked_prompts = [rendered[i].text for i in wanted]
            if self.config.reflection.quote_valid_actions:
                quotable = [[*text_obs[i].actions, *self._taken[i]] for i in wanted]
                texts = self.reflector.reflect(asked_prompts, quotable)
            else:
                texts = self.reflector.reflect(asked_prompts)
            self._seconds["reflection_ms"] += time.perf_counter() - asked
            self.counters["reflection_calls"] += len(wanted)
            self.counters["reflection_cache_hits"] += (
                getattr(self.reflector, "cache_hits", 0) - hits_before
            )
            for i, text in zip(wanted, texts, strict=True):
                prompt = rendered[i]
                text_obs[i], levels[i], reflections[i] = prompt.observation, prompt.level, text
                self.counters["clipped_reflection_prompts"] += int(prompt.clipped)
                prompts[i] = render(
                    self.envs[i], text_obs[i], reflections[i], self._orders[i], levels[i]
                )
        self._start_prefetch([i for i in wanted if ended[i]])  # truncated: reflected on
        length = self.config.env.max_prompt_tokens
        batch = {
            "input_ids": np.zeros((self.num_envs, length), dtype=np.int64),
            "attention_mask": np.zeros((self.num_envs, length), dtype=np.int64),
            "option_mask": np.zeros((self.num_envs, self.max_actions), dtype=np.float32),
            "live": np.asarray(live, dtype=np.int64).reshape(self.num_envs, 1),
        }
        self.last_prompts = []
        self.last_views = [
            StepView(
                obs.instruction,
                obs.observation,
                reflections[i],
                tuple(obs.actions[j] for j in self._orders[i]),
            )
            for i, obs in enumerate(text_obs)
        ]
        for i in range(self.num_envs):
            prompt = prompts[i]
            self.counters["truncated_prompts"] += int(prompt.truncated)
            batch["input_ids"][i], batch["attention_mask"][i] = pad_tokens(
                self.tokenizer, prompt.ids, length
            )
            batch["option_mask"][i, : len(text_obs[i].actions)] = 1.0
            self.last_prompts.append(prompt.text)
        if self.text_head:
            menus = [[obs.actions[j] for j in self._orders[i]] for i, obs in enumerate(text_obs)]
            slots = encode_action_texts(
                self.tokenizer,
                menus,
                self.max_actions,
                self.config.policy.action_max_tokens,
                self._action_tokens,
            )
            batch["action_ids"], batch["action_mask"], batch["action_words"] = slots
        return batch
