"""ALFWorld speed and memory: game generation, env reset and step times per task type, and the
memory of one env process.

Games are generated into a temporary folder (each verified through the engine, as always).
Per game: one timed reset, the walkthrough played by the expert, then another reset and a few
seeded uniform-random menu commands (the states rollouts visit). Memory is read from
/proc/self/status in a fresh process that holds one env and plays every game once.

    python -m benchmarks.alfworld [--games-per-type 4] [--random-steps 10]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from benchmarks.common import print_table, write_results
from reflectrl.envs.alfworld.env import AlfWorldEnv, AlfWorldOptions
from reflectrl.envs.alfworld.expert import expert_action
from reflectrl.envs.alfworld.generator import generate_games
from reflectrl.envs.alfworld.tasks import TASK_TYPES


def quantiles(values: list[float]) -> tuple[float, float]:
    """(median, 90th percentile)."""
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    return statistics.median(ordered), p90


def measure_generation(out: Path, per_type: int) -> dict[str, list[float]]:
    """Seconds per kept game, by task type (from the moments the generator reports each)."""
    times: dict[str, list[float]] = defaultdict(list)
    last = time.perf_counter()

    def progress(line: str) -> None:
        nonlocal last
        now = time.perf_counter()
        task_type = line.split(": ", 1)[1].split("/")[1].split("-")[0]
        times[task_type].append(now - last)
        last = now

    n = per_type * len(TASK_TYPES)
    generate_games(out, n, seed=0, valid_seen=0, valid_unseen=0, progress=progress)
    return times


def measure_env(data_dir: Path, random_steps: int) -> dict[str, dict[str, list[float]]]:
    env = AlfWorldEnv(AlfWorldOptions(data_dir=str(data_dir), max_steps=1000))
    env.reset(options={"game": 0})  # the engine's import and set-up, not counted
    rng = random.Random(0)
    stats: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for index, game in enumerate(env.games):
        row = stats[game.task_type]
        start = time.perf_counter()
        obs, _ = env.reset(options={"game": index})
        row["reset"].append(time.perf_counter() - start)
        done = False
        while not done:
            action = expert_action(env)
            start = time.perf_counter()
            obs, _, terminated, truncated, _ = env.step(action)
            row["step"].append(time.perf_counter() - start)
            done = terminated or truncated
        row["walkthrough"].append(float(game.walkthrough_length or 0))
        obs, _ = env.reset(options={"game": index})
        for _ in range(random_steps):
            start = time.perf_counter()
            obs, _, terminated, truncated, info = env.step(rng.randrange(len(obs.actions)))
            row["step"].append(time.perf_counter() - start)
            row["menu"].append(float(info["admissible_count"]))
            if terminated or truncated:
                break
    return stats


def child_memory(data_dir: str) -> None:
    """Run in a fresh process: print RSS (MiB) after import, first reset, and all games."""

    def status() -> dict[str, float]:
        fields = dict(
            line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines()
        )
        return {k: int(fields[k].split()[0]) / 1024 for k in ("VmRSS", "VmHWM")}

    marks = {"after_import": status()["VmRSS"]}
    env = AlfWorldEnv(AlfWorldOptions(data_dir=data_dir))
    env.reset(options={"game": 0})
    marks["after_first_reset"] = status()["VmRSS"]
    for index in range(len(env.games)):
        env.reset(options={"game": index})
        for _ in range(5):
            env.step(0)
    end = status()
    marks["after_all_games"], marks["peak"] = end["VmRSS"], end["VmHWM"]
    print(json.dumps(marks))


def measure_memory(data_dir: Path) -> dict[str, float]:
    code = f"from benchmarks.alfworld import child_memory; child_memory({str(data_dir)!r})"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=1800
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--games-per-type", type=int, default=4)
    parser.add_argument("--random-steps", type=int, default=10)
    args = parser.parse_args()
    data_dir = Path(tempfile.mkdtemp()) / "games"
    generation = measure_generation(data_dir, args.games_per_type)
    env_stats = measure_env(data_dir, args.random_steps)
    memory = measure_memory(data_dir)
    rows = []
    for task_type in TASK_TYPES:
        gen_med, gen_p90 = quantiles(generation[task_type])
        reset_med, reset_p90 = quantiles(env_stats[task_type]["reset"])
        step_med, step_p90 = quantiles(env_stats[task_type]["step"])
        rows.append(
            {
                "task_type": task_type,
                "games": len(env_stats[task_type]["reset"]),
                "gen_s_median": gen_med,
                "gen_s_p90": gen_p90,
                "reset_s_median": reset_med,
                "reset_s_p90": reset_p90,
                "step_s_median": step_med,
                "step_s_p90": step_p90,
                "walkthrough_mean": statistics.mean(env_stats[task_type]["walkthrough"]),
                "menu_max": max(env_stats[task_type]["menu"], default=0.0),
            }
        )
    all_gen = [t for times in generation.values() for t in times]
    print_table(rows, list(rows[0]))
    print(
        f"generation: {statistics.mean(all_gen):.2f} s/game mean over {len(all_gen)} games "
        "(the first includes the engine's import)"
    )
    print(
        "memory of one env process (MiB): " + ", ".join(f"{k} {v:.0f}" for k, v in memory.items())
    )
    path = write_results(
        "alfworld",
        {
            "games_per_type": args.games_per_type,
            "random_steps": args.random_steps,
            "per_task_type": rows,
            "generation_s_per_game_mean": statistics.mean(all_gen),
            "memory_mib": memory,
        },
    )
    print(f"results: {path}")


if __name__ == "__main__":
    main()
