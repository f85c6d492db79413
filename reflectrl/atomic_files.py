"""The one way every file of a run is written: atomically.

A run is resumed from what it wrote, so no file may ever be seen half-written: a write goes to
a temporary name beside its target and is renamed over it once complete (and flushed to disk).
A writer killed at any point leaves the previous file whole; what it leaves behind is a hidden
`.<name>.<random>.tmp` that the next write of the same file does not read.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A fresh temporary path beside `path` to write to. When the block ends without error
    the file is flushed and renamed over `path`; on any error it is removed and `path` is
    untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        with tmp.open("rb+") as written:  # on disk before the rename makes it the file
            os.fsync(written.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text(path: Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: Path, data: Any) -> None:
    write_text(path, json.dumps(data, indent=2) + "\n")


@contextmanager
def atomic_dir(path: Path, replace: bool = True) -> Iterator[Path]:
    """A fresh temporary folder beside `path` to build in; renamed to `path` (replacing an
    older one; with `replace=False` only an empty one, see `place_dir`) when the block ends
    without error, removed otherwise."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    try:
        yield tmp
        if replace:
            replace_dir(tmp, path)
        else:
            place_dir(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def replace_dir(built: Path, path: Path) -> None:
    """Rename the complete folder `built` to `path`. An older `path` is first moved aside
    (rename cannot replace a non-empty folder), then removed."""
    old = None
    if path.exists():
        old = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.old.", suffix=".tmp"))
        os.replace(path, old / path.name)
    os.replace(built, path)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def place_dir(built: Path, path: Path) -> None:
    """Rename the complete folder `built` to `path` unless `path` holds something. One rename
    decides it (it succeeds over an absent or empty folder and fails over anything else), so
    nothing written to `path` meanwhile is ever replaced: FileExistsError instead."""
    try:
        os.rename(built, path)
    except OSError as err:
        if err.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
            raise FileExistsError(
                errno.EEXIST, "exists and is not an empty folder", str(path)
            ) from err
        raise
