"""Run a policy on its env without Ray: greedy or sampled decoding, success rate and return.

Used by tests (does training beat the untrained policy?) and by evaluation on held-out seeds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from reflectrl.models.policy import OptionPolicy
from reflectrl.rollout_workers.vector_env import ReflectRLVectorEnv


@dataclass
class EvalResult:
    episodes: int
    success_rate: float
    return_mean: float


@torch.no_grad()
def evaluate(
    policy: OptionPolicy, env: ReflectRLVectorEnv, episodes: int, greedy: bool, seed: int = 0
) -> EvalResult:
    policy.eval()
    generator = torch.Generator().manual_seed(seed)
    obs, _ = env.reset()
    env.pop_stats()
    finished: list[dict] = []
    while len(finished) < episodes:
        batch = {k: torch.as_tensor(v) for k, v in obs.items()}
        logits, _ = policy(batch["input_ids"], batch["attention_mask"], batch["option_mask"])
        if greedy:
            actions = logits.argmax(dim=-1)
        else:
            actions = torch.multinomial(logits.softmax(dim=-1), 1, generator=generator)[:, 0]
        obs, *_ = env.step(actions.numpy())
        finished.extend(env.pop_stats()["episodes"])
    finished = finished[:episodes]
    return EvalResult(
        episodes=len(finished),
        success_rate=float(np.mean([e["success"] for e in finished])),
        return_mean=float(np.mean([e["episode_return"] for e in finished])),
    )
