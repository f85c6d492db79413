"""Question: what does PPO need on DangerousTaxi without a language model, and does RL lift a
policy that limited data leaves short?
Answer (see docs/diagnostics.md, docs/results/paper-regime.md): a larger entropy bonus and a
`dropoff` stage: at 0.2 a state MLP solves 0.95, 0.95 and 0.82 of `full` at 300k env steps (0.00
at 0.01); cloned from 40 expert episodes, PPO lifts it from 0.23-0.43 to 0.52-0.93 in 61k env
steps.
Results: diagnostics/results/ppo_tabular*.json.

What PPO needs on DangerousTaxi, without a language model: a CleanRL-style PPO over a small
MLP, with the hyperparameters, batch, curriculum and rewards of `diagnostics.ppo_from_scratch`,
on the same env (its train starts; held-out greedy success over every test start once, stage
`full`). It tells the env and the PPO settings apart from the policy's reading of the text:
if this learns where the LM policy does not, the settings and the rewards are not the bound.

    python -m diagnostics.ppo_tabular [--seeds 0,1,2] [--variants paper_penalty,no_suicide]
        [--features state,text] [--env-steps 300000] [--set KEY=VALUE ...]
        [--sweep KEY=V1,V2,...] [--name NAME] [--bc-episodes N]

Inputs (`features`): `state`, a one-hot of gymnasium's state id (what a table would see);
`text`, a one-hot of every character of the observation text the LM policy reads (the same
information, laid out as characters). Both also get the stage as a one-hot.
`--bc-episodes N` first clones the expert (the limited-data regime's SFT): N expert episodes from
train starts, spread over the stages, for the number of steps (of 100-2000) that scores best
on the held-out test, the most favourable SFT there is; PPO then starts from that actor.
Writes diagnostics/results/ppo_tabular[_NAME].json.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from benchmarks.common import print_table, write_results
from diagnostics.common import RESULTS
from diagnostics.ppo_from_scratch import OVERRIDES, VARIANTS
from reflectrl.config import RECIPES_DIR, load_config
from reflectrl.envs.taxi import (
    ACTIONS,
    DangerousTaxiEnv,
    TaxiOptions,
    expert_action,
    render_text,
    start_states,
)

STAGES = DangerousTaxiEnv.stages
WORKERS = 2  # ppo_from_scratch launches 2 workers: the batch is workers x envs x fragment


@dataclass
class Setup:
    lr: float
    gamma: float
    lambda_: float
    clip: float
    vf_clip: float
    vf_coeff: float
    entropy: float
    epochs: int
    minibatch: int
    grad_clip: float
    envs: int
    fragment: int
    stages: list[tuple[str, float, int | None]]  # name, success threshold, max iterations
    options: dict


def setup(variant: str, extra: list[str]) -> Setup:
    config = load_config(RECIPES_DIR / "cpu.yaml", [*OVERRIDES, *VARIANTS[variant], *extra])
    p = config.ppo
    return Setup(
        lr=p.lr, gamma=p.gamma, lambda_=p.lambda_, clip=p.clip_param, vf_clip=p.vf_clip_param,
        vf_coeff=p.vf_loss_coeff, entropy=p.entropy_coeff, epochs=p.num_epochs,
        minibatch=p.minibatch_size, grad_clip=p.grad_clip,
        envs=WORKERS * config.env.envs_per_worker, fragment=p.rollout_fragment_length,
        stages=[(s.name, s.success_threshold, s.max_iterations) for s in config.curriculum.stages],
        options=dict(config.env.options),
    )  # fmt: skip


class Features:
    """Observation -> input vector (`state` or `text`), plus the stage."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        taxi = DangerousTaxiEnv().taxi
        texts = [render_text(*taxi.decode(s), locs=taxi.locs) for s in range(500)]
        self.index = {c: i for i, c in enumerate(sorted(set("".join(texts))))}
        self.width = max(map(len, texts))
        grid = self.width * len(self.index)
        self.size = (500 if kind == "state" else grid) + len(STAGES)

    def __call__(self, env: DangerousTaxiEnv, text: str, stage: str) -> np.ndarray:
        x = np.zeros(self.size, dtype=np.float32)
        if self.kind == "state":
            x[int(env.taxi.s)] = 1.0
        else:
            for pos, char in enumerate(text):
                x[pos * len(self.index) + self.index[char]] = 1.0
        x[len(x) - len(STAGES) + STAGES.index(stage)] = 1.0
        return x


def layer(n_in: int, n_out: int, std: float = 2**0.5) -> nn.Linear:
    linear = nn.Linear(n_in, n_out)
    nn.init.orthogonal_(linear.weight, std)
    nn.init.zeros_(linear.bias)
    return linear


class Agent(nn.Module):
    def __init__(self, n_in: int, n_actions: int) -> None:
        super().__init__()
        self.actor = nn.Sequential(layer(n_in, 64), nn.Tanh(), layer(64, 64), nn.Tanh(),
                                   layer(64, n_actions, 0.01))  # fmt: skip
        self.critic = nn.Sequential(layer(n_in, 64), nn.Tanh(), layer(64, 64), nn.Tanh(),
                                    layer(64, 1, 1.0))  # fmt: skip

    def dist(self, x: torch.Tensor) -> torch.distributions.Categorical:
        return torch.distributions.Categorical(logits=self.actor(x))

    def value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(x).squeeze(-1)


