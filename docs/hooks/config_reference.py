"""mkdocs hook: the configuration reference, generated from the pydantic models of
`reflectrl/config/` at build time.

`docs/configuration.md` holds the marker below; this hook replaces it with one table per
section of `ReflectRLConfig`: every dotted key (nested models flattened, list items as
`key[].field`), its type, its default and its description (the field's docstring). A field
without a description stops the build, so a new key cannot go undocumented.
"""

from __future__ import annotations

import html
import json
import types
import typing
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo

MARKER = "<!-- config-reference -->"
PAGE = "configuration.md"


class MissingDescription(RuntimeError):
    """A config field has no description (no docstring and no `Field(description=...)`)."""


def _model_of(annotation: Any) -> tuple[type[BaseModel] | None, str]:
    """(the model a field nests, and the key suffix: "" for a section, "[]" for a list of them)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, ""
    if typing.get_origin(annotation) is list:
        (item,) = typing.get_args(annotation)
        if isinstance(item, type) and issubclass(item, BaseModel):
            return item, "[]"
    return None, ""


def type_name(annotation: Any) -> str:
    """A short, readable spelling of a field's type."""
    if annotation is type(None):
        return "None"
    if annotation is Any:
        return "Any"
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is Literal:
        return " | ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is not None:
        inner = ", ".join(type_name(a) for a in args)
        return f"{getattr(origin, '__name__', str(origin))}[{inner}]"
    return getattr(annotation, "__name__", str(annotation))


def default_of(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    # A list, a dict or a lambda; sections never get here (`rows` walks into them instead).
    factory = field.default_factory
    return json.dumps(factory() if factory is not None else field.default)


def rows(model: type[BaseModel], prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(dotted key, type, default, description) of every leaf key under `model`, in order."""
    out: list[tuple[str, str, str, str]] = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        description = " ".join((field.description or "").split())
        if not description:
            raise MissingDescription(
                f"config key {key} ({model.__name__}.{name}) has no description: add a docstring "
                "on the line after the field in reflectrl/config/"
            )
        nested, suffix = _model_of(field.annotation)
        if nested is not None:
            out.extend(rows(nested, f"{key}{suffix}."))
            continue
        out.append((key, type_name(field.annotation), default_of(field), description))
    return out


def _text(description: str) -> str:
    """Markdown of a description: `<...>` outside code spans escaped, and `|` in any part."""
    parts = description.split("`")
    for i in range(0, len(parts), 2):  # the parts outside code spans
        parts[i] = html.escape(parts[i], quote=False)
    return "`".join(parts).replace("|", "\\|")


def _code(text: str) -> str:
    return f"<code>{html.escape(text, quote=False).replace('|', '&#124;')}</code>"


def reference_markdown() -> str:
    """The reference: a section per top-level key of `ReflectRLConfig`."""
    from reflectrl.config import ReflectRLConfig

    blocks: list[str] = []
    for name, field in ReflectRLConfig.model_fields.items():
        description = " ".join((field.description or "").split())
        if not description:
            raise MissingDescription(f"config section {name} has no description")
        nested, _ = _model_of(field.annotation)
        if nested is None:
            raise MissingDescription(f"config key {name} is not a section; put it in one")
        lines = [f"## `{name}`", "", _text(description), ""]
        lines += ["| key | type | default | description |", "| --- | --- | --- | --- |"]
        for key, kind, default, text in rows(nested, f"{name}."):
            lines.append(f"| `{key}` | {_code(kind)} | {_code(default)} | {_text(text)} |")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise MissingDescription(f"{PAGE} lost its marker {MARKER}")
    return markdown.replace(MARKER, reference_markdown())
