"""Every file a run writes goes through reflectrl/atomic_files.py, and a writer killed mid-write
leaves the previous file (or folder) whole."""

from __future__ import annotations

import ast
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from reflectrl.atomic_files import atomic_dir, atomic_path, write_json, write_text

PACKAGE = Path(__file__).resolve().parents[1] / "reflectrl"

# Writes that do not go through atomic_files, and why each may not.
ALLOWED = {
    # Appended one row or line at a time, flushed per row; readers skip a torn last line.
    "rl/metrics.py": 1,
    # Logs, appended.
    "experiment/grid.py": 1,
    # launch.log, appended (what the libraries printed before it existed, then descriptor 2),
    # and the terminal's stderr, reopened for our own lines.
    "console.py": 2,
    "reflection/server.py": 1,
    # Shared caches that concurrent processes may build at once: the first complete build is
    # kept, never replaced under a reader (built in a temporary folder, renamed once).
    "models/model_dirs.py": 3,
    "envs/alfworld/generator.py": 4,
    # atomic_files itself.
    "atomic_files.py": 4,
}
ATOMIC = {"atomic_path", "atomic_dir"}


def _root_name(node: ast.expr) -> str | None:
    """The variable an expression like `tmp / "a" / name` or `tmp.parent` starts from."""
    while isinstance(node, ast.BinOp | ast.Attribute | ast.Call):
        node = node.left if isinstance(node, ast.BinOp) else (
            node.func if isinstance(node, ast.Call) else node.value
        )  # fmt: skip
    return node.id if isinstance(node, ast.Name) else None


def _opens_for_writing(node: ast.Call) -> bool:
    modes = [*node.args, *(k.value for k in node.keywords if k.arg == "mode")]
    texts = [c.value for m in modes for c in ast.walk(m) if isinstance(c, ast.Constant)]
    return any(isinstance(t, str) and t[:1] in ("w", "a", "x") for t in texts)


def direct_writes(source: str) -> list[str]:
    """Calls in `source` that write or rename a file other than through a temporary path that
    `with atomic_path(...) as tmp` / `atomic_dir` handed out."""
    tree = ast.parse(source)
    staged = {
        item.optional_vars.id
        for node in ast.walk(tree)
        if isinstance(node, ast.With)
        for item in node.items
        if isinstance(item.context_expr, ast.Call)
        and getattr(item.context_expr.func, "id", None) in ATOMIC
        and isinstance(item.optional_vars, ast.Name)
    }
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        if isinstance(node.func, ast.Name):  # the built-in open(path, "w")
            receiver = node.args[0] if node.args else node.func
            writes = node.func.id == "open" and _opens_for_writing(node)
        elif isinstance(node.func, ast.Attribute):
            attr, receiver = node.func.attr, node.func.value
            if isinstance(receiver, ast.Name) and receiver.id == "os":
                writes = attr in {"replace", "rename", "fdopen"}
            elif attr == "open":
                writes = _opens_for_writing(node)
            else:  # Path methods (str.replace takes two arguments)
                writes = attr in {"write_text", "write_bytes", "rename", "touch"} or (
                    attr == "replace"
                    and len(node.args) == 1
                    and _root_name(receiver) != "dataclasses"
                )
        else:
            continue
        if writes and _root_name(receiver) not in staged:
            found.append(f"line {node.lineno}: {ast.unparse(node)[:80]}")
    return found


def test_every_file_a_run_writes_goes_through_atomic_files() -> None:
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        writes = direct_writes(path.read_text())
        if len(writes) != ALLOWED.get(relative, 0):
            offenders[relative] = writes
    assert not offenders, (
        "write run files with reflectrl.atomic_files (write_text, write_json, atomic_path, "
        f"atomic_dir), or add the file to ALLOWED with the reason: {offenders}"
    )


def test_the_scan_sees_a_direct_write() -> None:
    assert direct_writes("from pathlib import Path\nPath('x').write_text('y')\n")
    assert direct_writes("open(p, 'w').write('y')\n")
    assert direct_writes("import os\nos.replace(a, b)\n")
    assert not direct_writes("with atomic_path(p) as tmp:\n    tmp.write_text('y')\n")
    assert not direct_writes("s = 'a'.replace('a', 'b')\n")
    assert not direct_writes("with atomic_dir(p) as tmp:\n    (tmp / 'a').write_bytes(b'')\n")


KILLED_MID_WRITE = """
import sys, time
from pathlib import Path
from reflectrl.atomic_files import atomic_dir, atomic_path
target = Path(sys.argv[1])
if sys.argv[2] == "file":
    with atomic_path(target) as tmp, tmp.open("w") as out:
        out.write("new contents, half written")
        out.flush()
        print("writing", flush=True)
        time.sleep(60)
else:
    with atomic_dir(target) as tmp:
        (tmp / "a.json").write_text("{}")
        print("writing", flush=True)
        time.sleep(60)
"""


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_a_writer_killed_mid_write_leaves_the_previous_one_whole(tmp_path: Path, kind: str) -> None:
    target = tmp_path / ("metrics.json" if kind == "file" else "checkpoint")
    if kind == "file":
        write_json(target, {"iteration": 3})
    else:
        with atomic_dir(target) as built:
            (built / "state.json").write_text('{"iteration": 3}')
    writer = subprocess.Popen(
        [sys.executable, "-c", KILLED_MID_WRITE, str(target), kind],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert writer.stdout is not None and writer.stdout.readline() == "writing\n"
    writer.send_signal(signal.SIGKILL)
    assert writer.wait(timeout=30) == -signal.SIGKILL
    if kind == "file":
        assert target.read_text() == '{\n  "iteration": 3\n}\n'
    else:
        assert [p.name for p in target.iterdir()] == ["state.json"]
    # The killed writer's leftover is hidden and does not stop the next write.
    assert all(p.name.startswith(".") for p in tmp_path.iterdir() if p != target)
    if kind == "file":
        write_text(target, "next")
        assert target.read_text() == "next"
    else:
        with atomic_dir(target) as built:
            (built / "next.json").write_text("{}")
        assert [p.name for p in target.iterdir()] == ["next.json"]


def test_an_error_mid_write_keeps_the_old_file_and_leaves_nothing(tmp_path: Path) -> None:
    target = tmp_path / "config.yaml"
    write_text(target, "old")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("disk full")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["config.yaml"]


def test_a_folder_built_without_replace_never_replaces_anything(tmp_path: Path) -> None:
    target = tmp_path / "export"
    target.mkdir()  # empty: taken
    with atomic_dir(target, replace=False) as built:
        (built / "a.json").write_text("{}")
    assert [p.name for p in target.iterdir()] == ["a.json"]
    with pytest.raises(FileExistsError), atomic_dir(target, replace=False) as built:
        (built / "b.json").write_text("{}")
    assert [p.name for p in target.iterdir()] == ["a.json"]
    assert [p.name for p in tmp_path.iterdir()] == ["export"]  # the build is removed