def evaluate(agent: Agent, features: Features, options: dict) -> float:
    """Greedy success on stage `full` over every test start once."""
    env = DangerousTaxiEnv(TaxiOptions(**{**options, "split": "test"}))
    env.set_stage("full")
    solved = 0
    starts = start_states("test", env.options.test_fraction, env.options.split_seed)
    for start in starts:
        obs, info = env.reset(seed=0, options={"start": start})
        done = False
        while not done:
            x = torch.as_tensor(features(env, obs.observation, "full"))
            with torch.no_grad():
                action = int(agent.actor(x).argmax())
            obs, _, terminated, truncated, info = env.step(action)
            done = terminated or truncated
        solved += bool(info["success"])
    return solved / len(starts)


def clone_expert(agent: Agent, features: Features, s: Setup, episodes: int, seed: int) -> dict:
    """Behaviour cloning of the actor on `episodes` expert episodes from train starts, spread
    over the stages as `reflectrl data` spreads them (the limited-data regime's SFT), for as
    many Adam steps (batch 32, lr 1e-3) as leave held-out success highest; the critic stays."""
    env = DangerousTaxiEnv(TaxiOptions(**{**s.options, "split": "train"}))
    names = [name for name, _, _ in s.stages]
    xs, labels = [], []
    for e in range(episodes):
        stage = names[e % len(names)]
        env.set_stage(stage)
        obs, _ = env.reset(seed=seed * 100_000 + e)
        done = False
        while not done:
            action = expert_action(env)
            xs.append(features(env, obs.observation, stage)), labels.append(action)
            obs, _, terminated, truncated, _ = env.step(action)
            done = terminated or truncated
    x, y = torch.as_tensor(np.stack(xs)), torch.as_tensor(labels)
    optimizer = torch.optim.Adam(agent.actor.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(seed)
    best = (evaluate(agent, features, s.options), 0, copy.deepcopy(agent.actor.state_dict()))
    for step in range(1, 2001):
        rows = torch.randint(len(x), (32,), generator=generator)
        loss = nn.functional.cross_entropy(agent.actor(x[rows]), y[rows])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 100 == 0 and (held_out := evaluate(agent, features, s.options)) > best[0]:
            best = (held_out, step, copy.deepcopy(agent.actor.state_dict()))
    agent.actor.load_state_dict(best[2])
    return {"bc_rows": len(labels), "bc_steps": best[1], "bc_greedy": best[0]}


def train(variant: str, kind: str, seed: int, env_steps: int, every: int, extra: list[str],
          bc_episodes: int = 0) -> dict:  # fmt: skip
    s = setup(variant, extra)
    torch.manual_seed(seed)
    envs = [DangerousTaxiEnv(TaxiOptions(**{**s.options, "split": "train"})) for _ in range(s.envs)]
    features = Features(kind)
    agent = Agent(features.size, len(ACTIONS))
    bc = clone_expert(agent, features, s, bc_episodes, seed) if bc_episodes else {}
    optimizer = torch.optim.Adam(agent.parameters(), lr=s.lr, eps=1e-5)
    stage_index, stage_iterations = 0, 0
    stage = s.stages[0][0]
    for env in envs:
        env.set_stage(stage)
    obs = [env.reset(seed=seed * 1000 + i)[0].observation for i, env in enumerate(envs)]
    x = np.stack([features(env, o, stage) for env, o in zip(envs, obs, strict=True)])
    curve = [{"env_steps": 0, "stage": stage, "greedy": evaluate(agent, features, s.options)}]
    switches, steps, iteration = [], 0, 0
    while steps < env_steps:
        xs, acts, logps, rews, dones, vals = [], [], [], [], [], []
        successes = []
        for _ in range(s.fragment):
            xt = torch.as_tensor(x)
            with torch.no_grad():
                d = agent.dist(xt)
                a = d.sample()
                v = agent.value(xt)
            xs.append(xt), acts.append(a), logps.append(d.log_prob(a)), vals.append(v)
            r, done, nxt = np.zeros(s.envs, np.float32), np.zeros(s.envs, np.float32), []
            for i, env in enumerate(envs):
                o, reward, terminated, truncated, info = env.step(int(a[i]))
                r[i] = reward
                if truncated and not terminated:  # the step limit: bootstrap its last state
                    with torch.no_grad():
                        last = torch.as_tensor(features(env, o.observation, stage))
                        r[i] += s.gamma * float(agent.value(last))
                if terminated or truncated:
                    successes.append(bool(info["success"]))
                    done[i] = 1.0
                    o, _ = env.reset()
                nxt.append(features(env, o.observation, stage))
            rews.append(torch.as_tensor(r)), dones.append(torch.as_tensor(done))
            x = np.stack(nxt)
        steps += s.envs * s.fragment
        iteration += 1
        with torch.no_grad():
            next_value = agent.value(torch.as_tensor(x))
        advantages = torch.zeros(s.fragment, s.envs)
        gae = torch.zeros(s.envs)
        for t in reversed(range(s.fragment)):
            nv = next_value if t == s.fragment - 1 else vals[t + 1]
            keep = 1.0 - dones[t]
            delta = rews[t] + s.gamma * nv * keep - vals[t]
            gae = delta + s.gamma * s.lambda_ * keep * gae
            advantages[t] = gae
        returns = (advantages + torch.stack(vals)).flatten()
        adv = advantages.flatten()
        adv = (adv - adv.mean()) / max(1e-4, float(adv.std()))  # RLlib's GAE connector does this
        bx, ba, blp = torch.cat(xs), torch.cat(acts), torch.cat(logps)
        for _ in range(s.epochs):
            for mb in torch.randperm(len(bx)).split(s.minibatch):
                d = agent.dist(bx[mb])
                ratio = (d.log_prob(ba[mb]) - blp[mb]).exp()
                surrogate = torch.min(ratio * adv[mb],
                                      ratio.clamp(1 - s.clip, 1 + s.clip) * adv[mb])  # fmt: skip
                vf = ((agent.value(bx[mb]) - returns[mb]) ** 2).clamp(max=s.vf_clip)
                loss = -surrogate.mean() + s.vf_coeff * vf.mean() - s.entropy * d.entropy().mean()
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), s.grad_clip)
                optimizer.step()
        # The curriculum: the bar or the stage's iteration cap, as the coordinator does, but over
        # this iteration's episodes (the coordinator: the last curriculum.window of them).
        stage_iterations += 1
        name, threshold, cap = s.stages[stage_index]
        rate = float(np.mean(successes)) if successes else 0.0
        last_stage = stage_index == len(s.stages) - 1
        if not last_stage and (rate >= threshold or (cap is not None and stage_iterations >= cap)):
            stage_index, stage_iterations = stage_index + 1, 0
            stage = s.stages[stage_index][0]
            switches.append({"env_steps": steps, "to": stage})
            for env in envs:
                env.set_stage(stage)  # takes effect at each env's next reset
        if iteration % every == 0 or steps >= env_steps:
            curve.append({"env_steps": steps, "stage": name, "train_success": rate,
                          "greedy": evaluate(agent, features, s.options)})  # fmt: skip
            print(f"  {variant} {kind} seed {seed}: {steps} env steps, {name}, training success "
                  f"{rate:.2f}, held-out greedy {curve[-1]['greedy']:.3f}", flush=True)  # fmt: skip
    first = next((p["env_steps"] for p in curve if p["greedy"] >= 0.9), None)
    return {"variant": variant, "features": kind, "seed": seed, "curve": curve, **bc,
            "stage_switches": switches, "final_greedy": curve[-1]["greedy"],
            "best_greedy": max(p["greedy"] for p in curve), "env_steps_to_0.9": first}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--variants", default="paper_penalty,no_suicide")
    parser.add_argument("--features", default="state,text")
    parser.add_argument("--env-steps", type=int, default=300_000)
    parser.add_argument("--every", type=int, default=10, help="held-out eval every N iterations")
    parser.add_argument("--set", action="append", default=[], help="extra config overrides")
    parser.add_argument("--sweep", default="", help="KEY=V1,V2,...: one run per value")
    parser.add_argument("--name", default="", help="results file: ppo_tabular[_NAME].json")
    parser.add_argument(
        "--bc-episodes",
        type=int,
        default=0,
        help="first clone the expert on this many episodes (limited data)",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    started = time.perf_counter()
    key, _, values = args.sweep.partition("=")
    sweep = [[f"{key}={v}"] for v in values.split(",")] if args.sweep else [[]]
    runs = []
    for variant in args.variants.split(","):
        for kind in args.features.split(","):
            for extra in sweep:
                for seed in map(int, args.seeds.split(",")):
                    run = train(variant, kind, seed, args.env_steps, args.every,
                                [*args.set, *extra], args.bc_episodes)  # fmt: skip
                    runs.append({"swept": extra[0] if extra else "", **run})
                    print(f"{variant} {kind} {' '.join(extra)} seed {seed}: final "
                          f"{run['final_greedy']:.3f}, 0.9 at {run['env_steps_to_0.9']}",
                          flush=True)  # fmt: skip
    columns = ["variant", "features", "swept", "seed", "bc_greedy", "final_greedy",
               "best_greedy", "env_steps_to_0.9"]  # fmt: skip
    rows = [{k: r.get(k) for k in columns} for r in runs]
    print_table(rows, columns)
    command = "python -m diagnostics.ppo_tabular " + " ".join(sys.argv[1:])
    payload = {"command": command, "settings": [*OVERRIDES, *args.set], "variants": VARIANTS,
               "rows": rows, "runs": runs,
               "wall_s": round(time.perf_counter() - started)}  # fmt: skip
    print(
        write_results("_".join(filter(None, ["ppo_tabular", args.name])), payload, folder=RESULTS)
    )


if __name__ == "__main__":
    main()
