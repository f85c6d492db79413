"""Question: can PPO move the limited-data SFT policy on DangerousTaxi when the advantage is
right?
Answer (see docs/rl.md): not the policy that copies the hint: with oracle advantages its LoRA
changes no greedy action in 20k env steps; a policy that reads the grid moves (+0.128 with its
LoRA, +0.139 with every weight). Its own advantage, even exact, does not move it there under the
paper's reward: for that policy a move into danger is the best action in 27-56% of the states
(`--advantage exact`); with the exit priced out (`--danger-penalty -100`) it does (+0.194 in
20k env steps), and the state table (`mc_table`) gets there in 61k. Neither a table over
(prompt, action) (`q_table`) nor one-step TD over the state table (`td_table --lam 0`) does
better: 0.444 and 0.456 at 20k, and `td_table` 0.539 at 31k but 0.528 at 61k; nor does the
state table bootstrapped at the step limit (`mc_table_bootstrap`): 0.422 at 20k. The
model-based table (`td_model`) gets 0.472 at 20k and 0.561 at 61k (the exact advantage 0.544
and 0.594), the same evaluated for the current policy (`q_model`) 0.467 at 20k; in the pipeline
it is `rl.advantage=state_model`.
Results: diagnostics/results/oracle_advantages_*.json, exit_preference_*.json.

What binds RL in the paper's regime (experiments/taxi_limited_data.yaml): the actor itself, the
advantage (the LM critic cannot tell states apart), or what RL trains. In one process, without
Ray, this loads a run's SFT players (`diagnostics.failure_modes.load_players`), samples episodes
from train starts (stage drawn uniformly per episode from `--stages`, `--envs` envs in lockstep,
actions from the policy's softmax at `--temperature`) and runs PPO on the label log-probs of
that same tempered distribution (clip 0.2, Adam, grad clip 1.0, exactly 1024 env steps per
iteration; a batch holds the episodes that ended, one still running goes on into the next
batch, so no return is cut). A prompt is a function of (instruction, taxi state) and the frozen
reflection model is greedy, so every prompt (about 700) is built once, its reflection generated
once (cut at the server's stop strings; `--reflection-cache` keeps them for the next run), and
the policy scores all of them once per iteration: rollouts sample from that table, evaluation
takes its argmax (what one forward per step gives, without replaying the LM). Advantages
(`--advantage`), standardised over the batch unless `--no-normalise`:
  - `oracle`: from Taxi's shortest-path distances d(s) (actions to success in the stage):
    A(s, a) = d(s) - 1 - d(s') for a move (0 on a shortest path, -2 for a step away), floored
    at -3; the action that completes the stage: 0; a dangerous no-op (s' = s): -3.
    A = 0 exactly when the action is on a shortest path.
  - `mc_table`: return-to-go G (gamma `--gamma`, no bootstrap at the step limit) minus a state
    table V(stage, taxi state), the running mean of G over every visit so far, this batch's
    included (a critic that tells every state apart; a state seen once gets A = 0).
  - `mc_batch`: G minus the batch mean of G (a crude baseline).
  - `q_table`: a table critic over (prompt, action): Q(s, a) the running mean of G over every
    visit of that pair so far, this batch's included, and A = Q(s, a) - sum over the actions
    tried at s of pi(a'|s) Q(s, a') (pi renormalised over them): the policy's own advantage
    estimated from every visit, not from this step's return alone.
  - `mc_table_bootstrap`: `mc_table`, but the return of an episode the step limit cut goes on
    from its last state's table value (gamma^(T-t) V(s_T)): the step limit is not in the
    observation, and without it wandering to the limit looks cheap.
  - `td_model`: a model-based table critic: every transition seen so far between taxi states
    (how often each next state or ending followed, and the rewards), V the policy evaluation of
    that empirical model to convergence, a cut episode going on from where it stopped, and
    A_t = r_t + gamma V(s_{t+1}) - V(s_t). Learned from the rollouts alone, without the step
    limit, like `exact`.
  - `q_model`: the same model per (state, action), evaluated for the current policy
    (renormalised over the actions tried at each state), and A = Q(s, a) - V(s): `exact`'s
    advantage on the part of the env the rollouts have seen, without past policies' weights.
  - `td_table`: GAE over the `mc_table` state table: delta_t = r_t + gamma V(s_{t+1}) - V(s_t)
    (V = 0 after the last step, as G takes no bootstrap at the step limit), A_t = sum_k
    (gamma lambda)^k delta_{t+k} with lambda `--lam` (0: one step; 1: `mc_table`). A move
    answers for its own outcome, not for a danger ten steps later.
  - `exact`: A of the current policy, without noise: Q(s, a) - V(s) from Taxi's known
    transitions, V evaluated for the tempered policy of this iteration's table (discounted by
    `--gamma`, the step limit ignored). The oracle's A is the optimal policy's; this is what a
    perfect critic and infinitely many rollouts would give the policy gradient.
What trains (`--trainable`): `lora_qv8` (the run's RL LoRA, r 8 alpha 16 on q,v), `lora_all32`
(r 32 alpha 32 on every linear layer), `full` (every LM weight: the SFT was full fine-tuning,
so the base weights are the SFT policy). Before RL, every `--every` iterations and at the end,
every held-out (test) start is played once per stage, greedily: success per stage (and over
every train start, `train_greedy`), the share of episodes ending in danger, and how many of
the states the SFT policy's greedy held-out episodes visit now get another argmax action
(right->wrong, wrong->right: on a shortest path before/after; danger->move), plus, at those
of them where the SFT argmax is wrong, the probability now on shortest-path actions and the
logit gap still to close.

Each evaluation also reports, per stage, the share of states where the exact advantage of the
policy under the rollouts' reward ranks a move into danger first (`exit_preferred_*`);
`--env-steps 0` writes only the figures before RL.

    python -m diagnostics.oracle_advantages --run RUN --advantage oracle --trainable lora_qv8 \
        [--env-steps 20000] [--temperature T] [--entropy-coeff C] [--danger-penalty P] \
        [--name NAME]

Writes diagnostics/results/NAME.json (default oracle_advantages_ADVANTAGE_TRAINABLE).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.common import print_table, write_results
from diagnostics.common import RESULTS
from diagnostics.failure_modes import Players, load_players
from diagnostics.taxi_prompts import DANGER_ADVANTAGE, Prompts, logits_of
from diagnostics.taxi_rollouts import TableCritics, TaxiRollouts
from reflectrl.envs.taxi import IN_TAXI, PICKUP, DangerousTaxiEnv, TaxiOptions

ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
STAGES = ("pickup", "dropoff", "full")
ADVANTAGES = ["oracle", "mc_table", "mc_table_bootstrap", "mc_batch", "exact", "q_table"]
ADVANTAGES += ["td_table", "td_model", "q_model"]


def build_policy(players: Players, trainable: str) -> tuple[Any, list[torch.nn.Parameter]]:
    from reflectrl.data.scratch import resolve_or_build
    from reflectrl.models.policy import OptionPolicy

    policy = players.policy  # the run's own LoRA: r 8, alpha 16 on q_proj, v_proj
    if trainable == "lora_all32":
        config = players.config
        model_dir = resolve_or_build(config.policy.model)
        labels = players.renderer.label_ids
        policy = OptionPolicy(model_dir, labels, 32, 32, ALL_LINEAR, seed=config.run.seed)
    if trainable == "full":  # every base weight; the LoRA (B = 0) stays out and stays zero
        for name, param in policy.lm.named_parameters():
            param.requires_grad_("lora_" not in name)
    params = [p for p in policy.lm.parameters() if p.requires_grad]
    return policy.eval(), params


def evaluate(
    prompts: Prompts, greedy: list[int], options: TaxiOptions, seed: int
) -> tuple[dict[str, Any], set[int]]:
    """Every test start once per stage, the argmax label of each prompt (`greedy`): success per
    stage and overall, the share ending in danger; and the prompts the episodes showed."""
    result: dict[str, Any] = {}
    visited: set[int] = set()
    wins = dangers = episodes = 0
    for s, stage in enumerate(STAGES):
        env = DangerousTaxiEnv(options)
        env.set_stage(stage)
        starts = env.start_ids(stage) or []
        success = 0
        for k, start in enumerate(starts):
            env.reset(seed=seed * 100_000 + s * 1000 + k, options={"start": start})
            while True:
                i = prompts.of(env)
                visited.add(i)
                _, _, terminated, truncated, info = env.step(greedy[i])
                if terminated or truncated:
                    break
            success += info["success"]
            dangers += info["danger"]
        result[f"success_{stage}"] = round(success / len(starts), 3)
        wins, episodes = wins + success, episodes + len(starts)
    result["success_all"] = round(wins / episodes, 3)
    result["danger"] = round(dangers / episodes, 3)
    return result, visited


def changed_actions(prompts: Prompts, before: list[int], now: list[int], states: set[int]):
    """Of `states`: how many have another argmax now; of those, how many went from a shortest
    path to off it (right_to_wrong) and back (wrong_to_right), from a dangerous no-op to a move
    (danger_to_move); how many are off a shortest path now (wrong)."""
    counts = dict.fromkeys(["changed", "right_to_wrong", "wrong_to_right", "danger_to_move"], 0)
    counts["wrong"] = 0
    for i in states:
        a, b = prompts.oracle[i][before[i]], prompts.oracle[i][now[i]]
        counts["wrong"] += b != 0
        if now[i] != before[i]:
            counts["changed"] += 1
            counts["right_to_wrong"] += a == 0 and b != 0
            counts["wrong_to_right"] += b == 0 and a != 0
            counts["danger_to_move"] += a == DANGER_ADVANTAGE and b != DANGER_ADVANTAGE
    return counts


def movement(prompts: Prompts, logits: torch.Tensor, states: list[int]) -> dict[str, float]:
    """At `states` (held-out states where the SFT argmax is off a shortest path): the mean
    probability on shortest-path actions, and the mean logit gap of the best wrong action over
    the best right one (> 0: the argmax is still wrong)."""
    if not states:
        return {"p_right_at_wrong": 0.0, "gap_at_wrong": 0.0}
    right = torch.tensor([[a == 0 for a in prompts.oracle[i]] for i in states])
    rows = logits[states]
    p_right = (torch.softmax(rows, -1) * right).sum(-1).mean()
    gap = rows.masked_fill(right, -1e9).amax(-1) - rows.masked_fill(~right, -1e9).amax(-1)
    return {
        "p_right_at_wrong": round(float(p_right), 4),
        "gap_at_wrong": round(float(gap.mean()), 3),
    }


def stage_models(
    prompts: Prompts, probs: np.ndarray, options: TaxiOptions
) -> dict[str, tuple[np.ndarray, ...]]:
    """Per stage, the policy and Taxi's deterministic table under the env's own step rules:
    (pi [500 states, actions], next state, reward, alive [500, actions]). A stage never changes
    within an episode."""
    taxi = DangerousTaxiEnv(options).taxi
    scale, actions = options.reward_scale, probs.shape[1]
    out = {}
    for stage in STAGES:
        shown = [prompts.index.get((stage == "pickup", s), -1) for s in range(500)]
        pi = np.array([probs[i] if i >= 0 else np.zeros(actions) for i in shown])
        nxt = np.zeros((500, actions), dtype=int)
        reward, alive = np.zeros((500, actions)), np.zeros((500, actions))
        for s in range(500):
            for a in range(actions):
                ((_, s2, r, delivered),) = taxi.P[s][a]
                if s2 == s:  # a dangerous no-op ends the episode
                    r, done = options.danger_penalty, True
                elif stage == "pickup" and a == PICKUP and list(taxi.decode(s2))[2] == IN_TAXI:
                    r, done = options.pickup_bonus, True
                else:
                    done = bool(delivered)
                nxt[s, a], reward[s, a], alive[s, a] = s2, r * scale, not done
        out[stage] = (pi, nxt, reward, alive)
    return out


def exact_advantages(
    prompts: Prompts, probs: np.ndarray, options: TaxiOptions, gamma: float
) -> dict[str, np.ndarray]:
    """A^pi[stage] ([500 states, 6 actions]) of the policy whose action probabilities at each
    prompt are `probs`, by policy evaluation to convergence (the step limit ignored)."""
    out = {}
    for stage, (pi, nxt, reward, alive) in stage_models(prompts, probs, options).items():
        value = np.zeros(500)
        for _ in range(2000):
            q = reward + gamma * alive * value[nxt]
            new = (pi * q).sum(1)
            if np.abs(new - value).max() < 1e-9:
                break
            value = new
        out[stage] = reward + gamma * alive * value[nxt] - value[:, None]
    return out


def step_limit_advantages(
    prompts: Prompts, probs: np.ndarray, options: TaxiOptions, gamma: float
) -> dict[str, np.ndarray]:
    """A^pi[stage][k] ([max_steps + 1, 500, 6]) with k steps left before the step limit
    (`max_steps`) truncates the episode: what the returns of truncated episodes estimate."""
    out = {}
    for stage, (pi, nxt, reward, alive) in stage_models(prompts, probs, options).items():
        adv = np.zeros((options.max_steps + 1, 500, probs.shape[1]))
        value = np.zeros(500)  # k - 1 steps left
        for k in range(1, options.max_steps + 1):
            q = reward + gamma * alive * value[nxt]
            new = (pi * q).sum(1)
            adv[k] = q - new[:, None]
            value = new
        out[stage] = adv
    return out


def exit_preferred(
    prompts: Prompts, logits: torch.Tensor, options: TaxiOptions, gamma: float, temperature: float
) -> dict[str, float]:
    """Per stage, the share of the states a stage can show where the exact advantage of the
    policy (`exact_advantages`, the rollouts' reward) ranks a move into danger first: where,
    for this policy, ending the episode at once is worth more than playing on."""
    probs = torch.softmax(logits / temperature, -1).numpy()
    table = exact_advantages(prompts, probs, options, gamma)
    taxi = DangerousTaxiEnv(options).taxi
    out = {}
    for stage in STAGES:
        shown = [
            (s, i) for (pickup, s), i in prompts.index.items() if pickup == (stage == "pickup")
        ]
        if stage == "dropoff":  # the passenger is aboard from the start
            shown = [(s, i) for s, i in shown if list(taxi.decode(s))[2] == IN_TAXI]
        exits = sum(
            prompts.oracle[i][int(table[stage][s].argmax())] == DANGER_ADVANTAGE for s, i in shown
        )
        out[f"exit_preferred_{stage}"] = round(exits / len(shown), 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--run", type=Path, required=True)
    parser.add_argument(
        "--advantage",
        choices=ADVANTAGES,
        default="oracle",
    )
    parser.add_argument(
        "--trainable", choices=["lora_qv8", "lora_all32", "full"], default="lora_qv8"
    )
    numbers = [("--env-steps", int, 20_000), ("--steps-per-iteration", int, 1024),
               ("--envs", int, 32), ("--temperature", float, 1.0), ("--entropy-coeff", float, 0.0),
               ("--lr", float, 1e-3), ("--epochs", int, 2), ("--minibatch", int, 256),
               ("--clip", float, 0.2), ("--gamma", float, 0.99), ("--lam", float, 0.0),
               ("--seed", int, 0)]  # fmt: skip
    for flag, kind, default in numbers:
        parser.add_argument(flag, type=kind, default=default)
    parser.add_argument("--stages", default="pickup,dropoff,full")
    parser.add_argument("--no-normalise", action="store_true")
    parser.add_argument(
        "--danger-penalty",
        type=float,
        help="the rollouts' reward for ending in danger, in place of the run's (unscaled, as "
        "env.options.danger_penalty); held-out success does not depend on it",
    )
    parser.add_argument("--every", type=int, default=5, help="held-out eval every N iterations")
    parser.add_argument(
        "--reflection-cache", type=Path, help="a JSON file of the run's reflections to reuse"
    )
    parser.add_argument("--name")
    args = parser.parse_args()
    name = args.name or f"oracle_advantages_{args.advantage}_{args.trainable}"
    started = time.perf_counter()
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    players = load_players(args.run, after_rl=False)
    options = dict(players.config.env.options)
    prompts = Prompts(players, TaxiOptions(**options), args.reflection_cache)
    if args.danger_penalty is not None:  # after the prompts: reflections read no reward
        options["danger_penalty"] = args.danger_penalty
    test_options = TaxiOptions(**{**options, "split": "test"})
    train_options = TaxiOptions(**{**options, "split": "train"})
    rollout_options = TaxiOptions(**options)
    print(f"{len(prompts.rows)} prompts, {prompts.generated} reflections generated", flush=True)
    policy, params = build_policy(players, args.trainable)
    n_params = sum(p.numel() for p in params)
    print(f"{args.trainable}: {n_params:,} trainable parameters", flush=True)
    optimizer = torch.optim.Adam(params, lr=args.lr)

    # The policy is a function of the prompt: score every prompt once per iteration (rollouts
    # sample from this table, evaluation takes its argmax).
    with torch.no_grad():
        logits = logits_of(policy, prompts.rows)
    sft_greedy = logits.argmax(-1).tolist()
    before, reference = evaluate(prompts, sft_greedy, test_options, args.seed)
    unchanged = changed_actions(prompts, sft_greedy, sft_greedy, reference)
    wrong_states = sorted(i for i in reference if prompts.oracle[i][sft_greedy[i]] != 0)
    exits = exit_preferred(prompts, logits, rollout_options, args.gamma, args.temperature)
    on_train = evaluate(prompts, sft_greedy, train_options, args.seed)[0]["success_all"]
    heldout = [{"iteration": 0, "env_steps": 0, **before, "train_greedy": on_train, **unchanged,
                "states": len(reference), **movement(prompts, logits, wrong_states),
                **exits}]  # fmt: skip
    print(heldout[-1], flush=True)

    curve: list[dict[str, Any]] = []

    def save(greedy: list[int], finished: bool) -> Path:
        everywhere = changed_actions(prompts, sft_greedy, greedy, set(range(len(greedy))))
        settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        results = {
            "command": "python -m diagnostics.oracle_advantages " + " ".join(sys.argv[1:]),
            "settings": settings, "trainable_params": n_params, "prompts": len(prompts.rows),
            "finished": finished, "changed_all_prompts": everywhere, "heldout": heldout,
            "train": curve, "wall_s": round(time.perf_counter() - started),
        }  # fmt: skip
        return write_results(name, results, folder=RESULTS)

    rollouts = TaxiRollouts(
        prompts, TaxiOptions(**{**options, "split": "train"}), args.stages.split(","),
        args.envs, args.seed, rng, args.gamma,
    )  # fmt: skip
    generator = torch.Generator().manual_seed(args.seed)
    critics = TableCritics(*logits.shape)
    iterations = -(-args.env_steps // args.steps_per_iteration)
    env_steps = 0
    for iteration in range(1, iterations + 1):
        logp_table = torch.log_softmax(logits / args.temperature, -1)
        entropy_table = -(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum(-1)
        steps, episodes, shown = rollouts.batch(logp_table, args.steps_per_iteration, generator)
        entropies = entropy_table[shown].tolist()
        env_steps += len(shown)
        if args.advantage == "oracle":
            adv = np.array([s["oracle"] for s in steps])
        elif args.advantage == "exact":
            table = exact_advantages(prompts, logp_table.exp().numpy(), rollout_options, args.gamma)
            adv = np.array([table[s["stage"]][s["state"], s["action"]] for s in steps])
        else:
            probs = logp_table.exp().numpy()
            adv = critics.advantages(args.advantage, steps, probs, args.gamma, args.lam)
        mean_abs_adv = float(np.abs(adv).mean())
        if not args.no_normalise:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)

        # PPO update on the tempered distribution the actions were sampled from.
        policy.train()
        advantages = torch.tensor(adv, dtype=torch.float32)
        old_logp = torch.tensor([s["logp"] for s in steps])
        actions_t = torch.tensor([s["action"] for s in steps])
        clipped = 0.0
        for _ in range(args.epochs):
            order = rng.permutation(len(steps))
            for start in range(0, len(steps), args.minibatch):
                idx = order[start : start + args.minibatch]
                rows = [prompts.rows[steps[k]["row"]] for k in idx]
                logp_all = torch.log_softmax(
                    logits_of(policy, rows, chunk=args.minibatch) / args.temperature, -1
                )
                logp = logp_all.gather(1, actions_t[idx, None]).squeeze(1)
                ratio = torch.exp(logp - old_logp[idx])
                a = advantages[idx]
                surrogate = torch.min(ratio * a, ratio.clamp(1 - args.clip, 1 + args.clip) * a)
                entropy = -(logp_all.exp() * logp_all).sum(-1).mean()
                loss = -surrogate.mean() - args.entropy_coeff * entropy
                optimizer.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                optimizer.step()
                clipped += float(((ratio - 1).abs() > args.clip).float().mean()) * len(idx)
        policy.eval()
        with torch.no_grad():
            logits = logits_of(policy, prompts.rows)
        row = {
            "iteration": iteration, "env_steps": env_steps, "episodes": len(episodes),
            "train_success": round(float(np.mean([e["success"] for e in episodes])), 3),
            "train_return": round(float(np.mean([e["return"] for e in episodes])), 3),
            "train_danger": round(float(np.mean([e["danger"] for e in episodes])), 3),
            "entropy": round(float(np.mean(entropies)), 4),
            "mean_abs_adv": round(mean_abs_adv, 4),
            "clip_fraction": round(clipped / (args.epochs * len(steps)), 4),
            "changed_all_prompts": int((logits.argmax(-1) != torch.tensor(sft_greedy)).sum()),
            "wall_s": round(time.perf_counter() - started),
        }  # fmt: skip
        curve.append(row)
        print(row, flush=True)
        if iteration % args.every == 0 or iteration == iterations:
            greedy = logits.argmax(-1).tolist()
            result, _ = evaluate(prompts, greedy, test_options, args.seed)
            result["train_greedy"] = evaluate(prompts, greedy, train_options, args.seed)[0][
                "success_all"
            ]
            changes = changed_actions(prompts, sft_greedy, greedy, reference)
            heldout.append({"iteration": iteration, "env_steps": env_steps, **result, **changes,
                            "states": len(reference),
                            **movement(prompts, logits, wrong_states),
                            **exit_preferred(prompts, logits, rollout_options, args.gamma,
                                             args.temperature)})  # fmt: skip
            print(heldout[-1], flush=True)
            path = save(greedy, finished=iteration == iterations)  # a cut run keeps its curve

    if iterations == 0:  # --env-steps 0: the figures before RL only
        path = save(sft_greedy, finished=True)
    columns = ["iteration", "env_steps", "success_pickup", "success_dropoff", "success_full",
               "success_all", "train_greedy", "danger", "changed", "right_to_wrong",
               "wrong_to_right", "danger_to_move", "wrong", "states", "p_right_at_wrong",
               "gap_at_wrong"]  # fmt: skip
    print_table(heldout, columns)
    print(path)


if __name__ == "__main__":
    main()
