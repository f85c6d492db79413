"""Helpers shared by the benchmark scripts and the diagnostics (`diagnostics/`): the results
folder and a plain-text table."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "machine": platform.machine()}


def write_results(name: str, payload: dict[str, Any], folder: Path = RESULTS) -> Path:
    """Write `payload` (with the machine's CPU count and architecture) to `folder`/NAME.json:
    benchmarks/results/ by default; the diagnostics pass diagnostics/results/."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    path.write_text(json.dumps({**machine(), **payload}, indent=2) + "\n")
    return path


def print_table(rows: list[dict[str, Any]], columns: list[str]) -> None:
    widths = {c: max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in columns}
    print("  ".join(c.ljust(widths[c]) for c in columns))
    for row in rows:
        print("  ".join(_fmt(row.get(c)).ljust(widths[c]) for c in columns))


def _fmt(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)
