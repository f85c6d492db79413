"""Folders that must reach another node of the cluster: the SFT data going to the node that
trains, the adapter it trains coming back, the reflection adapter going to the node that
serves it. Small (MBs): they travel as bytes through Ray's object store, so a cluster needs no
shared filesystem. On the driver's own node the original paths are used as they are.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from reflectrl.models.loading import default_cache_dir

Packed = dict[str, bytes]  # relative path -> contents


def pack_dir(path: Path) -> Packed:
    return {
        str(f.relative_to(path)): f.read_bytes()
        for f in sorted(Path(path).rglob("*"))
        if f.is_file()
    }


def unpack_dir(files: Packed, path: Path) -> Path:
    """Write `files` as folder `path`, complete or not at all (built aside, then renamed)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    for relative, data in files.items():
        target = tmp / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    tmp.mkdir(parents=True, exist_ok=True)
    if path.exists():
        shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp.rename(path)
    return path


def local_copy(original: str | Path, files: Packed) -> Path:
    """`original` when this node has it with the same contents, else a copy of `files` in
    this node's cache (by content hash: unpacked once per node)."""
    original = Path(original)
    if original.is_dir() and pack_dir(original) == files:
        return original
    digest = hashlib.sha256()
    for relative in sorted(files):
        digest.update(relative.encode() + b"\0" + files[relative])
    cached = default_cache_dir() / "node_files" / f"{original.name}-{digest.hexdigest()[:16]}"
    if not cached.is_dir():
        unpack_dir(files, cached)
    return cached
