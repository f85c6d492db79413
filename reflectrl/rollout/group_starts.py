"""Group resets (`rl.group_size` = G): the envs of a rollout worker form groups of G, and the
episodes a group begins share their start, G episodes to a start. Critic-free estimators
(rl/advantages.py: rloo, grpo, gigpo) compare each episode with the others of its group, as
verl-agent's GiGPO does with envs that share a reset seed.

Group g of a worker counts the episodes it has begun; its k-th takes the start of draw k // G,
chosen by a hash of (run seed, worker, group, draw) from the env's listed starts
(`TextEnv.start_ids`). The counters are the whole state: checkpointed with the worker's random
streams, they make a resumed run draw the same groups. Each episode's `info["group"]` names
its draw; the learner's connector groups episodes by it and by the episode's stage.
"""

from __future__ import annotations

from reflectrl.envs.base import TextEnv
from reflectrl.seeding import hash_seed


class GroupStarts:
    def __init__(self, group_size: int, num_envs: int, seed: int, worker_index: int) -> None:
        if group_size < 1 or num_envs % group_size:
            raise ValueError(f"group size {group_size} does not divide {num_envs} envs")
        self.group_size = group_size
        self.seed = seed
        self.worker_index = worker_index
        self.begun = [0] * (num_envs // group_size)  # episodes each group has begun

    @property
    def enabled(self) -> bool:
        return self.group_size > 1

    def next_start(self, env_index: int, env: TextEnv) -> tuple[str, str]:
        """(start id, group id) of env `env_index`'s next episode; ("", "") where the env
        cannot list its starts (each env then draws its own)."""
        starts = env.start_ids(env.stage)
        if not starts:
            return "", ""
        group = env_index // self.group_size
        draw = self.begun[group] // self.group_size
        self.begun[group] += 1
        pick = hash_seed(self.seed, self.worker_index, group, draw) % len(starts)
        return starts[pick], f"{self.worker_index}:{group}:{draw}"
