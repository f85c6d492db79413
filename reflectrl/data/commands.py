"""`reflectrl data`: write the SFT data set (expert episodes with negative examples)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from reflectrl.config import add_config_arguments


def add_commands(sub: Any) -> None:
    data = sub.add_parser(
        "data",
        help="write the SFT data set (expert episodes with negative examples)",
        description="Play expert episodes on the env's training split, take a wrong action at "
        "some steps (data.negative_rate), and write prompt/completion rows for the three SFT "
        "targets (sft, sft_reflection, sft_policy) with the prompts RL uses.",
    )
    add_config_arguments(data, "data.negative_rate=0.3")
    data.add_argument("--out", required=True, metavar="DIR", help="a new folder for the data")
    data.add_argument("--episodes", type=int, help="expert episodes (data.episodes)")
    data.add_argument("--seed", type=int, help="(data.seed, else run.seed)")
    data.set_defaults(handler=run_data)


def run_data(args: argparse.Namespace) -> int:
    from reflectrl.config import load_config
    from reflectrl.errors import ConfigError

    if args.episodes is not None and args.episodes < 1:
        raise ConfigError(f"--episodes {args.episodes}: need at least 1 episode")
    config = load_config(args.config, args.overrides)
    from reflectrl.data.dataset import write_dataset  # seconds: the model libraries

    out = Path(args.out)
    stats = write_dataset(config, out, episodes=args.episodes, seed=args.seed)
    rows = sum(v for k, v in stats.items() if k.startswith("rows_"))
    print(
        f"wrote {rows} rows ({stats['steps']} steps of {stats['episodes']} episodes, "
        f"{stats['negative_steps']} after a mistake) to {out / 'data.jsonl'}; stats in "
        f"{out / 'stats.json'}"
    )
    return 0
