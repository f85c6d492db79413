"""Folders that must reach another node of the cluster: the SFT data going to the node that
trains, the adapter it trains coming back, the reflection adapter going to the node that
serves it. Small (MBs): they travel as bytes through Ray's object store, so a cluster needs no
shared filesystem. On the driver's own node the original paths are used as they are.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from reflectrl.atomic_files import atomic_dir
from reflectrl.models.model_dirs import default_cache_dir

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
    with atomic_dir(path) as tmp:
        for relative, data in files.items():
            (tmp / relative).parent.mkdir(parents=True, exist_ok=True)
            (tmp / relative).write_bytes(data)
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
