"""What `cat` shows: an outline by file type, then the text, cut to a character budget.

A long file cut to its first lines would hide what a question asks about, so the output
starts with an outline of the file: top-level definitions of Python files, headings of
Markdown/reST files, sections and keys of config files. The task generator only asks about
items that this outline shows within the budget, so every question can be answered by
reading (`shown_items`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from reflectrl.envs.auto_explore.sandbox import ReadResult

KINDS = {
    ".py": "python",
    ".pyi": "python",
    ".md": "markdown",
    ".rst": "rst",
    ".toml": "config",
    ".cfg": "config",
    ".ini": "config",
    ".yaml": "yaml",
    ".yml": "yaml",
}
_PY_DEF = re.compile(r"^(?:async[ \t]+def|def|class)[ \t]+([A-Za-z_]\w*)", re.MULTILINE)
_MD_HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t#]*$")
_RST_UNDERLINE = re.compile(r"^([=\-~^\"'`#*+])\1{2,}\s*$")
_INI_SECTION = re.compile(r"^\s*\[+\s*([^\]\s][^\]]*?)\s*\]+\s*$")
_INI_KEY = re.compile(r"^([A-Za-z0-9_][\w.-]*)\s*[=:]")
_YAML_KEY = re.compile(r"^([A-Za-z_][\w.-]*)\s*:")
TRUNCATED = "\n... (truncated)"


@dataclass(frozen=True)
class Rendered:
    text: str
    shown_items: frozenset[str]  # outline items that appear whole in `text`


def file_kind(name: str) -> str:
    return KINDS.get(os.path.splitext(name)[1].lower(), "text")


def outline(kind: str, text: str) -> list[str]:
    """Outline items in file order, without repeats, e.g. "class Env", "def make"."""
    if kind == "python":
        items = []
        for match in _PY_DEF.finditer(text):
            word = "class" if match.group(0).startswith("class") else "def"
            items.append(f"{word} {match.group(1)}")
    elif kind == "markdown":
        items = _markdown_headings(text)
    elif kind == "rst":
        lines = text.splitlines()
        items = [
            lines[i].strip()
            for i in range(len(lines) - 1)
            if lines[i].strip()
            and _RST_UNDERLINE.match(lines[i + 1])
            and len(lines[i + 1].strip()) >= len(lines[i].strip())
        ]
    elif kind == "config":
        items = []
        for line in text.splitlines():
            section = _INI_SECTION.match(line)
            key = _INI_KEY.match(line)
            if section:
                items.append(f"[{section.group(1)}]")
            elif key:
                items.append(key.group(1))
    elif kind == "yaml":
        items = [m.group(1) for m in map(_YAML_KEY.match, text.splitlines()) if m]
    else:
        items = []
    return list(dict.fromkeys(items))


def _markdown_headings(text: str) -> list[str]:
    items: list[str] = []
    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced  # `# comment` lines in code blocks are not headings
            continue
        match = None if fenced else _MD_HEADING.match(line)
        if match:
            items.append(match.group(1).strip())
    return items


_LABELS = {
    "python": "Defines",
    "markdown": "Headings",
    "rst": "Headings",
    "config": "Keys",
    "yaml": "Keys",
}


def render_file(name: str, result: ReadResult, max_chars: int) -> Rendered:
    """The output of `cat name`: outline line, then the text; never over `max_chars`."""
    if result.text is None:
        return Rendered(f"error: cannot show {name}: {result.error}", frozenset())
    kind = file_kind(name)
    items = outline(kind, result.text)
    separator = "; " if kind in ("markdown", "rst") else ", "
    head = f"{_LABELS[kind]}: " if kind in _LABELS else ""
    # Track where each outline item ends, to know which survive the cut.
    ends: list[tuple[str, int]] = []
    pieces = [head] if items else []
    length = len(head)
    for i, item in enumerate(items):
        piece = item if i == 0 else separator + item
        pieces.append(piece)
        length += len(piece)
        ends.append((item, length))
    body = _compact(_skip_comment_header(result.text) if kind in _HASH_COMMENTS else result.text)
    note = f" (only the first {result.bytes_read} bytes were read)" if result.truncated else ""
    text = "".join(pieces) + ("\n---\n" if items else "") + f"{name}{note}:\n{body}"
    if len(text) > max_chars:
        cut = max(0, max_chars - len(TRUNCATED))
        text = text[:cut] + TRUNCATED
        shown = frozenset(item for item, end in ends if end <= cut)
    else:
        shown = frozenset(items)
    return Rendered(text, shown)


_HASH_COMMENTS = ("python", "config", "yaml")


def _skip_comment_header(text: str) -> str:
    """Drop the leading block of `#` comment lines (mostly license boilerplate)."""
    lines = text.splitlines()
    start = 0
    while start < len(lines) and (
        not lines[start].strip() or lines[start].lstrip().startswith("#")
    ):
        start += 1
    return "\n".join(lines[start:]) if start < len(lines) else text


def _compact(text: str) -> str:
    """Strip trailing spaces and collapse runs of blank lines (they only cost tokens)."""
    lines = [line.rstrip() for line in text.splitlines()]
    out: list[str] = []
    for line in lines:
        if line or (out and out[-1]):
            out.append(line)
    return "\n".join(out).strip("\n")
