"""AutoExplore tasks: the JSONL format, and the offline, seeded generator.

One task per line: `id`, `root` (a directory or `pkg:NAME`), `question`, `target` (the
answer's path relative to the root), `depth` (path components of the target: 1 = a file at
the root), `split` (`train`/`test`, or `unseen` for every file of a held-out root), plus `kind`
and `key` (what the question names).

Questions name exactly one file of the tree and are answerable by reading it:
- Python: "Which file defines the class/function `X`?", X a public top-level definition
  (parsed with `ast`) whose name is defined nowhere else in the tree, at any nesting level;
- Markdown/reST: a section heading found in no other file;
- config (.toml .cfg .ini .yaml): a section or top-level key found in no other config file.
The item must show in the target's `cat` output under the env's settings, and the target
must be reachable under the menu cap (`View.reachable`). The split is by file: a seeded hash
of (seed, root name, path) puts each file in one split, so no target is in both and adding
roots does not move the other files. Roots given as `unseen_roots` are whole source trees that
training never sees: all of their tasks are in the `unseen` split.
"""

from __future__ import annotations

import ast
import hashlib
import json
import random
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

from reflectrl.atomic_files import atomic_path
from reflectrl.envs.auto_explore.render import file_kind, outline, render_file
from reflectrl.envs.auto_explore.sandbox import (
    DEFAULT_MAX_READ_BYTES,
    DEFAULT_SUFFIXES,
    Sandbox,
    resolve_root,
    valid_name,
)
from reflectrl.envs.auto_explore.shell import (
    DEFAULT_MAX_ACTIONS,
    DEFAULT_MAX_OUTPUT_CHARS,
    RelPath,
    View,
)
from reflectrl.errors import ConfigError

DEFAULT_ROOTS: tuple[str, ...] = ("pkg:gymnasium", "pkg:peft", "pkg:pydantic", "pkg:trl")
PARSE_READ_BYTES = 4 * 1024 * 1024  # files are parsed whole (up to this) to check uniqueness
_ANY_DEF = re.compile(r"^[ \t]*(?:async[ \t]+def|def|class)[ \t]+([A-Za-z_]\w*)", re.MULTILINE)
TEMPLATES = {
    "class": "Which file defines the class `{key}`?",
    "function": "Which file defines the function `{key}`?",
    "heading": 'Which file has a section titled "{key}"?',
    "config_key": "Which file sets the configuration key `{key}`?",
    "config_section": "Which file has the configuration section `{key}`?",
}


class Task(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    id: str
    root: str
    question: str
    target: str
    depth: int
    split: Literal["train", "test", "unseen"]
    kind: str = ""
    key: str = ""

    @field_validator("target")
    @classmethod
    def _relative(cls, target: str) -> str:
        if not all(valid_name(part) for part in target.split("/")):
            raise ValueError(f"target {target!r} is not a relative path of plain names")
        return target

    @model_validator(mode="after")
    def _depth(self) -> Task:
        if self.depth != len(self.parts):
            raise ValueError(f"depth {self.depth} does not match target {self.target!r}")
        return self

    @property
    def parts(self) -> RelPath:
        return tuple(self.target.split("/"))


@dataclass(frozen=True)
class GenerationSettings:
    """The env settings the questions must be answerable under (the env's defaults)."""

    max_actions: int = DEFAULT_MAX_ACTIONS
    max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS
    max_read_bytes: int = DEFAULT_MAX_READ_BYTES
    suffixes: tuple[str, ...] = DEFAULT_SUFFIXES
    test_fraction: float = 0.2


def load_tasks(path: str | Path) -> list[Task]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"tasks file {path} does not exist; make one with autoexplore-tasks")
    tasks: list[Task] = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                tasks.append(Task.model_validate(json.loads(line)))
            except json.JSONDecodeError as err:
                raise ConfigError(f"tasks {path} line {number}: not JSON ({err.msg})") from None
            except ValidationError as err:
                first = err.errors()[0]
                where = ".".join(str(p) for p in first["loc"]) or "task"
                raise ConfigError(f"tasks {path} line {number}: {where}: {first['msg']}") from None
    if not tasks:
        raise ConfigError(f"tasks file {path} holds no tasks")
    ids = Counter(t.id for t in tasks)
    if ids.most_common(1)[0][1] > 1:
        raise ConfigError(f"tasks {path}: task id {ids.most_common(1)[0][0]!r} is repeated")
    return tasks


def write_tasks(tasks: Sequence[Task], path: str | Path) -> None:
    """Atomically (several workers may generate the same file at once)."""
    with atomic_path(Path(path)) as tmp, tmp.open("w", encoding="utf-8") as out:
        for task in tasks:
            out.write(json.dumps(task.model_dump()) + "\n")


def root_id(spec: str) -> str:
    """What a task records as its root: `pkg:NAME` as is (portable), a directory resolved."""
    return spec if spec.startswith("pkg:") else str(resolve_root(spec))


def generate_tasks(
    roots: Sequence[str],
    seed: int,
    max_tasks: int | None = None,
    settings: GenerationSettings | None = None,
    unseen_roots: Sequence[str] = (),
) -> list[Task]:
    """The tasks of `roots` (split by file into train/test) and of `unseen_roots` (all
    `unseen`); `max_tasks` keeps a seeded subset of the former."""
    settings = settings or GenerationSettings()
    if not roots:
        raise ConfigError("no roots to generate tasks from")
    shared = sorted({root_id(r) for r in roots} & {root_id(r) for r in unseen_roots})
    if shared:
        raise ConfigError(f"root {shared[0]} is both a training root and an unseen root")
    tasks: list[Task] = []
    for spec in roots:
        tasks.extend(_root_tasks(root_id(spec), seed, settings))
    if not tasks:
        raise ConfigError(f"no answerable questions found under {', '.join(roots)}")
    if max_tasks is not None and len(tasks) > max_tasks:
        keep = sorted(random.Random(seed).sample(range(len(tasks)), max_tasks))
        tasks = [tasks[i] for i in keep]
    for spec in unseen_roots:
        found = _root_tasks(root_id(spec), seed, settings)
        if not found:
            raise ConfigError(f"unseen root {spec}: no answerable questions found")
        tasks.extend(t.model_copy(update={"split": "unseen"}) for t in found)
    return tasks


