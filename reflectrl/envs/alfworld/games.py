"""Finding and reading ALFWorld games on disk: ours (`reflectrl alfworld-gen`) or the official data.

Both use the official layout: `<root>/<split>/<task>-<Obj>-<MRecep>-<Recep>-<scene>/<trial>/`
holding `game.tw-pddl` (domain, grammar with the task, problem, walkthrough, solvable flag) and
`traj_data.json` (task type, floor plan, ...). The root may also be `$ALFWORLD_DATA`, whose games
live in `json_2.1.1/`. Files are only read, never written.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reflectrl.envs.alfworld.tasks import TASK_TYPES, task_type_of_folder
from reflectrl.errors import ConfigError

log = logging.getLogger(__name__)

GAME_FILE = "game.tw-pddl"
TRAJ_FILE = "traj_data.json"
SPLITS: tuple[str, ...] = ("train", "valid_seen", "valid_unseen")
# "valid" is both held-out splits, as the paper's test set (`valid*`).
SPLIT_CHOICES: tuple[str, ...] = (*SPLITS, "valid")
GAME_KEYS = ("pddl_domain", "grammar", "pddl_problem")


class GameDataError(ConfigError):
    """A game directory or file that cannot be used (missing, corrupt, empty)."""


@dataclass(frozen=True)
class GameEntry:
    path: Path  # the game.tw-pddl file
    task_type: str
    # The folder name without its "-<scene>": pick_and_place_simple-Tomato-None-Microwave
    family: str
    floor_plan: str | None  # "FloorPlan13" when the metadata says
    walkthrough_length: int | None  # None: the game has no walkthrough (no expert, no length stage)


def read_game(path: Path) -> dict[str, Any]:
    """The game file's JSON, checked to be something the engine can load."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise GameDataError(f"{path}: game file not found") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise GameDataError(f"{path}: corrupt game file ({type(err).__name__}: {err})") from None
    if not isinstance(data, dict):
        raise GameDataError(f"{path}: corrupt game file (not a JSON object)")
    missing = [k for k in GAME_KEYS if not isinstance(data.get(k), str)]
    if missing:
        raise GameDataError(f"{path}: corrupt game file (missing {', '.join(missing)})")
    walkthrough = data.get("walkthrough")
    if walkthrough is not None and not (
        isinstance(walkthrough, list) and all(isinstance(c, str) for c in walkthrough)
    ):
        raise GameDataError(f"{path}: corrupt game file (walkthrough is not a list of commands)")
    return data


def resolve_data_root(data_dir: str | None) -> Path:
    """The folder holding the splits: `data_dir`, else `$ALFWORLD_DATA` (or its json_2.1.1)."""
    source = "env.options.data_dir"
    if not data_dir:
        data_dir, source = os.environ.get("ALFWORLD_DATA"), "ALFWORLD_DATA"
    if not data_dir:
        raise ConfigError(
            "ALFWorld: no game data; set env.options.data_dir (or ALFWORLD_DATA) to a folder "
            "made by `reflectrl alfworld-gen --out DIR`"
        )
    root = Path(data_dir).expanduser()
    if not root.is_dir():
        raise GameDataError(
            f"{source}: {root} is not a directory; create games with "
            f"`reflectrl alfworld-gen --out {root}`"
        )
    if not any((root / s).is_dir() for s in SPLITS) and (root / "json_2.1.1").is_dir():
        root = root / "json_2.1.1"  # the official download's layout
    return root


def split_dirs(root: Path, split: str) -> list[Path]:
    if split not in SPLIT_CHOICES:
        raise ConfigError(f"unknown ALFWorld split {split!r}; valid: {', '.join(SPLIT_CHOICES)}")
    names = ("valid_seen", "valid_unseen") if split == "valid" else (split,)
    dirs = [root / n for n in names if (root / n).is_dir()]
    if not dirs:
        raise GameDataError(f"{root}: no {' or '.join(names)} folder with ALFWorld games")
    return dirs


# path -> (mtime_ns, size, entry or None for a skipped game): envs of one worker process share
# the scan, and a changed file is read again.
_CACHE: dict[Path, tuple[int, int, GameEntry | None]] = {}


def scan_games(root: Path, split: str) -> list[GameEntry]:
    """Every solvable game of the split, sorted by path; errors name the bad file or folder."""
    entries: list[GameEntry] = []
    skipped = 0
    for base in split_dirs(root, split):
        for folder in game_folders(base):
            entry = _entry(folder)
            if entry is None:
                skipped += 1
            else:
                entries.append(entry)
    if skipped:
        log.info("ALFWorld %s/%s: skipped %d unsolvable or unsupported games", root, split, skipped)
    if not entries:
        raise GameDataError(
            f"{root}: no solvable ALFWorld games ({GAME_FILE}) in split {split!r}; create some "
            f"with `reflectrl alfworld-gen --out {root}`"
        )
    return entries


def game_folders(base: Path) -> list[Path]:
    folders = []
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames.sort()
        if GAME_FILE in filenames or TRAJ_FILE in filenames:
            folders.append(Path(dirpath))
    return sorted(folders)


def _entry(folder: Path) -> GameEntry | None:
    game_file = folder / GAME_FILE
    if "movable" in str(folder) or "Sliced" in str(folder):
        return None  # as alfworld's AlfredTWEnv: the text engine does not support these
    try:
        stat = game_file.stat()
    except FileNotFoundError:
        raise GameDataError(
            f"{game_file}: game file not found (the folder has only metadata)"
        ) from None
    cached = _CACHE.get(game_file)
    if cached is not None and cached[:2] == (stat.st_mtime_ns, stat.st_size):
        return cached[2]
    data = read_game(game_file)
    entry = None
    if data.get("solvable"):  # missing or false: skipped, as AlfredTWEnv does
        traj = read_metadata(folder)
        task_type = traj.get("task_type") or task_type_of_folder(folder.parent.name)
        if task_type in TASK_TYPES:
            walkthrough = data.get("walkthrough")
            scene = traj.get("scene") if isinstance(traj.get("scene"), dict) else {}
            entry = GameEntry(
                path=game_file,
                task_type=task_type,
                family=folder.parent.name.rsplit("-", 1)[0],
                floor_plan=scene.get("floor_plan"),
                walkthrough_length=len(walkthrough) if walkthrough is not None else None,
            )
    _CACHE[game_file] = (stat.st_mtime_ns, stat.st_size, entry)
    return entry


def read_metadata(folder: Path) -> dict[str, Any]:
    """The folder's traj_data.json ({} when absent: the folder name then gives the task type)."""
    path = folder / TRAJ_FILE
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise GameDataError(f"{path}: corrupt metadata ({type(err).__name__}: {err})") from None
    if not isinstance(data, dict):
        raise GameDataError(f"{path}: corrupt metadata (not a JSON object)")
    return data
