"""The import contracts in pyproject.toml ([tool.importlinter]) hold, and a new upward import
breaks them with a message that names it."""

from __future__ import annotations

import ast
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


def package_imports(package: str, root: Path) -> dict[str, set[str]]:
    """Each module of `package` (a folder under `root`) -> the modules of `package` whose code
    it runs on import, at any depth of its code (function bodies too). `import a.b` runs a.b;
    `from a import b` runs a's `__init__` and reads from it, and runs a.b where b is a module.
    Import-linter's graph (grimp) records only a.b in that case, so a cycle through a
    package's `__init__` (a -> a.x -> a.y -> `from a import b` -> a) goes unseen there."""
    files = {
        ".".join(f.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): f
        for f in sorted((root / package).rglob("*.py"))
    }
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        here = module if path.name == "__init__.py" else module.rpartition(".")[0]
        imported: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the package `level` steps up
                    anchor = here.split(".")[: len(here.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                imported.add(base)
                imported.update(f"{base}.{alias.name}" for alias in node.names)
        graph[module] = {m for m in imported if m in files and m != module}
    return graph


def import_cycles(package: str, root: Path = REPO) -> list[list[str]]:
    """The import cycles between modules of `package` (strongly connected components)."""
    imports = package_imports(package, root)
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


def write_package(root: Path, name: str, modules: dict[str, str]) -> None:
    (root / name).mkdir()
    for module, code in modules.items():
        (root / name / f"{module}.py").write_text(code)


def test_a_cycle_is_found_and_named(tmp_path: Path) -> None:
    write_package(tmp_path, "loop", {
        "__init__": "",
        "a": "from loop import b\n",
        "b": "from loop import c\n",
        "c": "import loop.a\n",
        "d": "from loop import a\n",
    })  # fmt: skip
    assert import_cycles("loop", tmp_path) == [["loop.a", "loop.b", "loop.c"]]


def test_a_cycle_through_a_package_init_is_found(tmp_path: Path) -> None:
    """The shape ALFWorld's package had: its `__init__` imports env, env imports generator,
    generator imports scene, and scene takes catalog `from` the package (running its
    `__init__`)."""
    write_package(tmp_path, "game", {
        "__init__": "from game.env import Env\n",
        "env": "def load():\n    from game.generator import make\n",
        "generator": "from game.scene import Scene\n",
        "scene": "from game import catalog\n",
        "catalog": "ROOMS = 1\n",
    })  # fmt: skip
    assert import_cycles("game", tmp_path) == [["game", "game.env", "game.generator", "game.scene"]]
    (tmp_path / "game" / "scene.py").write_text("from game.catalog import ROOMS\n")
    assert import_cycles("game", tmp_path) == []
