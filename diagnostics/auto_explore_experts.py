"""Question: how often do AutoExplore's experts solve the tasks, and what does the observable
expert's view cost it?
Answer (see docs/environments.md): the oracle solves every task, in 3.5 steps on average; the
observable expert solves 0.83 of the 281 training tasks in the training view and 0.48 with every
entry shown, 0.76 and 0.52 of the 67 held-out ones.
Results: diagnostics/results/auto_explore_experts.json.

How often AutoExplore's experts solve the tasks, per split, depth and view: the observable
expert (`data.expert: observable`, the SFT data's default: it explores from what the agent
sees) against the oracle (`data.expert: oracle`: the shortest route to the target it knows).

Tasks come from the installed packages' trees (the recipe's roots, seed 0). Views: `drop 0.5`
hides off-path entries as training does (the paper's p), `drop 0` shows every entry as the
held-out evaluation does. Each task is played once, to its end (`max_steps` 20).

    python -m diagnostics.auto_explore_experts
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from benchmarks.common import print_table, write_results
from diagnostics.common import RESULTS
from reflectrl.data.auto_explore import DEMONSTRATORS
from reflectrl.envs.auto_explore.env import AutoExploreEnv, AutoExploreOptions
from reflectrl.envs.auto_explore.tasks import DEFAULT_ROOTS, generate_tasks, write_tasks


def solve_rates(tasks: Path, expert: str, split: str, drop: float) -> dict[str, object]:
    demo = DEMONSTRATORS[expert]
    env = AutoExploreEnv(AutoExploreOptions(tasks=str(tasks), split=split, drop_prob=drop))
    solved: dict[int, list[bool]] = defaultdict(list)
    steps = 0
    for task in env.tasks:
        env.reset(seed=0, options={"task_id": task.id})
        done = False
        while not done:
            _, _, terminated, truncated, info = env.step(demo.expert(env))
            steps += 1
            done = terminated or truncated
        solved[task.depth].append(bool(info["success"]))
    every = [s for by_depth in solved.values() for s in by_depth]
    row: dict[str, object] = {"expert": expert, "split": split, "drop_prob": drop,
                              "tasks": len(every), "solved": sum(every) / len(every),
                              "steps_per_task": steps / len(every)}  # fmt: skip
    for depth in sorted(solved):
        row[f"depth{depth}"] = f"{sum(solved[depth])}/{len(solved[depth])}"
    return row


def main() -> None:
    argparse.ArgumentParser(description=__doc__).parse_args()  # no options: --help only
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        tasks = Path(tmp) / "tasks.jsonl"
        write_tasks(generate_tasks(DEFAULT_ROOTS, seed=0), tasks)
        rows = [
            solve_rates(tasks, expert, split, drop)
            for expert in ("observable", "oracle")
            for split in ("train", "test")
            for drop in (0.5, 0.0)
        ]
    columns = list(dict.fromkeys(k for row in rows for k in row))
    print_table(rows, columns)
    command = "python -m diagnostics.auto_explore_experts " + " ".join(sys.argv[1:])
    payload = {"command": command.strip(), "roots": list(DEFAULT_ROOTS), "rows": rows,
               "wall_s": round(time.perf_counter() - started)}  # fmt: skip
    print(write_results("auto_explore_experts", payload, folder=RESULTS))


if __name__ == "__main__":
    main()
