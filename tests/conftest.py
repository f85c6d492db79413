"""Shared fixtures: the tiny random-init model (with the real SmolLM2 tokenizer) and configs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
# Under xdist, each test process, and every process it starts, gets its share of the cores as
# torch threads: on `make test`'s 2 processes and 2 cores, a second thread in each would mostly
# wait for the core the other process holds, and cost CPU time while it waits. (A launch's SFT
# stage still takes every core, as it does for users: pipeline.use_all_cores.)
_PROCESSES = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _PROCESSES > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _PROCESSES)))

REPO = Path(__file__).resolve().parents[1]

# Run first: the longest files (whole-run and fault tests), so that the two test processes
# of `make test` finish together.
LONGEST_FIRST = (
    "test_launch_e2e",
    "test_experiment",
    "test_cluster",
    "test_reflection_faults",
    "test_driver_kill",
    "test_repeatability",
    "test_env_pipelines",
    "test_learning",
    "test_sft",
    "test_learner_actors",
)


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the groups marked here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Order the longest files first; keep each module in one test process (they share
    module fixtures: a Ray session, a trained SFT adapter, a vLLM server) unless it says
    XDIST_SPREAD (`--dist loadgroup` then spreads its tests)."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}

    def module_name(item: pytest.Item) -> str:
        return item.module.__name__.rsplit(".", 1)[-1] if item.module else ""

    items.sort(key=lambda item: rank.get(module_name(item), len(rank)))
    for item in items:
        if not getattr(item.module, "XDIST_SPREAD", False):
            item.add_marker(pytest.mark.xdist_group(module_name(item)))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    """Stop if xdist did not take the groups marked above (it writes each into the test's id):
    with pytest 9.2 it silently did not (pytest-xdist#1386), and every module's fixtures were
    built in both test processes."""
    if node.config.getoption("dist") == "loadgroup" and not any("@" in i for i in ids):
        pytest.exit(
            f"pytest-xdist did not group the tests by module (pytest {pytest.__version__}): "
            "keep the pytest pin of pyproject.toml's dev extra, or run without -n",
            returncode=4,
        )


@pytest.fixture(scope="session")
def tiny_dir() -> Path:
    from reflectrl.data.scratch import resolve_or_build

    return resolve_or_build("tiny")


@pytest.fixture(scope="session")
def tokenizer(tiny_dir: Path) -> Any:
    from reflectrl.models.loading import load_tokenizer

    return load_tokenizer(tiny_dir)


@pytest.fixture
def server() -> Any:
    """A scripted OpenAI-style server (tests/fake_openai_server.py)."""
    from tests.fake_openai_server import running_server

    with running_server() as state:
        yield state


@pytest.fixture
def smoke_config() -> Any:
    from reflectrl.config import load_config

    return load_config(REPO / "configs" / "smoke.yaml")
