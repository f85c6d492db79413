"""The import contracts in pyproject.toml ([tool.importlinter]) hold, and a new upward import
breaks them with a message that names it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=root, env=env, capture_output=True, text=True
    )


def test_the_package_keeps_its_import_contracts() -> None:
    result = lint_imports(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_an_upward_import_breaks_a_contract_and_is_named(tmp_path: Path) -> None:
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    shutil.copytree(REPO / "reflectrl", tmp_path / "reflectrl",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    policy = tmp_path / "reflectrl" / "models" / "policy.py"
    policy.write_text(policy.read_text() + "\nfrom reflectrl.rl.driver import Run  # noqa\n")
    result = lint_imports(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "models are model math: they import only config and errors BROKEN" in result.stdout
    assert "reflectrl.models.policy -> reflectrl.rl.driver" in result.stdout


def import_cycles(package: str) -> list[list[str]]:
    """The import cycles between modules of `package` (strongly connected components)."""
    import grimp

    graph = grimp.build_graph(package)
    imports = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(module: str) -> None:  # Tarjan's algorithm
        index[module] = low[module] = len(index)
        stack.append(module)
        for imported in imports[module]:
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = [stack.pop()]
            while component[-1] != module:
                component.append(stack.pop())
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(imports):
        if module not in index:
            visit(module)
    return cycles


def test_no_module_imports_itself_through_others() -> None:
    assert import_cycles("reflectrl") == [], "import cycles between these modules"


def test_a_cycle_is_found_and_named(tmp_path: Path) -> None:
    package = tmp_path / "loop"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from loop import b\n")
    (package / "b.py").write_text("from loop import c\n")
    (package / "c.py").write_text("import loop.a\n")
    (package / "d.py").write_text("from loop import a\n")
    sys.path.insert(0, str(tmp_path))
    try:
        assert import_cycles("loop") == [["loop.a", "loop.b", "loop.c"]]
    finally:
        sys.path.remove(str(tmp_path))