def iter_files(sandbox: Sandbox) -> Iterator[RelPath]:
    """Every visible file, depth first in listing order (a stack: no recursion limit)."""
    stack: list[RelPath] = [()]
    while stack:
        parts = stack.pop()
        subdirs = []
        for entry in sandbox.listing(parts) or ():
            path = (*parts, entry.name)
            if entry.is_dir:
                subdirs.append(path)
            else:
                yield path
        stack.extend(reversed(subdirs))


@dataclass
class _FileKeys:
    candidates: list[tuple[str, str]]  # (kind, key) this file could be asked about
    counted: list[tuple[str, str]]  # (family, key) occurrences, for uniqueness over the tree


def _root_tasks(root: str, seed: int, settings: GenerationSettings) -> list[Task]:
    # Not cached: each file is parsed once, and up to PARSE_READ_BYTES of it.
    parser = Sandbox(root, suffixes=settings.suffixes, max_read_bytes=PARSE_READ_BYTES, cache=False)
    env_like = Sandbox(root, suffixes=settings.suffixes, max_read_bytes=settings.max_read_bytes)
    view = View(env_like, settings.max_actions)
    files = list(iter_files(parser))
    if not files:
        raise ConfigError(
            f"root {root}: no files of the allowed types ({' '.join(settings.suffixes)})"
        )
    keys = {path: _file_keys(parser, path) for path in files}
    counts = Counter(item for found in keys.values() for item in found.counted)
    tasks: list[Task] = []
    for path in files:
        unique = [
            (kind, key) for kind, key in keys[path].candidates if counts[(_family(kind), key)] == 1
        ]
        if not unique or not view.reachable(path):
            continue
        rendered = render_file(path[-1], env_like.read(path), settings.max_output_chars)
        shown = [(k, key) for k, key in unique if _item(k, key) in rendered.shown_items]
        if not shown:
            continue
        target = "/".join(path)
        # Keyed by the root's name, not its location: the same tree checked out elsewhere
        # gets the same questions and split.
        name = f"{seed}\0{root if root.startswith('pkg:') else Path(root).name}\0{target}"
        kind, key = random.Random(name).choice(sorted(shown))
        split = "test" if unit_hash(name) < settings.test_fraction else "train"
        digest = hashlib.blake2b(f"{root}\0{target}\0{kind}\0{key}".encode(), digest_size=6)
        tasks.append(
            Task(
                id=f"ae-{digest.hexdigest()}",
                root=root,
                question=TEMPLATES[kind].format(key=key),
                target=target,
                depth=len(path),
                split=split,
                kind=kind,
                key=key,
            )
        )
    return tasks


def _file_keys(sandbox: Sandbox, path: RelPath) -> _FileKeys:
    result = sandbox.read(path)
    if result.text is None:
        return _FileKeys([], [])
    kind = file_kind(path[-1])
    text = result.text
    if kind == "python":
        try:
            tree = ast.parse(text) if not result.truncated else None
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            tree = None
        if tree is None:  # still counts its names, so no other file is asked about them
            return _FileKeys([], [("python", n) for n in _ANY_DEF.findall(text)])
        try:
            counted = [("python", name) for name in _definitions(tree.body)]
        except RecursionError:  # absurdly deep nesting: ask nothing about this file
            return _FileKeys([], [("python", n) for n in _ANY_DEF.findall(text)])
        candidates = [
            ("class" if isinstance(n, ast.ClassDef) else "function", n.name)
            for n in tree.body
            if isinstance(n, _DEFS) and not n.name.startswith("_") and len(n.name) >= 3
        ]
        return _FileKeys(candidates, counted)
    family = {"markdown": "heading", "rst": "heading", "config": "config", "yaml": "config"}
    if kind not in family:
        return _FileKeys([], [])
    items = outline(kind, text)
    usable = [i for i in items if 3 <= len(i) <= 80 and "{" not in i and "`" not in i]
    return _FileKeys(
        [(_question_kind(family[kind], i), i) for i in usable],
        [(family[kind], i) for i in items],
    )


def _question_kind(family: str, item: str) -> str:
    if family == "heading":
        return "heading"
    return "config_section" if item.startswith("[") else "config_key"


_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_BLOCKS = ("body", "orelse", "finalbody", "handlers", "cases")


def _definitions(statements: list[Any]) -> Iterator[str]:
    """Names of all definitions at any nesting level. Definitions are statements, so only
    statement lists are walked (`ast.walk` over every expression node is ~5x slower)."""
    for node in statements:
        if isinstance(node, _DEFS):
            yield node.name
        for field in _BLOCKS:
            block = getattr(node, field, None)
            if isinstance(block, list):
                yield from _definitions(block)


def _family(kind: str) -> str:
    return {"class": "python", "function": "python", "heading": "heading"}.get(kind, "config")


def _item(kind: str, key: str) -> str:
    """How `key` appears among the outline items of `cat`."""
    return {"class": f"class {key}", "function": f"def {key}"}.get(kind, key)


def unit_hash(text: str) -> float:
    """A stable uniform number in [0, 1) from text."""
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64
