"""The documentation: the mkdocs site builds with --strict (no broken link, every config key
described), the configuration reference lists every leaf key of `ReflectRLConfig`, and the
README stays short with working links."""

from __future__ import annotations

import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from reflectrl.config import ReflectRLConfig

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 250
# [text](target) and ![alt](target); the target up to a space, `)` or `#`.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s#]+)(?:#[^)\s]*)?\)")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return out


def test_mkdocs_build_strict_passes(site: Path) -> None:
    assert (site / "index.html").is_file()
    assert (site / "configuration" / "index.html").is_file()


def leaf_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every dotted leaf key under `model` (list items of a model as `key[].field`)."""
    keys: list[str] = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            keys += leaf_keys(annotation, f"{prefix}{name}.")
        elif typing.get_origin(annotation) is list and any(
            isinstance(a, type) and issubclass(a, BaseModel) for a in typing.get_args(annotation)
        ):
            (item,) = typing.get_args(annotation)
            keys += leaf_keys(item, f"{prefix}{name}[].")
        else:
            keys.append(prefix + name)
    return keys


def test_configuration_reference_lists_every_leaf_key(site: Path) -> None:
    page = (site / "configuration" / "index.html").read_text(encoding="utf-8")
    keys = leaf_keys(ReflectRLConfig)
    assert len(keys) > 100  # the walk reached the nested sections
    missing = [k for k in keys if f"<code>{k}</code>" not in page]
    assert not missing, f"the configuration reference lacks {missing}"


def test_every_config_key_has_a_description() -> None:
    def undocumented(model: type[BaseModel], prefix: str = "") -> list[str]:
        out = []
        for name, field in model.model_fields.items():
            if not (field.description or "").strip():
                out.append(prefix + name)
            for a in (field.annotation, *typing.get_args(field.annotation)):
                if isinstance(a, type) and issubclass(a, BaseModel):
                    out += undocumented(a, f"{prefix}{name}.")
        return out

    assert undocumented(ReflectRLConfig) == []


def test_readme_is_short() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"


def test_readme_relative_links_point_at_files() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]
    assert targets, "no relative links found: the pattern is wrong"
    broken = [t for t in targets if not (ROOT / t).exists()]
    assert not broken, f"README.md links to missing files: {broken}"
