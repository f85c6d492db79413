"""`reflectrl autoexplore-tasks | autoexplore-check | autoexplore-shell`.

Bad input raises `ReflectRLError`s: the CLI prints one line and exits 2. (Importing this
module imports the `reflectrl.envs` package, hence gymnasium; the rest waits for a handler.)
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from typing import Any

from reflectrl.envs.auto_explore.sandbox import DEFAULT_MAX_READ_BYTES as MAX_READ_BYTES
from reflectrl.envs.auto_explore.shell import DEFAULT_MAX_ACTIONS as MAX_ACTIONS
from reflectrl.envs.auto_explore.shell import DEFAULT_MAX_OUTPUT_CHARS as MAX_OUTPUT_CHARS
from reflectrl.errors import ConfigError


def add_commands(sub: Any) -> None:
    tasks = sub.add_parser(
        "autoexplore-tasks",
        help="generate AutoExplore tasks (JSONL) from source trees",
        description="Write one question per answerable file of the roots, with a seeded "
        "train/test split by file.",
    )
    tasks.add_argument(
        "--root",
        dest="roots",
        action="append",
        metavar="DIR",
        help="a directory, or pkg:NAME for an installed package's source tree (repeatable; "
        "default: pkg:gymnasium pkg:peft pkg:pydantic pkg:trl)",
    )
    tasks.add_argument(
        "--unseen-root",
        dest="unseen_roots",
        action="append",
        default=[],
        metavar="DIR",
        help="a held-out source tree: all of its tasks go to the `unseen` split (repeatable)",
    )
    tasks.add_argument("--out", required=True, metavar="FILE.jsonl")
    tasks.add_argument("--seed", type=int, default=0, help="split and question choice (0)")
    tasks.add_argument("--max-tasks", type=int, metavar="N", help="keep a seeded subset of N")
    tasks.add_argument("--test-fraction", type=float, default=0.2, help="(default 0.2)")
    _env_settings(tasks)
    tasks.add_argument(
        "--writer-url",
        metavar="URL",
        help="rephrase questions with this OpenAI-compatible endpoint (off by default)",
    )
    tasks.add_argument("--writer-model", default="reflection", help="model name at the endpoint")
    tasks.set_defaults(handler=run_tasks)

    check = sub.add_parser(
        "autoexplore-check",
        help="run the expert on every task; print the success rate and mean length",
    )
    check.add_argument("--tasks", required=True, metavar="FILE.jsonl")
    check.add_argument("--split", choices=("train", "test", "unseen", "all"), default="all")
    _env_settings(check)
    check.set_defaults(handler=run_check)

    shell = sub.add_parser(
        "autoexplore-shell",
        help="explore a directory through the AutoExplore sandbox (commands on stdin)",
    )
    shell.add_argument("--root", required=True, metavar="DIR", help="a directory or pkg:NAME")
    shell.add_argument("--max-actions", type=int, default=MAX_ACTIONS)
    shell.add_argument("--max-output-chars", type=int, default=MAX_OUTPUT_CHARS)
    shell.set_defaults(handler=run_shell)


def _env_settings(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-actions", type=int, default=MAX_ACTIONS, help="menu cap (40)")
    parser.add_argument("--max-output-chars", type=int, default=MAX_OUTPUT_CHARS)
    parser.add_argument("--max-read-bytes", type=int, default=MAX_READ_BYTES)


def _check_settings(args: argparse.Namespace) -> None:
    if args.max_actions < 3:
        raise ConfigError(f"--max-actions {args.max_actions}: must be >= 3")
    if args.max_output_chars < 100:
        raise ConfigError(f"--max-output-chars {args.max_output_chars}: must be >= 100")
    if getattr(args, "max_read_bytes", 1) < 1:
        raise ConfigError(f"--max-read-bytes {args.max_read_bytes}: must be >= 1")


def run_tasks(args: argparse.Namespace) -> int:
    from reflectrl.envs.auto_explore.tasks import (
        DEFAULT_ROOTS,
        GenerationSettings,
        generate_tasks,
        write_tasks,
    )

    _check_settings(args)
    if args.max_tasks is not None and args.max_tasks < 1:
        raise ConfigError(f"--max-tasks {args.max_tasks}: must be >= 1")
    if not 0.0 <= args.test_fraction < 1.0:
        raise ConfigError(f"--test-fraction {args.test_fraction}: must be in [0, 1)")
    settings = GenerationSettings(
        max_actions=args.max_actions,
        max_output_chars=args.max_output_chars,
        max_read_bytes=args.max_read_bytes,
        test_fraction=args.test_fraction,
    )
    roots = args.roots or DEFAULT_ROOTS
    tasks = generate_tasks(roots, args.seed, args.max_tasks, settings, args.unseen_roots)
    if args.writer_url:
        from reflectrl.envs.auto_explore.writer import rewrite_questions

        tasks = rewrite_questions(tasks, args.writer_url, args.writer_model)
    write_tasks(tasks, args.out)
    splits = Counter(t.split for t in tasks)
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(Counter(t.kind for t in tasks).items()))
    depths = ", ".join(f"{d}: {n}" for d, n in sorted(Counter(t.depth for t in tasks).items()))
    print(
        f"wrote {len(tasks)} tasks to {args.out} (train {splits['train']}, test "
        f"{splits['test']}, unseen {splits['unseen']}; {kinds}; by depth {depths})"
    )
    return 0


def run_check(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from reflectrl.envs.auto_explore.env import AutoExploreEnv, AutoExploreOptions
    from reflectrl.envs.auto_explore.expert import run_expert_episode

    _check_settings(args)
    try:
        options = AutoExploreOptions(
            tasks=args.tasks,
            split=args.split,
            max_actions=args.max_actions,
            max_output_chars=args.max_output_chars,
            max_read_bytes=args.max_read_bytes,
        )
    except ValidationError as err:
        raise ConfigError(f"autoexplore-check: {err.errors()[0]['msg']}") from None
    env = AutoExploreEnv(options)
    successes, lengths = 0, []
    for task in env.tasks:
        info, _ = run_expert_episode(env, task.id)
        successes += bool(info["success"])
        lengths.append(env.steps)
    rate = successes / len(env.tasks)
    mean = sum(lengths) / len(lengths)
    print(f"tasks {len(env.tasks)}  success rate {rate:.3f}  mean length {mean:.2f}")
    return 0 if successes == len(env.tasks) else 1


def run_shell(args: argparse.Namespace) -> int:
    from reflectrl.envs.auto_explore.sandbox import Sandbox
    from reflectrl.envs.auto_explore.shell import Shell, View

    _check_settings(args)
    sandbox = Sandbox(args.root, cache=False)  # a person may edit the tree meanwhile
    shell = Shell(View(sandbox, args.max_actions), max_output_chars=args.max_output_chars)
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="backslashreplace")  # file text on a non-UTF-8 terminal
    try:
        _shell_loop(shell)
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): stop quietly, as other command-line tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def _shell_loop(shell: Any) -> None:
    interactive = sys.stdin.isatty()
    print("Commands: cd <dir>, cd .., cat <file>, id <file>; `exit` or end of input quits.")
    print(f"In .:\n{shell.listing_text()}", flush=True)
    while True:
        if interactive:
            print("> ", end="", flush=True)
        raw = sys.stdin.buffer.readline()
        if not raw:
            break
        # Undecodable bytes become lone surrogates, which run_command rejects.
        line = raw.decode("utf-8", "surrogateescape").rstrip("\r\n")
        if line.strip() == "exit":
            break
        if not line.strip():
            continue
        result = shell.execute(line)
        print(result.output)
        if result.status != "error" and line.split()[0] == "cd":
            print(shell.listing_text())
        sys.stdout.flush()
