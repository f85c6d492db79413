"""Advantages: every estimator a run can choose (`rl.advantage`), in plain numpy (no Ray).

Input: the episodes of one iteration (`Episode`: rewards, how it ended, the critic's values
where there is a critic, the group of envs it started with, a digest of each step's
observation). Output: one advantage per step, and the value targets a critic trains on.

- `gae`: PPO's generalised advantage estimate over a critic (CleanRL's `ppo.py` loop).
- `reinforce`: the discounted return-to-go, no baseline and no critic (the authors' default
  trainer, `trainer=pg` in zhourunlong/Reflect-RL).
- `rloo`, `grpo`: the episode's return against the other episodes of its group (leave-one-out
  mean; mean and std), broadcast to every step of the episode.
- `gigpo`: GRPO's episode advantage plus a step advantage: the discounted return from a step
  minus the mean over the group's steps that saw the same observation ("anchor states").
- `state_table`: the discounted return from a step minus a table critic, the running mean of
  the return from every step so far (this batch's included) that saw the same observation: a
  critic that tells every observation apart, which the LM's value head cannot (Taxi's start
  prompts share a last-token state at cosine 0.998). The table (`StateTable`) lives on in the
  learner across iterations and in its checkpoints. With `bootstrap_step_limit`, the return of
  an episode the step limit cut goes on from the table's value of its last observation.
- `state_model`: a model-based table critic. The same table also counts every transition
  between observations seen so far (which observation followed, or that the episode ended, and
  the reward); V is the value of that empirical model, evaluated to convergence (the actions as
  often as the rollouts took them; a step-limit cut goes on to the observation after it), and
  A_t = r_t + gamma V(s_{t+1}) - V(s_t). Unlike a return cut at the step limit, the model
  prices a loop at every step it repeats for ever, as the step-limit-free advantage that lifts
  the map-reading policy does (docs/rl.md).

Groups: episodes that share `group` started from the same start. An episode alone in its group
(or with no group) is compared with the whole batch instead, and `fallback_episodes` counts it.

The RLlib learner connector (rl/advantage_connector.py) builds the `Episode`s from a train batch
and standardises the result over the rows that carry loss.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np

from reflectrl.config import CRITIC_FREE, AdvantageEstimator

EPS = 1e-6


@dataclass(frozen=True)
class Episode:
    """One episode (or, with a critic, one chunk of one) as the learner sees it.

    `values` has one entry more than `rewards`: V of the observation after the last step, the
    bootstrap of a chunk that was cut or truncated (unused when `terminated`)."""

    rewards: np.ndarray  # [T]
    terminated: bool  # the last step ended the episode: nothing to bootstrap
    values: np.ndarray | None = None  # [T + 1], critic estimators only
    group: Hashable | None = None
    digests: Sequence[Hashable] | None = None  # [T], gigpo and state_table only
    # the observation after the last step: state_table's bootstrap of a truncated episode
    bootstrap_digest: Hashable | None = None


@dataclass(frozen=True)
class AdvantageSettings:
    estimator: AdvantageEstimator = "gae"
    gamma: float = 0.99
    lambda_: float = 0.95
    step_advantage_weight: float = 1.0  # gigpo: weight of the anchor-state step advantage
    scale_by_std: bool = True  # grpo and gigpo's episode part: divide by the group's std
    bootstrap_step_limit: bool = False  # state_table: a truncated return goes on from V(s_T)


@dataclass
class Estimate:
    advantages: list[np.ndarray]  # one [T] array per episode
    value_targets: list[np.ndarray] | None  # one [T] per episode; None without a critic
    fallback_episodes: int = 0  # episodes alone in their group: compared with the batch
    # gigpo: steps that share their observation with another step of the batch; state_table:
    # steps whose observation the table had seen before this batch.
    anchor_steps: int = 0
    extra: dict[str, float] = field(default_factory=dict)


@dataclass
class StateTable:
    """The table critics' memory. `state_table`: per observation digest, the sum and count of
    the discounted returns-to-go seen from it. `state_model`: per observation digest, per next
    digest (None: the episode ended there), the count and reward sum of the transitions seen.
    Plain dicts of str/float/int, so it pickles into a learner checkpoint as is."""

    sums: dict[Hashable, float] = field(default_factory=dict)
    counts: dict[Hashable, int] = field(default_factory=dict)
    transitions: dict[Hashable, dict[Hashable | None, list[float]]] = field(default_factory=dict)

    def add(self, digest: Hashable, value: float) -> None:
        self.sums[digest] = self.sums.get(digest, 0.0) + value
        self.counts[digest] = self.counts.get(digest, 0) + 1

    def value(self, digest: Hashable) -> float:
        return self.sums[digest] / self.counts[digest]

    def add_transition(self, digest: Hashable, following: Hashable | None, reward: float) -> None:
        entry = self.transitions.setdefault(digest, {}).setdefault(following, [0, 0.0])
        entry[0] += 1
        entry[1] += reward

    def state(self) -> dict[str, dict]:
        transitions = {
            d: {n: list(e) for n, e in out.items()} for d, out in self.transitions.items()
        }
        return {"sums": dict(self.sums), "counts": dict(self.counts), "transitions": transitions}

    def load(self, state: dict[str, dict]) -> None:
        self.sums, self.counts = dict(state["sums"]), dict(state["counts"])
        self.transitions = {
            d: {n: list(e) for n, e in out.items()}
            for d, out in state.get("transitions", {}).items()
        }


def gae(
    rewards: np.ndarray, values: np.ndarray, terminated: bool, gamma: float, lambda_: float
) -> tuple[np.ndarray, np.ndarray]:
    """(advantages, value targets) of one episode chunk; `values` is [T + 1]."""
    steps = len(rewards)
    advantages = np.zeros(steps, dtype=np.float64)
    last_gae = 0.0
    for t in reversed(range(steps)):
        # Only the chunk's last step can end the episode; a cut chunk bootstraps V(s_T).
        next_non_terminal = 0.0 if terminated and t == steps - 1 else 1.0
        delta = rewards[t] + gamma * values[t + 1] * next_non_terminal - values[t]
        advantages[t] = last_gae = delta + gamma * lambda_ * next_non_terminal * last_gae
    return advantages, advantages + values[:steps]


def returns_to_go(rewards: np.ndarray, gamma: float) -> np.ndarray:
    """G_t = r_t + gamma r_{t+1} + ... to the end of the episode."""
    returns = np.zeros(len(rewards), dtype=np.float64)
    running = 0.0
    for t in reversed(range(len(rewards))):
        returns[t] = running = rewards[t] + gamma * running
    return returns


def group_baselines(
    scores: np.ndarray, groups: Sequence[Hashable | None], *, leave_one_out: bool, scale: bool
) -> tuple[np.ndarray, int]:
    """Each score against its group: score - mean of the group (of the *others* with
    `leave_one_out`), divided by the group's std with `scale`. An episode alone in its group
    (or with none) is compared with the whole batch. Returns (relative scores, episodes that
    fell back to the batch)."""
    members: dict[Hashable, list[int]] = defaultdict(list)
    for i, group in enumerate(groups):
        members[("group", group) if group is not None else ("alone", i)].append(i)
    everyone = list(range(len(scores)))
    relative = np.zeros(len(scores), dtype=np.float64)
    fallback = 0
    for rows in members.values():
        if len(rows) < 2:
            fallback += len(rows)
        pool = scores[rows] if len(rows) > 1 else scores[everyone]
        own = scores[rows]
        if leave_one_out:
            baseline = (pool.sum() - own) / max(1, len(pool) - 1)
        else:
            baseline = np.full(len(rows), pool.mean())
        relative[rows] = own - baseline
        if scale:
            relative[rows] /= pool.std() + EPS
    return relative, fallback


def anchor_step_advantages(
    returns: Sequence[np.ndarray],
    digests: Sequence[Sequence[Hashable]],
    groups: Sequence[Hashable | None],
) -> tuple[list[np.ndarray], int]:
    """GiGPO's step advantage: a step's discounted return minus the mean return of every step
    of its group (across its episodes) that saw the same observation; 0 for a step alone.
    Episodes with no group anchor over the whole batch. Returns (per-episode arrays, steps in
    an anchor group of two or more)."""
    sums: dict[tuple[Hashable, Hashable], float] = defaultdict(float)
    counts: dict[tuple[Hashable, Hashable], int] = defaultdict(int)
    keys = []
    for episode_returns, episode_digests, group in zip(returns, digests, groups, strict=True):
        episode_keys = [(group, digest) for digest in episode_digests]
        for key, g in zip(episode_keys, episode_returns, strict=True):
            sums[key] += float(g)
            counts[key] += 1
        keys.append(episode_keys)
    out, anchored = [], 0
    for episode_returns, episode_keys in zip(returns, keys, strict=True):
        step = np.zeros(len(episode_returns), dtype=np.float64)
        for t, key in enumerate(episode_keys):
            if counts[key] > 1:
                step[t] = episode_returns[t] - sums[key] / counts[key]
                anchored += 1
        out.append(step)
    return out, anchored


def bootstrapped(
    returns: np.ndarray, episode: Episode, table: StateTable, gamma: float
) -> np.ndarray:
    """The returns of an episode the step limit cut, going on from the table's value of the
    observation after its last step: G_t + gamma^(T - t) V(s_T). A terminated episode, or one
    whose last observation the table has not seen, keeps its returns."""
    last = episode.bootstrap_digest
    if episode.terminated or last is None or last not in table.counts:
        return returns
    steps_left = np.arange(len(returns), 0, -1)  # T - t
    return returns + gamma**steps_left * table.value(last)


def table_advantages(
    returns: Sequence[np.ndarray], digests: Sequence[Sequence[Hashable]], table: StateTable
) -> tuple[list[np.ndarray], int]:
    """`state_table`: every step's return goes into the table first, then each step's advantage
    is its return minus the table's mean for its observation (0 for one seen only once).
    Returns (per-episode arrays, steps whose observation the table held before)."""
    seen = sum(1 for episode in digests for digest in episode if digest in table.counts)
    for episode_returns, episode_digests in zip(returns, digests, strict=True):
        for digest, g in zip(episode_digests, episode_returns, strict=True):
            table.add(digest, float(g))
    out = [
        np.array([g - table.value(d) for d, g in zip(ds, rs, strict=True)], dtype=np.float64)
        for rs, ds in zip(returns, digests, strict=True)
    ]
    return out, seen


def model_values(
    transitions: dict[Hashable, dict[Hashable | None, list[float]]],
    gamma: float,
    sweeps: int = 5000,
) -> dict[Hashable, float]:
    """V of the empirical model `transitions` (per state, per next state or None for an ending:
    [count, reward sum]), iterated to convergence: V(s) = mean reward + gamma * sum over the
    next states of their share of V(s'), a next state never left counting 0."""
    keys = list(transitions)
    index = {k: i for i, k in enumerate(keys)}
    reward, rows, cols, weights = np.zeros(len(keys)), [], [], []
    for key, out in transitions.items():
        visits = sum(count for count, _ in out.values())
        reward[index[key]] = sum(total for _, total in out.values()) / visits
        for following, (count, _) in out.items():
            if following in index:
                rows.append(index[key])
                cols.append(index[following])
                weights.append(count / visits)
    src, dst, w = np.array(rows, dtype=int), np.array(cols, dtype=int), np.array(weights)
    value = np.zeros(len(keys))
    for _ in range(sweeps):
        new = reward + gamma * np.bincount(src, w * value[dst], minlength=len(keys))
        done = np.abs(new - value).max() < 1e-8
        value = new
        if done:
            break
    return {k: float(value[i]) for k, i in index.items()}


def model_advantages(
    episodes: Sequence[Episode],
    digests: Sequence[Sequence[Hashable]],
    table: StateTable,
    gamma: float,
) -> tuple[list[np.ndarray], int]:
    """`state_model`: every step's transition goes into the table's model first (the next
    step's observation; after an episode's last step none if it terminated, else the
    observation the cut left it in), then A_t = r_t + gamma V(s_{t+1}) - V(s_t) with V the
    model's values (0 after an ending). Returns (per-episode arrays, steps whose observation
    the model held before)."""
    seen = sum(1 for episode in digests for digest in episode if digest in table.transitions)
    followers = []
    for episode, episode_digests in zip(episodes, digests, strict=True):
        last = None if episode.terminated else episode.bootstrap_digest
        following = [*episode_digests[1:], last]
        for digest, nxt, reward in zip(episode_digests, following, episode.rewards, strict=True):
            table.add_transition(digest, nxt, float(reward))
        followers.append(following)
    value = model_values(table.transitions, gamma)
    out = [
        np.array(
            [
                r + gamma * (0.0 if n is None else value.get(n, 0.0)) - value[d]
                for d, n, r in zip(ds, ns, episode.rewards, strict=True)
            ],
            dtype=np.float64,
        )
        for episode, ds, ns in zip(episodes, digests, followers, strict=True)
    ]
    return out, seen


def _digests_of(episodes: Sequence[Episode], kind: str) -> list[Sequence[Hashable]]:
    digests = []
    for episode in episodes:
        if episode.digests is None or len(episode.digests) != len(episode.rewards):
            raise ValueError(f"{kind} needs one observation digest per step of every episode")
        digests.append(episode.digests)
    return digests


def estimate(
    episodes: Sequence[Episode], settings: AdvantageSettings, table: StateTable | None = None
) -> Estimate:
    """Per-step advantages (and value targets with a critic) of `episodes`, unstandardised.
    `state_table` and `state_model` read and update `table`."""
    kind, gamma = settings.estimator, settings.gamma
    if kind not in CRITIC_FREE:  # gae
        pairs = []
        for episode in episodes:
            if episode.values is None:
                raise ValueError("gae needs the critic's values of every episode")
            pairs.append(
                gae(episode.rewards, episode.values, episode.terminated, gamma, settings.lambda_)
            )
        return Estimate([a for a, _ in pairs], [t for _, t in pairs])
    if kind == "state_model":
        if table is None:
            raise ValueError("state_model needs its StateTable")
        advantages, seen = model_advantages(episodes, _digests_of(episodes, kind), table, gamma)
        return Estimate(advantages, None, anchor_steps=seen)
    returns = [returns_to_go(e.rewards, gamma) for e in episodes]
    if kind == "reinforce":
        return Estimate(returns, None)
    if kind == "state_table":
        if table is None:
            raise ValueError("state_table needs its StateTable")
        if settings.bootstrap_step_limit:  # from the table as it was before this batch
            returns = [
                bootstrapped(g, e, table, gamma) for g, e in zip(returns, episodes, strict=True)
            ]
        advantages, seen = table_advantages(returns, _digests_of(episodes, kind), table)
        return Estimate(advantages, None, anchor_steps=seen)
    # Episode level: the undiscounted return, against the episode's group.
    scores = np.array([float(np.sum(e.rewards)) for e in episodes], dtype=np.float64)
    groups = [e.group for e in episodes]
    relative, fallback = group_baselines(
        scores,
        groups,
        leave_one_out=kind == "rloo",
        scale=kind in ("grpo", "gigpo") and settings.scale_by_std,
    )
    advantages = [np.full(len(e.rewards), r) for e, r in zip(episodes, relative, strict=True)]
    if kind in ("rloo", "grpo"):
        return Estimate(advantages, None, fallback_episodes=fallback)
    # gigpo: plus the step advantage over anchor states.
    steps, anchored = anchor_step_advantages(returns, _digests_of(episodes, kind), groups)
    weight = settings.step_advantage_weight
    combined = [a + weight * s for a, s in zip(advantages, steps, strict=True)]
    return Estimate(combined, None, fallback_episodes=fallback, anchor_steps=anchored)


def standardise(advantages: np.ndarray) -> np.ndarray:
    """Mean 0, std 1 (the advantages of the rows that carry loss, and only those)."""
    if advantages.size == 0:
        return advantages
    return (advantages - advantages.mean()) / max(1e-4, float(advantages.std()))
