"""`reflectrl alfworld-gen` (write verified games) and `reflectrl alfworld-check` (replay them).

Heavy imports (textworld, the generator) happen inside the handlers so `reflectrl --help` stays
fast. User errors raise `ReflectRLError` subclasses: the CLI prints one line and exits 2.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from reflectrl.envs.alfworld.tasks import DEFAULT_MAX_ACTIONS, TASK_TYPES
from reflectrl.errors import ConfigError


def add_commands(subparsers: Any) -> None:
    gen = subparsers.add_parser(
        "alfworld-gen",
        help="write solvable ALFWorld games from the alfworld package's layouts",
        description="Generate N ALFWorld games (all six task types) from the floor plans the "
        "alfworld package ships, split by floor plan into train/valid_seen/valid_unseen. Every "
        "game's walkthrough is replayed through the real engine before the game is kept.",
    )
    gen.add_argument("--out", required=True, type=Path, help="new (or empty) output folder")
    gen.add_argument("--n", required=True, type=int, help="number of games, all splits together")
    gen.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    gen.add_argument(
        "--task-types",
        default=",".join(TASK_TYPES),
        help="comma-separated task types or aliases pick,look,clean,heat,cool,two (default all)",
    )
    gen.add_argument("--valid-seen", type=float, default=0.1, help="fraction (default 0.1)")
    gen.add_argument("--valid-unseen", type=float, default=0.1, help="fraction (default 0.1)")
    gen.add_argument(
        "--unseen-floor-plans",
        default="10,219,308,424",
        help="floor plans reserved for valid_unseen (default: ALFRED's, 10,219,308,424)",
    )
    gen.add_argument(
        "--max-actions",
        type=int,
        default=DEFAULT_MAX_ACTIONS,
        help=f"menu cap the walkthrough must fit (default {DEFAULT_MAX_ACTIONS}, the env's)",
    )
    gen.set_defaults(handler=run_gen)

    check = subparsers.add_parser(
        "alfworld-check",
        help="replay every game's walkthrough through the alfworld engine",
        description="Replay the walkthrough of every game under DIR through the real engine; "
        "print per task type counts and the solved rate. Exit 0 only if every game is solved.",
    )
    check.add_argument("dir", type=Path, help="a folder made by alfworld-gen (or official data)")
    check.add_argument(
        "--max-actions",
        type=int,
        default=DEFAULT_MAX_ACTIONS,
        help=f"the walkthrough must stay in the capped menu (default {DEFAULT_MAX_ACTIONS})",
    )
    check.set_defaults(handler=run_check)


def _floor_plans(text: str) -> list[int]:
    try:
        return [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise ConfigError(f"--unseen-floor-plans {text!r}: expected numbers like 10,219") from None


def run_gen(args: argparse.Namespace) -> int:
    from reflectrl.envs.alfworld.generator import generate_games
    from reflectrl.envs.alfworld.tasks import parse_task_types

    task_types = parse_task_types(args.task_types)
    if args.max_actions < 2:
        raise ConfigError(f"--max-actions must be at least 2 (got {args.max_actions})")
    start = time.perf_counter()
    report = generate_games(
        args.out,
        args.n,
        args.seed,
        task_types,
        valid_seen=args.valid_seen,
        valid_unseen=args.valid_unseen,
        unseen_floor_plans=_floor_plans(args.unseen_floor_plans),
        max_actions=args.max_actions,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
    )
    for line in report.skipped:
        print(f"skipped {line}", file=sys.stderr)
    elapsed = time.perf_counter() - start
    rows = [
        [task_type, *(str(report.kept[(split, task_type)]) for split in _SPLIT_COLUMNS)]
        for task_type in task_types
    ]
    _print_table(["task type", *_SPLIT_COLUMNS], rows)
    print(
        f"wrote {len(report.games)} games to {args.out} in {elapsed:.1f} s "
        f"({elapsed / len(report.games):.2f} s/game); {len(report.skipped)} draws skipped"
    )
    return 0


_SPLIT_COLUMNS = ("train", "valid_seen", "valid_unseen")


def run_check(args: argparse.Namespace) -> int:
    from reflectrl.envs.alfworld.engine import Engine, replay
    from reflectrl.envs.alfworld.games import (
        GAME_FILE,
        GameDataError,
        game_folders,
        read_game,
        read_metadata,
        split_dirs,
    )

    root = args.dir
    if not root.is_dir():
        raise GameDataError(f"{root}: not a directory")
    bases = [d for s in _SPLIT_COLUMNS if (root / s).is_dir() for d in split_dirs(root, s)]
    if not bases:
        raise GameDataError(f"{root}: no train, valid_seen or valid_unseen folder")
    engine = Engine()
    games: Counter[str] = Counter()
    solved: Counter[str] = Counter()
    largest: Counter[str] = Counter()  # the most commands the engine admitted, per task type
    unchecked = 0
    plans: dict[str, set[str]] = {}
    for base in bases:
        for folder in game_folders(base):
            game_file = folder / GAME_FILE
            data = read_game(game_file)
            meta = read_metadata(folder)
            task_type = meta.get("task_type") or folder.parent.name.split("-", 1)[0]
            plan = (meta.get("scene") or {}).get("floor_plan")
            if plan:
                plans.setdefault(base.name, set()).add(plan)
            if data.get("walkthrough") is None:
                unchecked += 1
                continue
            games[task_type] += 1
            engine.load(data, name=str(game_file))
            result = replay(engine, data["walkthrough"], args.max_actions)
            largest[task_type] = max(largest[task_type], result.largest_menu)
            if result.ok:
                solved[task_type] += 1
            else:
                print(f"FAILED {game_file}: {result.reason}", file=sys.stderr)
    total, ok = sum(games.values()), sum(solved.values())
    if total == 0:
        raise GameDataError(f"{root}: no games with a walkthrough to check")
    rows = [
        [t, str(games[t]), str(solved[t]), f"{solved[t] / games[t]:.3f}", str(largest[t])]
        for t in sorted(games)
    ]
    _print_table(["task type", "games", "solved", "rate", "largest menu"], rows)
    leaked = plans.get("train", set()) & plans.get("valid_unseen", set())
    if leaked:
        print(f"FAILED split: floor plans in both train and valid_unseen: {sorted(leaked)}")
    if unchecked:
        print(f"{unchecked} games have no walkthrough (not checked)")
    print(f"solved rate: {ok / total:.3f} ({ok}/{total})")
    return 0 if ok == total and not leaked else 1


def _print_table(header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows, strict=False)]
    for line in [header, *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=False)).rstrip())
