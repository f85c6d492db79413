"""Question: how often do ALFWorld's experts win, and does the observable one act on memory that
the policy's prompt drops?
Answer (see docs/environments.md, docs/results/alfworld-cpu.md): the observable expert wins
every game of every split, in 10.4-11.0 steps against the walkthrough's 6.0-6.4; from the
prompt's last 4 command/answer pairs it would choose the same command on 0.72-0.75 of its steps.
Results: diagnostics/results/alfworld_experts.json.

How often ALFWorld's experts win, per split and task type: the observable expert
(`data.expert: observable`, the SFT data's default: it searches from what the agent sees and the
training split's statistics) against the oracle (`data.expert: oracle`: the walkthrough, which
knows what closed receptacles hold).

Games come from `reflectrl alfworld-gen` (by default 100 games, seed 0: 60 train, 20
valid_seen, 20 valid_unseen, made in a temporary folder; `--data DIR` reuses a folder made
before). Each game is played once, greedily, to its end (`max_steps` 50, ALFWorld's budget).

`same_in_window`: the share of the observable expert's steps whose command is the same when it
sees only the last `history` (4) pairs the policy's prompt shows, not its whole episode: where
it is lower, the expert acts on memory that the prompt does not carry.

    python -m diagnostics.alfworld_experts [--data DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.common import print_table, write_results
from diagnostics.common import RESULTS
from reflectrl.data.alfworld import DEMONSTRATORS
from reflectrl.envs.alfworld.env import AlfWorldEnv, AlfWorldOptions
from reflectrl.envs.alfworld.explorer import Sight, explore
from reflectrl.envs.alfworld.generator import generate_games
from reflectrl.envs.alfworld.tasks import TASK_TYPES
from reflectrl.errors import ReflectRLError

SPLITS = ("train", "valid_seen", "valid_unseen")
MAX_STEPS = 50


@dataclass(frozen=True)
class Episode:
    expert: str
    split: str
    task_type: str
    game: str
    won: bool
    steps: int
    walkthrough: int  # the oracle's length, for scale
    stopped: str  # why the expert gave up early ("" when it played to the end)
    same_in_window: int  # steps whose command is the same from the prompt's last pairs only


def play(data: Path, expert: str, split: str) -> list[Episode]:
    demo = DEMONSTRATORS[expert]
    env = AlfWorldEnv(AlfWorldOptions(data_dir=str(data), split=split, max_steps=MAX_STEPS))
    episodes = []
    for i, game in enumerate(env.games):
        env.reset(seed=0, options={"game": i})
        done, won, steps, stopped, same = False, False, 0, "", 0
        while not done:
            try:
                action = demo.expert(env)
            except ReflectRLError as err:
                stopped = str(err)
                break
            if expert == "observable":
                window = env.history[-env.options.history :]
                sight = Sight.observe(env.task, env.description, window, env.menu)
                same += explore(sight, demo.prior(env)) == env.menu[action]
            _, _, terminated, truncated, info = env.step(action)
            steps += 1
            done, won = terminated or truncated, bool(info["success"])
        where = str(game.path.relative_to(data))
        length = game.walkthrough_length or 0
        episodes.append(
            Episode(expert, split, game.task_type, where, won, steps, length, stopped, same)
        )
    env.close()
    return episodes


def summary(episodes: list[Episode]) -> list[dict[str, object]]:
    groups: dict[tuple[str, str], list[Episode]] = defaultdict(list)
    for e in episodes:
        groups[e.expert, e.split].append(e)
    rows: list[dict[str, object]] = []
    for (expert, split), group in groups.items():
        row: dict[str, object] = {
            "expert": expert,
            "split": split,
            "games": len(group),
            "success": sum(e.won for e in group) / len(group),
            "mean_steps": sum(e.steps for e in group) / len(group),
        }
        if expert == "observable":
            steps = sum(e.steps for e in group)
            row["same_in_window"] = sum(e.same_in_window for e in group) / max(1, steps)
        for task_type in TASK_TYPES:
            of_type = [e for e in group if e.task_type == task_type]
            if of_type:
                wins = [e for e in of_type if e.won]
                mean = sum(e.steps for e in wins) / len(wins) if wins else float("nan")
                row[task_type] = f"{len(wins)}/{len(of_type)} ({mean:.1f})"
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, help="games from `reflectrl alfworld-gen`")
    parser.add_argument("--n", type=int, default=100, help="games to generate without --data")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    command = " ".join(["python -m diagnostics.alfworld_experts", *sys.argv[1:]])
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        data = args.data
        if data is None:
            data = Path(tmp) / "games"
            generate_games(data, args.n, args.seed, valid_seen=0.2, valid_unseen=0.2)
        episodes = [e for x in ("observable", "oracle") for s in SPLITS for e in play(data, x, s)]
    rows = summary(episodes)
    columns = list(dict.fromkeys(k for row in rows for k in row))
    print("per task type: wins/games (mean steps of the wins)")
    print_table(rows, columns)
    failures = [asdict(e) for e in episodes if not e.won]
    for f in failures:
        print(f"lost: {f['expert']} {f['game']} after {f['steps']} steps {f['stopped']}")
    payload = {
        "command": command,
        "games": f"reflectrl alfworld-gen --n {args.n} --seed {args.seed} --valid-seen 0.2 "
        "--valid-unseen 0.2"
        if args.data is None
        else str(args.data),
        "max_steps": MAX_STEPS,
        "rows": rows,
        "failures": failures,
        "wall_s": round(time.perf_counter() - started),
    }
    print(write_results("alfworld_experts", payload, folder=RESULTS))


if __name__ == "__main__":
    main()
