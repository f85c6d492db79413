"""A read-only view of one directory tree: the security boundary of AutoExplore.

Nothing outside the root can be listed or read, whatever the names asked for:
- every path is walked one component at a time from a descriptor of the root, with
  `O_NOFOLLOW | O_DIRECTORY` (`openat`-style, via `dir_fd`), so `..`, absolute paths and
  symlinks (inside the tree or pointing out) never resolve; symlinks are not even listed;
- a name is visible only if it is printable ASCII from a small safe set (no shell
  metacharacters, whitespace, newlines, non-UTF-8 bytes), not hidden (leading dot);
- only directories and regular files with an allowed suffix are visible; fifos, sockets
  and devices are never opened (checked with lstat first; files are also opened with
  `O_NONBLOCK` and re-checked with fstat, so a swap to a fifo cannot block a read);
- at most `max_read_bytes` bytes of a file are ever read from disk; binary or non-UTF-8
  content is refused.
Known limits: a hard link inside the root is the same file as its other names and is read
like any file (the root's owner controls that); names outside the safe set (e.g. non-ASCII)
are invisible; a directory is read up to `MAX_SCAN_ENTRIES` entries.
No shell, no subprocess and no `chdir` anywhere.
"""

from __future__ import annotations

import codecs
import importlib.metadata
import importlib.util
import os
import re
import stat
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from reflectrl.errors import ConfigError

# Names: letters, digits, `_ + -` and inner dots; at most 128 characters. The first character
# may not be a dot (hidden files, `.` and `..`).
SAFE_NAME = re.compile(r"[A-Za-z0-9_+-][A-Za-z0-9_.+-]{0,127}")
DEFAULT_SUFFIXES: tuple[str, ...] = (
    ".py",
    ".pyi",
    ".md",
    ".rst",
    ".txt",
    ".toml",
    ".cfg",
    ".ini",
    ".yaml",
    ".yml",
    ".json",
)
IGNORED_DIRS = frozenset({"__pycache__"})  # byte-code caches hold no allowed files
DEFAULT_MAX_READ_BYTES = 64 * 1024
MAX_SCAN_ENTRIES = 10_000  # a directory with more raw entries is read only this far

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_READ_CACHE = 256  # files whose read result is kept (a cached sandbox is for a fixed tree)


@dataclass(frozen=True)
class Entry:
    name: str
    is_dir: bool


@dataclass(frozen=True)
class ReadResult:
    """A file's text (`error` None), or why it cannot be shown (`text` None)."""

    text: str | None = None
    error: str | None = None
    truncated: bool = False  # only the first `bytes_read` bytes of a longer file were read
    bytes_read: int = 0


def valid_name(name: str) -> bool:
    return SAFE_NAME.fullmatch(name) is not None


def resolve_root(spec: str) -> Path:
    """A root given as a directory or as `pkg:NAME` (an installed package's source tree).

    Packages are located with `importlib.util.find_spec`, which does not import them.
    """
    if spec.startswith("pkg:"):
        name = spec[4:]
        if not name.isidentifier():
            raise ConfigError(f"root {spec!r}: expected pkg:<top-level package name>")
        try:
            found = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            found = None
        locations = list(found.submodule_search_locations or []) if found else []
        if not locations:
            raise ConfigError(f"root {spec!r}: no installed package {name!r} with a source tree")
        path = Path(locations[0])
    else:
        path = Path(spec).expanduser()
    try:
        real = Path(os.path.realpath(path, strict=True))
    except OSError:
        raise ConfigError(f"root {spec}: does not exist") from None
    if not real.is_dir():
        raise ConfigError(f"root {spec}: is not a directory")
    return real


def root_versions(roots: tuple[str, ...] | list[str]) -> str:
    """`pkg:NAME=VERSION` for each package root (the distributions that install NAME), the
    spec alone for a directory: what a cache of tasks generated from these roots depends on.
    """
    installed = importlib.metadata.packages_distributions()
    parts = []
    for spec in roots:
        if spec.startswith("pkg:"):
            dists = sorted(installed.get(spec[4:], []))
            spec += "=" + ",".join(f"{d}-{importlib.metadata.version(d)}" for d in dists)
        parts.append(spec)
    return ";".join(parts)


