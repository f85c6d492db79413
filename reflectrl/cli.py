"""Command line: `reflectrl launch ...` and the env tools. User errors print one line, exit 2.

Each subcommand is registered by a `add_commands(subparsers)` function of the module that owns
it; the parser of a subcommand sets `handler` (a function of the parsed args returning an exit
code). Heavy imports happen inside handlers, so `--help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from typing import Any

from reflectrl.config import add_config_arguments
from reflectrl.errors import ReflectRLError

EXIT_USAGE = 2

# Modules that add subcommands besides `launch` (each defines `add_commands(subparsers)`).
COMMAND_MODULES: tuple[str, ...] = (
    "reflectrl.data.commands",
    "reflectrl.sft.commands",
    "reflectrl.evaluation.commands",
    "reflectrl.evaluation.export",
    "reflectrl.evaluation.play",
    "reflectrl.experiment.commands",
    "reflectrl.envs.auto_explore.commands",
    "reflectrl.envs.alfworld.commands",
)


def run_launch(args: argparse.Namespace) -> int:
    from reflectrl.config import machine_recipe
    from reflectrl.run_dir import LaunchOptions, resolve_run

    config_path = args.config
    if config_path is None and args.resume is None:
        config_path, why = machine_recipe()
        print(why, flush=True)
    options = LaunchOptions(
        workers=args.workers,
        config_path=config_path,
        output=args.output,
        iterations=args.iterations,
        overrides=args.overrides,
        address=args.address,
        resume=args.resume,
    )
    # A bad config, --output or --resume fails here in a fraction of a second: the pipeline
    # imports torch, Ray and the model libraries (seconds).
    resolve_run(options)
    from reflectrl.console import LibraryOutput
    from reflectrl.pipeline import launch

    # What Ray, RLlib and the model libraries print goes to the run's launch.log.
    with LibraryOutput() as output:
        run_dir = launch(options, output)
    print(f"done: {run_dir}")
    return 0


def add_launch_command(sub: Any) -> None:
    launch = sub.add_parser(
        "launch",
        help="run the method (data, SFT, RL, eval) on a local Ray (default) or a Ray cluster",
        description="Run the configured stages in one run directory: data (expert episodes "
        "with negative examples) -> sft (reflection model, then policy) -> rl (PPO + LoRA on "
        "rollout workers that ask the reflection server at every step) -> eval (held-out "
        "success). sft.enabled / rl.enabled / eval.enabled switch stages off (sft.policy=false: "
        "RL only, the reflection still trained); --resume skips "
        "finished stages and continues the unfinished one.",
    )
    launch.add_argument("--workers", type=int, default=2, help="rollout workers (default 2)")
    add_config_arguments(
        launch,
        "ppo.lr=3e-4",
        "YAML config (default: configs/gpu.yaml where CUDA is visible, else configs/cpu.yaml)",
    )
    launch.add_argument("--output", help="run directory (default: runs/<env>-<time>)")
    launch.add_argument("--iterations", type=int, help="training iterations (run.iterations)")
    launch.add_argument("--address", help="join this Ray cluster (default: $RAY_ADDRESS or local)")
    launch.add_argument(
        "--resume",
        metavar="DIR",
        help="continue the run in DIR: finished stages are skipped, RL resumes from its latest "
        "checkpoint",
    )
    launch.set_defaults(handler=run_launch)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="reflectrl",
        description="Reflect-RL: PPO fine-tuning of an LM agent with a frozen reflection model.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_launch_command(sub)
    for module in COMMAND_MODULES:
        importlib.import_module(module).add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        return int(args.handler(args))
    except ReflectRLError as err:
        print(f"reflectrl: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("reflectrl: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
