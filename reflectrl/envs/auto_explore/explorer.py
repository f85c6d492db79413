"""AutoExplore's observable expert: it explores as an agent could, without knowing the answer.

It decides from what the agent sees and did (the question, the current directory and its
listing, the files it read and the directories it entered, the last command's output) plus
statistics of the training split (how often its targets have a suffix, or lie under a directory
of a name). It never reads where the target is; `expert.py` is the oracle that does.

Each step:
1. the last `cat` showed the answer (the question's definition, heading or key, as a line that
   states it, not a mention) -> `id` that file;
2. else the best unread file or unentered directory here, scored by how much its name resembles
   the question's key (shared word stems), then by the training split's chance that the target
   is that file or lies under that directory (by depth, suffix and directory name); files
   before directories on a tie;
3. else `cd ..`; at the root with nothing left, `id` the file whose name resembles the key most
   (or, with no file in view, enter the likeliest folder again).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

from reflectrl.envs.auto_explore.shell import RelPath
from reflectrl.envs.auto_explore.tasks import Task

MIN_STEM = 4  # characters two words must share at their start to count as one stem


@dataclass(frozen=True)
class Sight:
    """What the agent knows at a step: everything here is on its screen or in its history."""

    kind: str  # the question's kind (its template says which: class, heading, ...)
    key: str  # the name the question quotes
    cwd: RelPath
    files: tuple[str, ...]  # the listing's files and directories (as shown)
    dirs: tuple[str, ...]
    read: frozenset[RelPath]  # files it has read
    entered: frozenset[RelPath]  # directories it has been in
    last_command: str | None
    last_output: str


@dataclass(frozen=True)
class TrainingPrior:
    """Shares of the training split's targets: by depth (path components), by suffix, and by
    directory name on their path."""

    depth: dict[int, float]
    suffix: dict[str, float]
    directory: dict[str, float]

    @classmethod
    def of(cls, tasks: Sequence[Task]) -> TrainingPrior:
        train = [t for t in tasks if t.split == "train"] or list(tasks)
        n = max(1, len(train))
        depths = Counter(t.depth for t in train)
        suffixes = Counter(PurePosixPath(t.target).suffix for t in train)
        dirs = Counter(d for t in train for d in set(t.target.split("/")[:-1]))
        return cls(
            depth={d: c / n for d, c in depths.items()},
            suffix={s: c / n for s, c in suffixes.items()},
            directory={d: c / n for d, c in dirs.items()},
        )

    def file_here(self, depth: int, name: str, files: int) -> float:
        """Chance (by the training split) that the target is this file of a directory at
        `depth` holding `files` files."""
        return (
            self.depth.get(depth + 1, 0.0)
            * self.suffix.get(PurePosixPath(name).suffix, 0.0)
            / max(1, files)
        )

    def below(self, depth: int, name: str, dirs: int) -> float:
        """Chance that the target lies under this one of `dirs` subdirectories (a name that
        holds training targets more often counts more)."""
        deeper = sum(share for d, share in self.depth.items() if d > depth + 1)
        return deeper * (1.0 + self.directory.get(name, 0.0)) / max(1, dirs)


def words(text: str) -> list[str]:
    """Lower-case words of a name: snake_case, kebab-case, CamelCase and dots split."""
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", text)
    return [w.lower() for w in re.split(r"[^A-Za-z0-9]+", spaced) if w]


def resemblance(name: str, key: str) -> int:
    """How many of the key's words share a stem with a word of `name` (its suffix aside)."""
    stem = PurePosixPath(name).stem if "." in name[1:] else name
    theirs = words(stem)
    return sum(
        any(_same_stem(mine, other) for other in theirs)
        for mine in {w for w in words(key) if len(w) >= 3}
    )


def _same_stem(a: str, b: str) -> bool:
    if a == b:
        return True
    short = min(len(a), len(b))
    return short >= MIN_STEM and a[:MIN_STEM] == b[:MIN_STEM] and (a in b or b in a or short > 5)


# How `cat`'s outline line (`Defines: class Env, def make`, `Headings: ...`, `Keys: ...`) names
# what each kind of question asks for.
OUTLINE_ITEMS = {
    "class": "class {key}",
    "function": "def {key}",
    "heading": "{key}",
    "config_section": "[{key}]",
    "config_key": "{key}",
}
OUTLINE_LABELS = ("Defines", "Headings", "Keys")


def states_answer(kind: str, key: str, output: str) -> bool:
    """Does a `cat` output state what the question asks (not merely mention the key)? Its
    outline line lists the item, or a line of the text defines it."""
    label, sep, items = output.split("\n", 1)[0].partition(": ")
    item = OUTLINE_ITEMS.get(kind, "{key}").format(key=key)
    if sep and label in OUTLINE_LABELS and f", {item}," in f", {items},":
        return True
    k = re.escape(key)
    patterns = {
        "class": rf"^\s*class\s+{k}\b",
        "function": rf"^\s*(?:async\s+)?def\s+{k}\b",
        "heading": rf"^\s*(?:#+\s*)?{k}\s*#*\s*$",
        "config_section": rf"^\s*\[\s*{k}\s*\]|^{k}\s*:",
        "config_key": rf"^\s*{k}\s*[=:]",
    }
    return re.search(patterns.get(kind, rf"\b{k}\b"), output, re.MULTILINE) is not None


def explore(sight: Sight, prior: TrainingPrior) -> str:
    """The next command (one of the menu's) from what the agent sees."""
    last = sight.last_command or ""
    if last.startswith("cat ") and states_answer(sight.kind, sight.key, sight.last_output):
        name = last[4:]
        if name in sight.files:
            return f"id {name}"
    # A name's resemblance to the key counts first (a whole number); the prior (below 1)
    # orders the rest.
    depth, n_files, n_dirs = len(sight.cwd), len(sight.files), len(sight.dirs)
    scored: list[tuple[float, int, str, str]] = []
    for name in sight.files:
        if (*sight.cwd, name) not in sight.read:
            score = resemblance(name, sight.key) + prior.file_here(depth, name, n_files)
            scored.append((score, 1, name, f"cat {name}"))
    for name in sight.dirs:
        if (*sight.cwd, name) not in sight.entered:
            score = resemblance(name, sight.key) + prior.below(depth, name, n_dirs)
            scored.append((score, 0, name, f"cd {name}"))
    if scored:
        # Highest score; files before directories; then the listing's (alphabetical) order.
        return max(scored, key=lambda s: (s[0], s[1], [-ord(c) for c in s[2]]))[3]
    if sight.cwd:
        return "cd .."
    # At the root with everything here explored: a guess, or (no file in view) a second look
    # into the likeliest folder.
    if sight.files:
        return f"id {max(sight.files, key=lambda f: resemblance(f, sight.key))}"
    return f"cd {max(sight.dirs, key=lambda d: resemblance(d, sight.key) + prior.below(0, d, 1))}"