class Sandbox:
    """Lists and reads inside `root` only. Paths are tuples of names relative to the root.

    With `cache=True` listings and reads are remembered (for a tree that does not change
    during training); the checks above happen on the first access either way.
    """

    def __init__(
        self,
        root: str | Path,
        *,
        suffixes: tuple[str, ...] = DEFAULT_SUFFIXES,
        max_read_bytes: int = DEFAULT_MAX_READ_BYTES,
        cache: bool = True,
    ) -> None:
        if max_read_bytes < 1:
            raise ConfigError(f"max_read_bytes must be >= 1 (got {max_read_bytes})")
        self.spec = str(root)
        self.root = resolve_root(self.spec)
        self.suffixes = tuple(s.lower() for s in suffixes)
        self.max_read_bytes = max_read_bytes
        self.cache = cache
        self._listings: dict[tuple[str, ...], tuple[Entry, ...] | None] = {}
        self._reads: OrderedDict[tuple[str, ...], ReadResult] = OrderedDict()
        if self.listing(()) is None:
            raise ConfigError(f"root {self.spec}: cannot be listed (permission denied?)")

    # --- public API -----------------------------------------------------------------------

    def listing(self, parts: tuple[str, ...]) -> tuple[Entry, ...] | None:
        """Visible entries of a directory (directories first, each group sorted by name);
        None when `parts` is not a visible directory."""
        if self.cache and parts in self._listings:
            return self._listings[parts]
        result = self._scan(parts)
        if self.cache:
            self._listings[parts] = result
        return result

    def read(self, parts: tuple[str, ...]) -> ReadResult:
        """The text of a visible regular file, at most `max_read_bytes` of it."""
        if self.cache and parts in self._reads:
            self._reads.move_to_end(parts)
            return self._reads[parts]
        result = self._read(parts)
        if self.cache:
            self._reads[parts] = result
            if len(self._reads) > _READ_CACHE:
                self._reads.popitem(last=False)
        return result

    def visible_file(self, name: str) -> bool:
        return valid_name(name) and os.path.splitext(name)[1].lower() in self.suffixes

    def visible_dir(self, name: str) -> bool:
        return valid_name(name) and name not in IGNORED_DIRS

    # --- internals ------------------------------------------------------------------------

    def _open_dir(self, parts: tuple[str, ...]) -> int:
        """A descriptor of root/parts, walked one name at a time without following links."""
        fd = os.open(self.root, _DIR_FLAGS)
        try:
            for name in parts:
                if not self.visible_dir(name):
                    raise FileNotFoundError(name)
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = child
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _scan(self, parts: tuple[str, ...]) -> tuple[Entry, ...] | None:
        try:
            fd = self._open_dir(parts)
        except OSError:
            return None
        dirs: list[str] = []
        files: list[str] = []
        try:
            with os.scandir(fd) as it:
                for count, entry in enumerate(it):
                    if count >= MAX_SCAN_ENTRIES:
                        break
                    name = entry.name
                    # d_type (or lstat through the directory's descriptor): never follows links.
                    if entry.is_dir(follow_symlinks=False):
                        if self.visible_dir(name):
                            dirs.append(name)
                    elif entry.is_file(follow_symlinks=False) and self.visible_file(name):
                        files.append(name)
        except OSError:
            return None
        finally:
            os.close(fd)
        return tuple(Entry(n, True) for n in sorted(dirs)) + tuple(
            Entry(n, False) for n in sorted(files)
        )

    def _read(self, parts: tuple[str, ...]) -> ReadResult:
        if not parts or not self.visible_file(parts[-1]):
            return ReadResult(error="not a readable file")
        name = parts[-1]
        try:
            dir_fd = self._open_dir(parts[:-1])
        except OSError:
            return ReadResult(error="not a readable file")
        try:
            before = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if not stat.S_ISREG(before.st_mode):
                return ReadResult(error="not a regular file")  # never open fifos or devices
            fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
        except PermissionError:
            return ReadResult(error="permission denied")
        except OSError:
            return ReadResult(error="not a readable file")
        finally:
            os.close(dir_fd)
        try:
            after = os.fstat(fd)
            same = (after.st_dev, after.st_ino) == (before.st_dev, before.st_ino)
            if not stat.S_ISREG(after.st_mode) or not same:
                return ReadResult(error="not a regular file")
            data = _read_at_most(fd, self.max_read_bytes)
        except OSError:
            return ReadResult(error="not a readable file")
        finally:
            os.close(fd)
        truncated = after.st_size > len(data)
        return _decode(data, truncated)


def _read_at_most(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    left = limit
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 16))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _decode(data: bytes, truncated: bool) -> ReadResult:
    if b"\x00" in data:
        return ReadResult(error="binary file", bytes_read=len(data))
    # A cut file may end inside a multi-byte character: keep that tail undecoded.
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    try:
        text = decoder.decode(data, final=not truncated)
    except UnicodeDecodeError:
        return ReadResult(error="binary file (not UTF-8 text)", bytes_read=len(data))
    return ReadResult(text=text, truncated=truncated, bytes_read=len(data))
