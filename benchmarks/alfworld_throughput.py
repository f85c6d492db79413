"""ALFWorld env steps/s of the whole RL loop (sample + reflect + PPO update) per rollout worker:
envs per worker, and resets in line against resets prefetched on a background thread
(`env.prefetch_resets`).

Every variant runs in this one process against the same vLLM reflection server (started once),
so the ratios compare like with like on a noisy machine. The players are a finished run's SFT
models (`--run`: the length of reflections and episodes is theirs), or else
configs/alfworld_cpu.yaml's untrained scratch models (reflections always run to
reflection.max_tokens, episodes to env.options.max_steps).

    python -m benchmarks.alfworld_throughput [--run RUN] [--iterations 3]
        [--fragment 16] [--variants "1x8 inline,1x8 prefetch"] [--repeat 2]
        [--name alfworld_throughput]

With --repeat, the variants run in turn that many times (inline, prefetch, inline, ...), and
each row is one of those runs: drift over time falls on both alike.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from benchmarks.common import print_table, write_results
from benchmarks.env_throughput import measure, reflection_server
from reflectrl.config import load_config
from reflectrl.envs.alfworld.generator import ensure_games

CONFIG = "configs/alfworld_cpu.yaml"
# (name, workers, envs per worker, prefetch): 2 workers is what 2 cores allow beside the server.
VARIANTS = [
    ("2x4 inline", 2, 4, False),
    ("2x4 prefetch", 2, 4, True),
    ("2x8 inline", 2, 8, False),
    ("2x8 prefetch", 2, 8, True),
    ("1x8 inline", 1, 8, False),
    ("1x8 prefetch", 1, 8, True),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--iterations", type=int, default=3, help="per variant; 1 is warm-up")
    parser.add_argument(
        "--fragment", type=int, help="ppo.rollout_fragment_length (default: the recipe's)"
    )
    parser.add_argument("--run", type=Path, help="a run whose SFT players (full SFT) to use")
    parser.add_argument("--variants", help="comma-separated names (default: all)")
    parser.add_argument("--repeat", type=int, default=1, help="rounds over the variants")
    parser.add_argument("--name", default="alfworld_throughput", help="results file name")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    players = []
    if args.run is not None:
        players = [
            f"policy.model={args.run / 'sft' / 'policy'}",
            f"reflection.model={args.run / 'sft' / 'reflection'}",
        ]
    config = load_config(CONFIG, players)
    fragment = config.ppo.rollout_fragment_length if args.fragment is None else args.fragment
    options = config.env.options
    ensure_games(Path(options["data_dir"]), options["generate_games"], options["generate_seed"])
    chosen = args.variants.split(",") if args.variants else [v[0] for v in VARIANTS]
    variants = [v for v in VARIANTS if v[0] in chosen]
    if len(variants) != len(chosen):
        parser.error(f"--variants: choose from {', '.join(v[0] for v in VARIANTS)}")
    with reflection_server(config) as server:
        rows = []
        for name, workers, envs, prefetch in variants * args.repeat:
            overrides = [
                *players,
                "reflection.server=url",
                f"reflection.url={server.url}",
                "eval.enabled=false",
                f"env.envs_per_worker={envs}",
                f"env.prefetch_resets={str(prefetch).lower()}",
                f"ppo.rollout_fragment_length={fragment}",
                # The recipe's minibatch, or the whole batch where that is smaller.
                f"ppo.minibatch_size={min(config.ppo.minibatch_size, workers * envs * fragment)}",
            ]
            row = measure(CONFIG, overrides, workers, args.iterations)
            rows.append({"variant": name, "envs_per_worker": envs, "prefetch": prefetch, **row})
            print_table(rows[-1:], ["variant", "env_steps_per_s_per_worker"])
    # Each prefetch row against the inline row of its round.
    for i, row in enumerate(rows):
        round_rows = rows[i - i % len(variants) : i - i % len(variants) + len(variants)]
        inline = [
            r for r in round_rows if r["variant"] == row["variant"].replace("prefetch", "inline")
        ]
        speed = row["env_steps_per_s_per_worker"]
        row["vs_inline"] = speed / inline[0]["env_steps_per_s_per_worker"] if inline else None
    print_table(
        rows,
        [
            "variant",
            "env_steps_per_s",
            "env_steps_per_s_per_worker",
            "vs_inline",
            "iteration_s_median",
            "env_share",
            "reflection_share",
            "policy_share",
        ],
    )
    payload = {
        "config": CONFIG,
        "players": str(args.run) if args.run else "untrained scratch:alfworld",
        "iterations": args.iterations,
        "fragment": fragment,
        "repeat": args.repeat,
    }
    path = write_results(args.name, {**payload, "results": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
