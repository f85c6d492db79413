"""The env a rollout worker (RLlib EnvRunner) steps: several text envs behind one vector env.

Per step it steps every text env, asks the reflection server for all of their reflections in
ONE batched request, renders the policy prompts and tokenizes them into the fixed-shape
observation RLlib needs (a gymnasium `Text` space crashes inside the EnvRunner):
    input_ids      int64 [max_prompt_tokens]  right-padded prompt
    attention_mask int64 [max_prompt_tokens]
    option_mask    float32 [K]                1 for labels on the menu now
The action is a label index; it maps to the env's action through the (maybe shuffled) menu.

Autoreset follows gymnasium's NEXT_STEP mode, which RLlib's EnvRunner expects: the step after
an episode ends resets that env and ignores its action.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from reflectrl import prompts
from reflectrl.config import ReflectRLConfig
from reflectrl.envs.base import TextEnv, TextObservation
from reflectrl.envs.registry import make_text_env
from reflectrl.models.tokens import encode_prompt, label_token_ids


@dataclass
class EpisodeRecord:
    """One finished episode, as the coordinator aggregates them across workers."""

    stage: str
    success: bool
    episode_return: float
    length: int


class Reflector:
    """What the vector env needs from a reflection source: many prompts in, as many texts out."""

    calls: int

    def reflect(self, prompts: list[str]) -> list[str]:  # pragma: no cover - protocol
        raise NotImplementedError


class ReflectRLVectorEnv(gym.vector.VectorEnv):
    metadata: ClassVar[dict[str, Any]] = {"autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(
        self,
        config: ReflectRLConfig,
        tokenizer: Any,
        reflector: Reflector | None,
        num_envs: int,
        worker_index: int = 0,
    ) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.reflector = reflector if config.reflection.enabled else None
        self.num_envs = num_envs
        self.worker_index = worker_index
        self.envs: list[TextEnv] = [
            make_text_env(config.env.name, config.env.options) for _ in range(num_envs)
        ]
        self.max_actions = self.envs[0].max_actions
        labels = config.policy.labels
        if self.max_actions > len(labels):
            raise ValueError(
                f"env {config.env.name!r} shows up to {self.max_actions} actions but "
                f"policy.labels has only {len(labels)}; add labels"
            )
        self.labels = labels[: self.max_actions]
        self.label_ids = label_token_ids(tokenizer, self.labels, prompts.ACTION_MARKER)
        length = config.env.max_prompt_tokens
        vocab = len(tokenizer)
        self.single_observation_space = gym.spaces.Dict(
            {
                "input_ids": gym.spaces.Box(0, vocab - 1, (length,), np.int64),
                "attention_mask": gym.spaces.Box(0, 1, (length,), np.int64),
                "option_mask": gym.spaces.Box(0.0, 1.0, (self.max_actions,), np.float32),
            }
        )
        self.single_action_space = gym.spaces.Discrete(self.max_actions)
        self.observation_space = gym.vector.utils.batch_space(
            self.single_observation_space, num_envs
        )
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        # Seeds: every random choice derives from run.seed, the worker and the env index.
        seed = config.run.seed
        self._reset_seeds = [hash_seed(seed, worker_index, i) for i in range(num_envs)]
        self._rngs = [np.random.default_rng([seed, worker_index, i]) for i in range(num_envs)]
        self._orders: list[list[int]] = [[] for _ in range(num_envs)]
        self._needs_reset = np.zeros(num_envs, dtype=bool)
        self._returns = np.zeros(num_envs)
        self._lengths = np.zeros(num_envs, dtype=np.int64)
        self._seeded = [False] * num_envs
        self.finished: list[EpisodeRecord] = []
        self.env_steps = 0
        self.truncated_prompts = 0
        self.last_prompts: list[str] = []

    # --- curriculum -----------------------------------------------------------------------

    @property
    def stage(self) -> str:
        return self.envs[0].stage

    def set_stage(self, stage: str) -> None:
        """Switch all envs; in-flight episodes finish in their stage, new ones use this one."""
        for env in self.envs:
            env.set_stage(stage)

    def pop_stats(self) -> dict[str, Any]:
        """Finished episodes and counters since the last call (the coordinator polls this)."""
        stats = {
            "episodes": [asdict(e) for e in self.finished],
            "reflection_calls": self.reflector.calls if self.reflector else 0,
            "env_steps": self.env_steps,  # since the last call
            "truncated_prompts": self.truncated_prompts,
            "stage": self.stage,
        }
        self.finished = []
        self.env_steps = 0
        return stats

    # --- gymnasium vector API -------------------------------------------------------------

    def reset(
        self, *, seed: int | list[int] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        # RLlib passes its own seed; ours comes from run.seed so runs are reproducible from
        # the config alone, and each env keeps its RNG stream across resets.
        text_obs = [self._reset_env(i) for i in range(self.num_envs)]
        self._needs_reset[:] = False
        return self._observe(text_obs, [True] * self.num_envs), {}

    def step(
        self, actions: np.ndarray
    ) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        text_obs: list[TextObservation] = []
        rewards = np.zeros(self.num_envs, dtype=np.float32)
        terminated = np.zeros(self.num_envs, dtype=bool)
        truncated = np.zeros(self.num_envs, dtype=bool)
        successes = np.zeros(self.num_envs, dtype=bool)
        for i, env in enumerate(self.envs):
            if self._needs_reset[i]:
                text_obs.append(self._reset_env(i))
                self._needs_reset[i] = False
                continue
            label = int(actions[i])
            if not 0 <= label < len(self._orders[i]):
                raise ValueError(f"label index {label} is not on env {i}'s menu (masked)")
            obs, reward, term, trunc, info = env.step(self._orders[i][label])
            self.env_steps += 1
            self._returns[i] += reward
            self._lengths[i] += 1
            rewards[i], terminated[i], truncated[i] = reward, term, trunc
            successes[i] = bool(info.get("success", False))
            if term or trunc:
                self._record_episode(i, successes[i])
                self._needs_reset[i] = True
            text_obs.append(obs)
        # A terminated state's value is never used, so it gets no reflection.
        observation = self._observe(text_obs, [not t for t in terminated])
        return observation, rewards, terminated, truncated, {"success": successes}

    def close_extras(self, **kwargs: Any) -> None:
        for env in self.envs:
            env.close()

    # --- internals ------------------------------------------------------------------------

    def _reset_env(self, i: int) -> TextObservation:
        seed = None if self._seeded[i] else self._reset_seeds[i]
        self._seeded[i] = True
        obs, _ = self.envs[i].reset(seed=seed)
        self._returns[i] = 0.0
        self._lengths[i] = 0
        return obs

    def _record_episode(self, i: int, success: bool) -> None:
        self.finished.append(
            EpisodeRecord(
                stage=self.envs[i].stage,
                success=bool(success),
                episode_return=float(self._returns[i]),
                length=int(self._lengths[i]),
            )
        )

    def _observe(self, text_obs: list[TextObservation], reflect: list[bool]) -> dict[str, Any]:
        reflections = [""] * self.num_envs
        if self.reflector is not None:
            wanted = [i for i, r in enumerate(reflect) if r]
            if wanted:
                texts = self.reflector.reflect(
                    [prompts.reflection_prompt(text_obs[i]) for i in wanted]
                )
                for i, text in zip(wanted, texts, strict=True):
                    reflections[i] = text
        length = self.config.env.max_prompt_tokens
        batch = {
            "input_ids": np.zeros((self.num_envs, length), dtype=np.int64),
            "attention_mask": np.zeros((self.num_envs, length), dtype=np.int64),
            "option_mask": np.zeros((self.num_envs, self.max_actions), dtype=np.float32),
        }
        self.last_prompts = []
        for i, obs in enumerate(text_obs):
            n = len(obs.actions)
            order = list(range(n))
            if self.config.env.shuffle_options:
                order = [int(j) for j in self._rngs[i].permutation(n)]
            self._orders[i] = order
            if self.reflector is not None:
                prompt = prompts.policy_prompt(obs, reflections[i], self.labels, order)
            else:
                prompt = prompts.no_reflection_prompt(obs, self.labels, order)
            ids, mask, dropped = encode_prompt(
                self.tokenizer, prompts.prompt_head(obs), prompt, length
            )
            self.truncated_prompts += int(dropped > 0)
            batch["input_ids"][i], batch["attention_mask"][i] = ids, mask
            batch["option_mask"][i, :n] = 1.0
            self.last_prompts.append(prompt)
        return batch


def hash_seed(*parts: int) -> int:
    """A stable 31-bit seed from integers (Python's hash() of ints is not mixed enough)."""
    return int(np.random.SeedSequence(list(parts)).generate_state(1)[0] & 0x7FFFFFFF)
