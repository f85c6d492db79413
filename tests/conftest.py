"""Shared fixtures: the tiny random-init model (with the real SmolLM2 tokenizer) and configs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def tiny_dir() -> Path:
    from reflectrl.models.loading import resolve_model

    return resolve_model("tiny")


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
