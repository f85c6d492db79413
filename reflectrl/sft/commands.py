"""`reflectrl sft`: warm-up SFT of the reflection model, the policy, or both."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from reflectrl.config import add_config_arguments

PLAYER_CHOICES = ("reflection", "policy", "both")


def add_commands(sub: Any) -> None:
    sft = sub.add_parser(
        "sft",
        help="train the players' LoRA adapters on a data set of `reflectrl data`",
        description="Supervised warm-up of the reflection model (observation -> reflection) "
        "and/or the policy (observation [+ reflection] + menu -> the expert's label), loss on "
        "the completion only. Writes OUT/reflection and OUT/policy (peft adapters, or model "
        "directories with sft.method=full), each with sft_result.json.",
    )
    add_config_arguments(sft, "sft.max_steps=200")
    sft.add_argument("--data", required=True, metavar="DIR", help="folder of `reflectrl data`")
    sft.add_argument("--player", default="both", help="reflection, policy or both (default)")
    sft.add_argument("--out", required=True, metavar="DIR", help="folder for the adapters")
    sft.set_defaults(handler=run_sft)


def run_sft(args: argparse.Namespace) -> int:
    from reflectrl.config import load_config
    from reflectrl.errors import ConfigError
    from reflectrl.sft.rows import PLAYERS, check_data_dir
    from reflectrl.sft.trainer import train_player

    if args.player not in PLAYER_CHOICES:
        raise ConfigError(f"--player {args.player!r}: choose one of {', '.join(PLAYER_CHOICES)}")
    config = load_config(args.config, args.overrides)
    data = Path(args.data)
    check_data_dir(data)
    players = PLAYERS if args.player == "both" else (args.player,)
    for player in players:
        print(f"sft: {player} on {data} ...", file=sys.stderr)
        result = train_player(config, data, player, Path(args.out))
        print(
            f"sft {player}: {result['steps']} steps on {result['rows']} rows in "
            f"{result['seconds']:.0f} s; completion loss (train rows) "
            f"{result['loss_before']['train']:.3f} -> {result['loss_after']['train']:.3f}"
            + _eval_text(result)
            + f"; saved to {Path(args.out) / player}"
        )
    return 0


def _eval_text(result: dict[str, Any]) -> str:
    if "eval" not in result["loss_after"]:
        return ""
    return f", held-out {result['loss_before']['eval']:.3f} -> {result['loss_after']['eval']:.3f}"
