"""Question: how often does a uniformly random policy succeed on DangerousTaxi?
Answer (see docs/diagnostics.md): rarely: from 1.06% of the train starts of `pickup` within 30
steps (about 5.8 successes per iteration of 1,024 env steps), and with probability 6.1e-7 on
`full`.
Results: diagnostics/results/random_exploration.json.

Exact, by dynamic programming over gymnasium's transition table (no sampling).

PPO from reward alone starts from a near-uniform policy over the 6 actions, so this is the
reward signal its first iterations see. In DangerousTaxi a wall bump or an illegal pick-up /
drop-off ends the episode; the `gymnasium` rows keep gymnasium's own rule (such a no-op costs
a step and the episode goes on), the game CleanRL-style PPO learns Taxi on.

For each stage and rule: the mean over the train start states of the success probability
within `max_steps` and of the expected episode length, and the successes an iteration of
1024 env steps holds on average (1024 x success / length).

    python -m diagnostics.random_exploration [--max-steps 30]
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from benchmarks.common import print_table, write_results
from diagnostics.common import RESULTS

STEPS_PER_ITERATION = 1024  # the CPU recipe's batch: 2 workers x 16 envs x 32 steps


def random_policy_odds(stage: str, dangerous: bool, max_steps: int) -> dict[str, Any]:
    import numpy as np

    from reflectrl.envs.taxi import ACTIONS, DangerousTaxiEnv, _goal_kind, _is_goal, start_states

    taxi = DangerousTaxiEnv().taxi
    goal = _goal_kind(stage)
    n_states, n_actions = len(taxi.P), len(ACTIONS)
    # next state, "success now", "ends now" for every (state, action)
    nxt = np.zeros((n_states, n_actions), dtype=np.int64)
    wins = np.zeros((n_states, n_actions))
    ends = np.zeros((n_states, n_actions), dtype=bool)
    for state, by_action in taxi.P.items():
        for action, ((_, next_state, _, _),) in by_action.items():
            nxt[state, action] = next_state
            win = _is_goal(taxi, state, action, goal)  # the env's own success rule
            wins[state, action] = win
            ends[state, action] = win or (dangerous and next_state == state)
    success = np.zeros(n_states)  # with t steps left: P(success), E[steps taken]
    length = np.zeros(n_states)
    for _ in range(max_steps):
        go_on = ~ends
        success = (wins + go_on * success[nxt]).mean(axis=1)
        length = (1 + go_on * length[nxt]).mean(axis=1)
    starts = list(start_states("train", 0.2, 0))
    p, steps = float(success[starts].mean()), float(length[starts].mean())
    return {
        "stage": stage,
        "rule": "dangerous" if dangerous else "gymnasium",
        "max_steps": max_steps,
        "success": p,
        "episode_length": steps,
        "successes_per_iteration": STEPS_PER_ITERATION * p / steps,
        "starts": len(starts),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-steps", type=int, default=30, help="the episode's step limit")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    rows = [
        random_policy_odds(stage, dangerous, args.max_steps)
        for stage in ("pickup", "full")
        for dangerous in (True, False)
    ]
    columns = ["stage", "rule", "success", "episode_length", "successes_per_iteration"]
    print_table(rows, columns)
    command = "python -m diagnostics.random_exploration " + " ".join(sys.argv[1:])
    path = write_results(
        "random_exploration",
        {"command": command.strip(), "rows": rows, "wall_s": round(time.perf_counter() - t0)},
        folder=RESULTS,
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
