"""Episodes of a Taxi policy given as a table (action probabilities per prompt), and the table
advantage estimators fitted to them: the sampler and the estimators that
diagnostics/oracle_advantages.py trains with and diagnostics/advantage_noise.py scores.

Sampling: `envs` envs from train starts in lockstep, each episode's stage drawn uniformly from
`stages`, actions drawn from the table. A batch holds the episodes that ended within its env
steps; one still running goes on into the next batch, so no return is cut. With `group` > 1,
the envs of a group play the same (stage, start) in turn, as `rl.group_size` makes the
pipeline's workers do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from diagnostics.taxi_prompts import Prompts
from reflectrl.envs.taxi import DangerousTaxiEnv, TaxiOptions
from reflectrl.rl.advantages import StateTable, model_values

# row, action, logp, stage, state, reward, t, oracle, return; the last step of an episode also
# last, truncated (cut by the step limit) and next_state
Step = dict[str, Any]


class TaxiRollouts:
    def __init__(
        self,
        prompts: Prompts,
        options: TaxiOptions,
        stages: list[str],
        envs: int,
        seed: int,
        rng: np.random.Generator,
        gamma: float,
        group: int = 1,
    ) -> None:
        self.prompts, self.stages, self.rng, self.gamma = prompts, stages, rng, gamma
        self.group = group
        self.envs = [DangerousTaxiEnv(options) for _ in range(envs)]
        for i, env in enumerate(self.envs):
            env.reset(seed=seed * 1000 + i)  # seeds each env's start stream once
        # group g's draws so far (stage, start) and how many of them each env has played
        self.group_draws: list[list[tuple[str, str]]] = [[] for _ in range(-(-envs // group))]
        self.played = [0] * envs
        self.running: dict[int, list[Step]] = {}
        for i in range(envs):
            self.begin(i)

    def begin(self, i: int) -> None:
        env = self.envs[i]
        self.running[i] = []
        if self.group == 1:
            env.set_stage(self.stages[int(self.rng.integers(len(self.stages)))])
            env.reset()
            return
        draws = self.group_draws[i // self.group]
        if self.played[i] == len(draws):  # the first of its group to need this episode
            stage = self.stages[int(self.rng.integers(len(self.stages)))]
            env.set_stage(stage)
            starts = env.start_ids(stage) or []
            draws.append((stage, starts[int(self.rng.integers(len(starts)))]))
        stage, start = draws[self.played[i]]
        self.played[i] += 1
        env.set_stage(stage)
        env.reset(options={"start": start})

    def batch(
        self, logp_table: torch.Tensor, env_steps: int, generator: torch.Generator
    ) -> tuple[list[Step], list[dict[str, Any]], list[int]]:
        """(steps of the episodes that ended, those episodes, the prompt of every step taken)
        after `env_steps` steps sampled from `logp_table` [prompts, actions]."""
        steps: list[Step] = []
        episodes: list[dict[str, Any]] = []
        shown: list[int] = []
        while len(shown) < env_steps:
            live = range(min(len(self.envs), env_steps - len(shown)))
            rows = [self.prompts.of(self.envs[i]) for i in live]
            actions = torch.multinomial(logp_table[rows].exp(), 1, generator=generator)
            for i, k, action in zip(live, rows, actions.squeeze(1).tolist(), strict=True):
                env = self.envs[i]
                stage, state = env.episode_stage, int(env.taxi.s)
                _, reward, terminated, truncated, info = env.step(action)
                shown.append(k)
                self.running[i].append({
                    "row": k, "action": action, "logp": float(logp_table[k, action]),
                    "stage": stage, "state": state, "reward": reward, "t": len(self.running[i]),
                    "oracle": self.prompts.oracle[k][action],
                })  # fmt: skip
                if terminated or truncated:
                    episode = self.running[i]
                    ret = 0.0
                    for step in reversed(episode):
                        ret = step["reward"] + self.gamma * ret
                        step["return"] = ret
                    episode[-1]["last"] = True
                    episode[-1]["truncated"] = bool(truncated and not terminated)
                    episode[-1]["next_state"] = int(env.taxi.s)
                    steps += episode
                    episodes.append({"success": info["success"], "danger": info["danger"],
                                     "return": sum(s["reward"] for s in episode)})  # fmt: skip
                    self.begin(i)
        return steps, episodes, shown


@dataclass
class TableCritics:
    """The table estimators' memory across batches: V per (stage, taxi state), the running
    mean of G over every visit so far; and per (prompt, action) the sum and count of G."""

    prompts: int
    actions: int
    value: dict[tuple[str, int], list[float]] = field(default_factory=dict)
    q_sums: np.ndarray = field(init=False)
    q_counts: np.ndarray = field(init=False)

    # td_model: the pipeline's `state_model` table over (stage, taxi state) instead of prompts
    model: StateTable = field(default_factory=StateTable)
    # q_model: the same per (state, action), and the prompt row of each state
    action_model: StateTable = field(default_factory=StateTable)
    rows: dict[Any, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.q_sums = np.zeros((self.prompts, self.actions))
        self.q_counts = np.zeros((self.prompts, self.actions))

    def advantages(
        self, kind: str, steps: list[Step], probs: np.ndarray, gamma: float, lam: float
    ) -> np.ndarray:
        """`mc_batch`, `q_table`, `mc_table`, `mc_table_bootstrap`, `td_table`, `td_model` or
        `q_model` advantages of `steps` (episodes one after another), updating the tables with them
        first. `probs`: the policy's table."""
        if kind == "td_model":
            return self.model_advantages(steps, gamma)
        if kind == "q_model":
            return self.q_model_advantages(steps, probs, gamma)
        returns = np.array([s["return"] for s in steps])
        if kind == "mc_table_bootstrap":  # a cut episode goes on from its last state's value
            returns = returns + self.bootstrap(steps, gamma)
            kind = "mc_table"
        if kind == "mc_batch":
            return returns - returns.mean()
        if kind == "q_table":
            for s in steps:
                self.q_sums[s["row"], s["action"]] += s["return"]
                self.q_counts[s["row"], s["action"]] += 1
            q = self.q_sums / np.maximum(self.q_counts, 1)
            pi = probs * (self.q_counts > 0)
            v = (pi * q).sum(-1) / pi.sum(-1).clip(min=1e-12)
            return np.array([q[s["row"], s["action"]] - v[s["row"]] for s in steps])
        for s, g in zip(steps, returns, strict=True):
            entry = self.value.setdefault((s["stage"], s["state"]), [0.0, 0])
            entry[0] += g
            entry[1] += 1
        baseline = [self.value[(s["stage"], s["state"])] for s in steps]
        values = np.array([total / count for total, count in baseline])
        if kind == "mc_table":
            return returns - values
        assert kind == "td_table", kind
        adv = np.zeros(len(steps))
        carry = 0.0
        for t in reversed(range(len(steps))):
            last = steps[t].get("last", False)
            next_value = 0.0 if last else values[t + 1]
            delta = steps[t]["reward"] + gamma * next_value - values[t]
            carry = delta + gamma * lam * (0.0 if last else carry)
            adv[t] = carry
        return adv

    def bootstrap(self, steps: list[Step], gamma: float) -> np.ndarray:
        """gamma^(T - t) V(s_T) for the steps of an episode the step limit cut (V: the state
        table so far; 0 for a state not seen yet), 0 elsewhere: the step limit is not in the
        observation, so a cut episode's return goes on from where it stopped."""
        out = np.zeros(len(steps))
        end = len(steps)
        for t in reversed(range(len(steps))):
            if steps[t].get("last"):
                end = t
            last = steps[end]
            if last.get("truncated"):
                total, count = self.value.get((last["stage"], last["next_state"]), (0.0, 0))
                out[t] = gamma ** (end - t + 1) * total / max(count, 1)
        return out

    def model_advantages(self, steps: list[Step], gamma: float) -> np.ndarray:
        """`td_model`: every transition of `steps` goes into the empirical model first; V is
        that model's policy evaluation to convergence (the actions as often as they were
        taken, a cut episode going on from where it stopped: the step limit is not in the
        observation), and A_t = r_t + gamma V(s_{t+1}) - V(s_t), V = 0 after an ending."""
        nexts = [_next_key(steps, t) for t in range(len(steps))]
        for step, nxt in zip(steps, nexts, strict=True):
            self.model.add_transition(_key(step), nxt, step["reward"])
        value = self.model_values(gamma)
        return np.array([
            s["reward"] + gamma * (0.0 if n is None else value.get(n, 0.0)) - value[_key(s)]
            for s, n in zip(steps, nexts, strict=True)
        ])  # fmt: skip

    def model_values(self, gamma: float) -> dict[Any, float]:
        """V of the empirical model, iterated to convergence (a next state never left is 0):
        the pipeline's `state_model` evaluation, over taxi states."""
        return model_values(self.model.transitions, gamma)

    def q_model_advantages(self, steps: list[Step], probs: np.ndarray, gamma: float) -> np.ndarray:
        """`q_model`: the empirical model per (state, action) of every transition seen so far,
        evaluated to convergence for the current policy `probs` (renormalised over the actions
        tried at each state; a cut episode goes on from where it stopped), and
        A = Q(s, a) - V(s): `exact`'s advantage on the part of the env the rollouts have seen."""
        for t, step in enumerate(steps):
            key = _key(step)
            self.rows[key] = step["row"]
            self.action_model.add_transition(
                (key, step["action"]), _next_key(steps, t), step["reward"]
            )
        keys = list(self.rows)
        index = {k: i for i, k in enumerate(keys)}
        pairs = list(self.action_model.transitions)
        weight = np.array([probs[self.rows[k], a] for k, a in pairs])
        owner = np.array([index[k] for k, _ in pairs], dtype=int)
        weight = weight / np.bincount(owner, weight, minlength=len(keys))[owner]
        reward, src, dst, w = np.zeros(len(pairs)), [], [], []
        for p, pair in enumerate(pairs):
            out = self.action_model.transitions[pair]
            visits = sum(count for count, _ in out.values())
            reward[p] = sum(total for _, total in out.values()) / visits
            for nxt, (count, _) in out.items():
                if nxt in index:
                    src.append(p)
                    dst.append(index[nxt])
                    w.append(count / visits)
        src_a, dst_a, w_a = np.array(src, dtype=int), np.array(dst, dtype=int), np.array(w)
        value = np.zeros(len(keys))
        for _ in range(5000):
            q = reward + gamma * np.bincount(src_a, w_a * value[dst_a], minlength=len(pairs))
            new = np.bincount(owner, weight * q, minlength=len(keys))
            done = np.abs(new - value).max() < 1e-8
            value = new
            if done:
                break
        q_of = {pair: float(q[p]) for p, pair in enumerate(pairs)}
        return np.array([
            q_of[(_key(s), s["action"])] - value[index[_key(s)]] for s in steps
        ])  # fmt: skip


def _key(step: Step) -> tuple[str, int]:
    return step["stage"], step["state"]


def _next_key(steps: list[Step], t: int) -> tuple[str, int] | None:
    """The state after step t: the next step's, or after an episode's last step the state a
    cut left it in (None where it ended)."""
    step = steps[t]
    if not step.get("last"):
        return _key(steps[t + 1])
    return (step["stage"], step["next_state"]) if step.get("truncated") else None
