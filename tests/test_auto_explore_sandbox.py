"""The AutoExplore sandbox: no command may read, list or reveal anything outside the root.

The tree under test is surrounded by canaries: files outside the root, and symlinks, fifos,
sockets and oddly named files inside it. Each escape attempt has its own test, then a
property test throws >= 10,000 random command strings at the shell.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reflectrl.envs.auto_explore import sandbox as sandbox_module
from reflectrl.envs.auto_explore.sandbox import Entry, Sandbox, resolve_root
from reflectrl.envs.auto_explore.shell import Shell, View
from reflectrl.errors import ConfigError

CANARY = "CANARY-7f3a9c-SECRET"


@dataclass
class Fenced:
    base: Path  # holds both the root and the canaries
    root: Path
    outside: Path
    markers: tuple[str, ...]  # none of these may appear in any output

    def shell(self, cache: bool = True, max_read_bytes: int = 4096) -> Shell:
        return Shell(View(Sandbox(self.root, cache=cache, max_read_bytes=max_read_bytes), 40))


def build_fenced(base: Path) -> Fenced:
    outside = base / "zone_out"
    (outside / "vault").mkdir(parents=True)
    (outside / "vault" / "leak.py").write_text(f"# {CANARY} in a dir\nclass Leak: ...\n")
    (outside / "leak.txt").write_text(f"{CANARY} outside the root\n")
    (outside / "ok.py").write_text(f"{CANARY} same name as a root file\n")
    root = base / "root"
    (root / "sub").mkdir(parents=True)
    (root / "ok.py").write_text("class Fine:\n    pass\n")
    (root / "notes.md").write_text("# Notes\nnothing secret\n")
    (root / "sub" / "inner.py").write_text("def inner_fn():\n    return 1\n")
    (root / "binary.txt").write_bytes(b"abc\x00def")
    (root / "latin.txt").write_bytes("caf\u00e9 na\u00efve".encode("latin-1"))
    (root / "big.py").write_text("x = 1\n" * 100_000)
    (root / ".hidden.py").write_text(f"{CANARY} hidden\n")
    # Symlinks: out of the root (relative and absolute), to a dir outside, inside the root.
    (root / "link_rel.py").symlink_to("../zone_out/leak.txt")
    (root / "link_abs.py").symlink_to(outside / "leak.txt")
    (root / "link_dir").symlink_to("../zone_out")
    (root / "sub" / "link_up").symlink_to("../..")
    (root / "inner_link.py").symlink_to("ok.py")
    # Special files and names that a shell would interpret.
    os.mkfifo(root / "fifo.py")
    for name in ("semi;colon.py", "new\nline.py", "sp ace.py", "$(whoami).py", "star*.py"):
        (root / name).write_text(f"{CANARY} odd name\n")
    os.close(os.open(os.fsencode(root) + b"/bad\xff\xfe.py", os.O_CREAT | os.O_WRONLY, 0o644))
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(root / "sock.py"))
    finally:
        sock.close()
    markers = (CANARY, str(base), "zone_out", "vault", "leak")
    return Fenced(base, root, outside, markers)


@pytest.fixture
def fenced(tmp_path: Path) -> Fenced:
    return build_fenced(tmp_path)


def assert_clean(fenced: Fenced, output: str) -> None:
    for marker in fenced.markers:
        assert marker not in output, (marker, output)


def run_with_timeout(fn: Callable[[], object], seconds: float = 10.0) -> object:
    """Runs fn in a thread: a blocking open (a fifo) fails the test instead of hanging it."""
    box: list[object] = []
    thread = threading.Thread(target=lambda: box.append(fn()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "the call blocked"
    return box[0]


def test_listing_shows_only_safe_plain_entries(fenced: Fenced) -> None:
    sandbox = Sandbox(fenced.root)
    assert sandbox.listing(()) == (
        Entry("sub", True),
        Entry("big.py", False),
        Entry("binary.txt", False),
        Entry("latin.txt", False),
        Entry("notes.md", False),
        Entry("ok.py", False),
    )
    assert sandbox.listing(("sub",)) == (Entry("inner.py", False),)  # link_up is not listed


@pytest.mark.parametrize(
    "command",
    [
        "cd ..",
        "cd ../zone_out",
        "cd ../..",
        "cd /",
        f"cd {'/'}tmp",
        "cd ~",
        "cd link_dir",
        "cd sub/link_up",
        "cat ../zone_out/leak.txt",
        "cat ../../zone_out/leak.txt",
        "cat link_rel.py",
        "cat link_abs.py",
        "cat inner_link.py",
        "cat link_dir/leak.txt",
        "cat sub/../../zone_out/leak.txt",
        "cat .hidden.py",
        "cat semi;colon.py",
        "cat $(whoami).py",
        "cat star*.py",
        "cat *",
        "cat ok.py; cat ../zone_out/leak.txt",
        "cat ok.py && cat link_rel.py",
        "cat ok.py | cat",
        "cat `cat link_rel.py`",
        "cat ok.py\ncat link_rel.py",
        "cat new\nline.py",
        "cat sp ace.py",
        "cat bad\udcff\udcfe.py",
        "cat ok.py\x00../zone_out/leak.txt",
        "cat %2e%2e/zone_out/leak.txt",
        "cat sock.py",
        "id link_rel.py",
        "id ../zone_out/leak.txt",
        "ls ..",
    ],
)
def test_escape_attempts_are_errors(fenced: Fenced, command: str) -> None:
    sandbox_module_root = str(fenced.outside)
    for shell in (fenced.shell(), fenced.shell(cache=False)):
        result = shell.execute(command)
        assert result.status == "error", (command, result.output)
        assert result.output.startswith("error: ")
        assert result.identified is None
        assert shell.cwd == ()
        assert sandbox_module_root not in result.output
        assert_clean(fenced, result.output)


@pytest.mark.parametrize(
    "command", ["cd\nsub", "cat\tok.py", "cat ok.py\n", "cd sub\r", "cd\x0bsub"]
)
def test_control_characters_are_refused_even_around_valid_names(
    fenced: Fenced, command: str
) -> None:
    shell = fenced.shell()
    result = shell.execute(command)
    assert result.status == "error" and "unprintable" in result.output
    assert shell.cwd == () and not shell.read


def test_escapes_from_a_subdirectory(fenced: Fenced) -> None:
    shell = fenced.shell()
    assert shell.execute("cd sub").status == "ok"
    for command in ("cd link_up", "cat link_up", "cd ../..", "cat ../../zone_out/leak.txt"):
        result = shell.execute(command)
        assert result.status == "error" and shell.cwd == ("sub",)
        assert_clean(fenced, result.output)
    assert shell.execute("cd ..").status == "ok" and shell.cwd == ()
    assert shell.execute("cd ..").output == "error: cd ..: already at the repository root"


def test_a_fifo_is_never_opened(fenced: Fenced, monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[object] = []
    real_open = os.open

    def spy(path: object, *args: object, **kwargs: object) -> int:
        opened.append(path)
        return real_open(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(sandbox_module.os, "open", spy)
    sandbox = Sandbox(fenced.root)
    result = run_with_timeout(lambda: sandbox.read(("fifo.py",)))
    assert result.text is None and result.error
    assert "fifo.py" not in opened
    output = run_with_timeout(lambda: fenced.shell().run_command("cat fifo.py"))
    assert str(output).startswith("error: ")


def test_a_file_swapped_for_a_fifo_after_the_check_does_not_block(
    fenced: Fenced, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The lstat says "regular file" (as if checked just before the swap); the open must
    # still not block (O_NONBLOCK) and the fstat re-check must refuse it.
    real_stat = os.stat

    def lying_stat(path: object, *args: object, **kwargs: object) -> os.stat_result:
        st = real_stat(path, *args, **kwargs)  # type: ignore[arg-type]
        if path == "fifo.py":
            fields = list(st)
            fields[0] = stat.S_IFREG | 0o644
            return os.stat_result(fields)
        return st

    monkeypatch.setattr(sandbox_module.os, "stat", lying_stat)
    monkeypatch.setattr(Sandbox, "visible_file", lambda self, name: True)
    result = run_with_timeout(lambda: Sandbox(fenced.root)._read(("fifo.py",)))
    assert result.text is None and result.error == "not a regular file"


def test_the_open_itself_does_not_follow_a_symlink(
    fenced: Fenced, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As if the lstat had seen the file just before it was swapped for a symlink: the stat
    # follows the link here, so only the open's O_NOFOLLOW stands in the way.
    real_stat = os.stat

    def following_stat(path: object, *args: object, **kwargs: object) -> os.stat_result:
        kwargs.pop("follow_symlinks", None)
        return real_stat(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(sandbox_module.os, "stat", following_stat)
    sandbox = Sandbox(fenced.root, cache=False)
    for parts in [("link_rel.py",), ("link_abs.py",), ("inner_link.py",)]:
        result = sandbox.read(parts)
        assert result.text is None, parts


def test_special_files_are_invisible_and_unreadable(fenced: Fenced) -> None:
    sandbox = Sandbox(fenced.root)
    names = {e.name for e in sandbox.listing(()) or ()}
    assert not names & {"fifo.py", "sock.py", "link_rel.py", "link_dir", "inner_link.py"}
    for parts in [("sock.py",), ("fifo.py",), ("link_rel.py",), ("inner_link.py",)]:
        # visible_file() passes for these names: the refusal comes from lstat / O_NOFOLLOW.
        assert run_with_timeout(lambda p=parts: sandbox.read(p)).text is None  # type: ignore[misc]
    devnull = fenced.root / "null.py"
    try:
        os.mknod(devnull, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except (PermissionError, OSError):
        return  # no CAP_MKNOD here; fifos and sockets above cover the path
    assert "null.py" not in {e.name for e in Sandbox(fenced.root).listing(()) or ()}
    assert Sandbox(fenced.root).read(("null.py",)).text is None


def test_direct_paths_past_the_root_are_refused(fenced: Fenced) -> None:
    sandbox = Sandbox(fenced.root, cache=False)
    for parts in [
        ("..", "zone_out", "leak.txt"),
        ("link_dir", "leak.txt"),
        ("sub", "link_up", "zone_out", "leak.txt"),
        (str(fenced.outside / "leak.txt"),),
        ("sub", "..", "..", "zone_out", "leak.txt"),
        ("",),
        (),
    ]:
        assert sandbox.read(parts).text is None
    for parts in [("..",), ("link_dir",), ("sub", "link_up"), (str(fenced.outside),), (".",)]:
        assert sandbox.listing(parts) is None


def test_a_symlink_swapped_in_after_listing_is_not_followed(fenced: Fenced) -> None:
    shell = fenced.shell(cache=True)
    shell.menu()  # the listing is cached now
    (fenced.root / "ok.py").unlink()
    (fenced.root / "ok.py").symlink_to(fenced.outside / "ok.py")
    result = shell.execute("cat ok.py")
    assert result.status == "error"
    assert_clean(fenced, result.output)
    # A directory replaced by a link to the outside: reads through it fail too.
    assert shell.execute("cd sub").status == "ok"
    shutil.rmtree(fenced.root / "sub")
    (fenced.root / "sub").symlink_to(fenced.outside / "vault")
    (fenced.outside / "vault" / "inner.py").write_text(CANARY)
    result = shell.execute("cat inner.py")
    assert result.status == "error"
    assert_clean(fenced, result.output)


def test_at_most_max_read_bytes_are_read(fenced: Fenced, monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[int] = []
    real_read = os.read

    def counting_read(fd: int, n: int) -> bytes:
        data = real_read(fd, n)
        reads.append(len(data))
        return data

    monkeypatch.setattr(sandbox_module.os, "read", counting_read)
    result = Sandbox(fenced.root, max_read_bytes=1000).read(("big.py",))
    assert sum(reads) == 1000 and result.bytes_read == 1000 and result.truncated
    output = fenced.shell(max_read_bytes=1000).run_command("cat big.py")
    assert "only the first 1000 bytes were read" in output
    assert len(output) <= 800


def test_binary_and_non_utf8_files_are_refused(fenced: Fenced) -> None:
    shell = fenced.shell()
    for name in ("binary.txt", "latin.txt"):
        result = shell.execute(f"cat {name}")
        assert result.status == "error" and "binary" in result.output
    # A multi-byte character cut by the byte limit is not mistaken for binary.
    (fenced.root / "accents.md").write_text("# T\n" + "\u00e9" * 600)
    result = Sandbox(fenced.root, max_read_bytes=5).read(("accents.md",))
    assert result.text == "# T\n" and result.truncated


def test_unreadable_files_are_errors(fenced: Fenced, monkeypatch: pytest.MonkeyPatch) -> None:
    locked = fenced.root / "locked.py"
    locked.write_text(CANARY)
    locked.chmod(0)
    if os.geteuid() == 0:  # root reads anything: make the open fail as it would for a user
        real_open = os.open

        def denying_open(path: object, *args: object, **kwargs: object) -> int:
            if path == "locked.py":
                raise PermissionError(13, "Permission denied")
            return real_open(path, *args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(sandbox_module.os, "open", denying_open)
    result = fenced.shell().execute("cat locked.py")
    assert result.status == "error" and "permission denied" in result.output
    assert_clean(fenced, result.output)


def test_bad_roots_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        Sandbox(tmp_path / "missing")
    (tmp_path / "file.py").write_text("")
    with pytest.raises(ConfigError, match="not a directory"):
        Sandbox(tmp_path / "file.py")
    with pytest.raises(ConfigError, match="no installed package"):
        resolve_root("pkg:no_such_package_xyz")
    with pytest.raises(ConfigError, match="pkg:<top-level"):
        resolve_root("pkg:os.path")
    assert resolve_root("pkg:gymnasium").name == "gymnasium"


def test_root_given_as_a_symlink_is_resolved_once(fenced: Fenced) -> None:
    alias = fenced.base / "alias"
    alias.symlink_to(fenced.root)
    assert Sandbox(alias).root == fenced.root.resolve()
    assert Shell(View(Sandbox(alias), 40)).run_command("cat ok.py").startswith("Defines:")


# --- property test -------------------------------------------------------------------------

FRAGMENTS = [
    "..",
    "/",
    "../",
    "~",
    "*",
    "?",
    ";",
    "|",
    "&&",
    "$(",
    ")",
    "`",
    "\n",
    "\r",
    "\x00",
    "\t",
    " ",
    "\udcff",
    "\\",
    "'",
    '"',
    "%2e",
    ".",
    "-",
    "link_rel.py",
    "link_abs.py",
    "link_dir",
    "link_up",
    "inner_link.py",
    "fifo.py",
    "sock.py",
    ".hidden.py",
    "sub",
    "ok.py",
    "leak.txt",
    "leak.py",
    "zone_out",
    "vault",
    CANARY,
]


def commands(base: Path) -> st.SearchStrategy[str]:
    absolute = [str(base / "zone_out"), str(base / "zone_out" / "leak.txt"), str(base)]
    pieces = st.sampled_from(FRAGMENTS + absolute)
    argument = st.one_of(
        pieces,
        st.lists(pieces, min_size=1, max_size=6).map("".join),
        st.text(max_size=24),
    )
    verb = st.one_of(
        st.sampled_from(["cd", "cat", "id", "ls", "CD", "", "cd..", "rm"]), st.text(max_size=4)
    )
    gap = st.sampled_from([" ", "  ", "\t", "", " \n"])
    composed = st.tuples(verb, gap, argument).map("".join)
    # Valid moves too, so the escapes are also tried from inside `sub` and after reads.
    valid = st.sampled_from(["cd sub", "cd ..", "cat ok.py", "cat inner.py", "cat notes.md"])
    return st.one_of(composed, composed, st.text(max_size=40), valid)


def test_random_commands_never_reveal_the_outside(tmp_path: Path) -> None:
    fenced = build_fenced(tmp_path)
    seen = {"commands": 0, "ok": 0}

    @settings(
        max_examples=500,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(st.lists(commands(tmp_path), min_size=20, max_size=20), st.booleans())
    def run(batch: list[str], cache: bool) -> None:
        shell = fenced.shell(cache=cache)
        for command in batch:
            result = shell.execute(command)
            seen["commands"] += 1
            seen["ok"] += result.status != "error"
            assert_clean(fenced, result.output)
            assert_clean(fenced, shell.listing_text())
            assert all(m not in " ".join(shell.menu()) for m in fenced.markers)
            assert shell.cwd in ((), ("sub",))

    run()
    assert seen["commands"] >= 10_000
    assert seen["ok"] > 0  # the strategy does reach valid commands


def iter_outputs(shell: Shell, commands_: list[str]) -> Iterator[str]:
    for command in commands_:
        yield shell.run_command(command)


def test_valid_commands_work_in_the_fenced_tree(fenced: Fenced) -> None:
    outputs = list(
        iter_outputs(fenced.shell(), ["cat ok.py", "cd sub", "cat inner.py", "id inner.py"])
    )
    assert outputs[0].startswith("Defines: class Fine")
    assert outputs[1] == "Changed directory to sub."
    assert "def inner_fn" in outputs[2]
    assert outputs[3] == "You identified sub/inner.py."
