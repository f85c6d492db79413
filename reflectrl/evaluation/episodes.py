"""Play a policy on a vector env without Ray: greedy or sampled decoding, per-episode records.

Each of the env's slots plays its own quota of episodes and only its first episodes count:
keeping "the first N episodes to finish" across slots would favour short episodes (quick
successes and quick failures), a biased sample. Given `starts` (ids of the env's listed
starts), the slots share them out and each start is played exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from reflectrl.models.policy import OptionPolicy
from reflectrl.rollout.seams import EpisodeRecord
from reflectrl.rollout.vector_env import ReflectRLVectorEnv


@dataclass
class EvalResult:
    episodes: int
    success_rate: float
    return_mean: float


def slot_quotas(episodes: int, slots: int) -> list[int]:
    """`episodes` spread over `slots` as evenly as possible (the first slots take the rest)."""
    return [episodes // slots + int(i < episodes % slots) for i in range(slots)]


def deal(items: list[str], hands: int) -> list[list[str]]:
    """`items` dealt round-robin into `hands` lists (sizes differ by at most one)."""
    return [items[i::hands] for i in range(hands)]


@torch.no_grad()
def play(
    policy: OptionPolicy,
    env: ReflectRLVectorEnv,
    episodes: int,
    greedy: bool,
    seed: int = 0,
    starts: list[str] | None = None,
) -> list[EpisodeRecord]:
    """`episodes` finished episodes, each slot's first ones; with
    `starts`, one episode from each of them instead."""
    policy.eval()
    generator = torch.Generator().manual_seed(seed)
    if starts is not None:
        queues = deal(starts, env.num_envs)
        env.set_starts(queues)
        quotas = [len(queue) for queue in queues]
    else:
        quotas = slot_quotas(episodes, env.num_envs)
    kept: list[list[EpisodeRecord]] = [[] for _ in quotas]
    obs, _ = env.reset()
    env.pop_stats()
    while any(len(k) < q for k, q in zip(kept, quotas, strict=True)):
        batch = {k: torch.as_tensor(v) for k, v in obs.items()}
        logits, _ = policy.logits_and_hidden(batch)
        if greedy:
            actions = logits.argmax(dim=-1)
        else:
            actions = torch.multinomial(logits.softmax(dim=-1), 1, generator=generator)[:, 0]
        obs, *_ = env.step(actions.numpy())
        for record in env.pop_stats()["episodes"]:
            slot = kept[record["env_index"]]
            if len(slot) < quotas[record["env_index"]]:
                slot.append(record)
    return [record for slot in kept for record in slot]


def evaluate(
    policy: OptionPolicy, env: ReflectRLVectorEnv, episodes: int, greedy: bool, seed: int = 0
) -> EvalResult:
    finished = play(policy, env, episodes, greedy, seed)
    return EvalResult(
        episodes=len(finished),
        success_rate=float(np.mean([e["success"] for e in finished])),
        return_mean=float(np.mean([e["episode_return"] for e in finished])),
    )
