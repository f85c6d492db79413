"""PNG plots of runs (matplotlib, headless): learning curves with a band over seeds, held-out
success as bars with intervals, and the curriculum stage over time.

Every plot is FIGSIZE at DPI (800 x 450 px), so reports and tests can rely on the size.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from reflectrl.atomic_files import atomic_path

FIGSIZE = (8.0, 4.5)
DPI = 100
GRID_POINTS = 50

Curves = dict[str, list[list[dict[str, Any]]]]  # variant -> per seed, its metrics.jsonl rows


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # no display on servers and CI
    import matplotlib.pyplot as plt

    return plt


def _banded(seeds: list[list[dict[str, Any]]], key: str) -> tuple[np.ndarray, ...] | None:
    """(env steps, mean, low, high) of `key` over seeds, on the env-step range all seeds reached
    (min-max band; one seed: no band)."""
    series = []
    for rows in seeds:
        points = [(r["env_steps"], r[key]) for r in rows if r.get(key) is not None]
        if points:
            series.append(np.array(points, dtype=float))
    if not series:
        return None
    end = min(s[-1, 0] for s in series)
    start = max(s[0, 0] for s in series)
    grid = np.linspace(start, end, GRID_POINTS) if end > start else np.array([start])
    values = np.stack([np.interp(grid, s[:, 0], s[:, 1]) for s in series])
    return grid, values.mean(0), values.min(0), values.max(0)


PANELS = (
    ("success_rate", "training success rate"),
    ("episode_return_mean", "training mean return"),
    ("eval_success_rate", "held-out greedy success (eval.every)"),
)


def stage_switches(rows: list[dict[str, Any]]) -> list[tuple[float, str]]:
    """(env steps, new stage) of every curriculum switch in a run's rows."""
    return [
        (r["env_steps"], r["next_stage"])
        for r in rows
        if r.get("next_stage") and r.get("stage") and r["next_stage"] != r["stage"]
    ]


def learning_curves(curves: Curves, out: Path, levels: dict[str, float] | None = None) -> Path:
    """Training success, mean return and (where runs evaluated during RL) held-out success vs
    env steps, one line per variant; dotted lines mark each run's curriculum switches. `levels`:
    the held-out success of variants without RL (SFT only), dashed across the held-out panel."""
    plt = _pyplot()
    panels = [
        (key, title)
        for key, title in PANELS
        if key != "eval_success_rate"
        or any(r.get(key) is not None for seeds in curves.values() for rows in seeds for r in rows)
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4.2), dpi=DPI)
    fig.suptitle("band: min-max over seeds; dotted: a stage switch", fontsize=8)
    for ax, (key, title) in zip(axes, panels, strict=True):
        for name, seeds in curves.items():
            banded = _banded(seeds, key)
            if banded is None:
                continue
            steps, mean, low, high = banded
            (line,) = ax.plot(steps, mean, label=f"{name} ({len(seeds)} seeds)")
            ax.fill_between(steps, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
            for rows in seeds:
                for at, _stage in stage_switches(rows):
                    ax.axvline(at, color=line.get_color(), linestyle=":", alpha=0.6, linewidth=1)
        if key == "eval_success_rate":
            for name, level in (levels or {}).items():
                ax.axhline(level, color="black", linestyle="--", linewidth=1, label=name)
        ax.set_xlabel("env steps")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
        if "success" in key:
            ax.set_ylim(-0.02, 1.02)
    handles, _ = axes[0].get_legend_handles_labels()
    if handles:
        axes[0].legend(fontsize=7)
    if levels and panels[-1][0] == "eval_success_rate":
        axes[-1].legend(fontsize=7)
    return _save(fig, out)


def success_bars(
    variants: dict[str, dict[str, Any]], per_seed: dict[str, dict[str, list[float]]], out: Path
) -> Path:
    """Held-out success per variant (greedy and sampled): the mean over seeds as a bar, its 95%
    interval as an error bar, each seed as a dot."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=FIGSIZE, dpi=DPI)
    names = list(variants)
    x = np.arange(len(names))
    width = 0.38
    for offset, key, label in (
        (-width / 2, "success_greedy", "greedy"),
        (width / 2, "success_sampled", "sampled"),
    ):
        means = [variants[n][key]["mean"] or 0.0 for n in names]
        errors = np.array([_error(variants[n][key]) for n in names]).T
        ax.bar(x + offset, means, width, yerr=errors, capsize=4, label=label, alpha=0.8)
        for i, name in enumerate(names):
            dots = per_seed[name][key]
            ax.scatter([x[i] + offset] * len(dots), dots, color="black", s=10, zorder=3)
    ax.set_xticks(x, names, rotation=15, fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("held-out success rate")
    ax.set_title("held-out success (bar: mean over seeds, whisker: 95% CI, dot: one seed)",
                 fontsize=9)  # fmt: skip
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, out)


def _error(stat: dict[str, Any]) -> tuple[float, float]:
    if stat["ci95"] is None or stat["mean"] is None:
        return 0.0, 0.0
    low, high = stat["ci95"]
    return stat["mean"] - max(low, 0.0), min(high, 1.0) - stat["mean"]


def curriculum(curves: Curves, out: Path) -> Path:
    """The curriculum stage of every run over wall time (one thin line per seed)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=FIGSIZE, dpi=DPI)
    stages: list[str] = []
    for rows_of_seeds in curves.values():
        for rows in rows_of_seeds:
            for r in rows:
                if r["stage"] not in stages:
                    stages.append(r["stage"])
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (name, seeds) in enumerate(curves.items()):
        color = colors[i % len(colors)]
        for k, rows in enumerate(seeds):
            if not rows:
                continue
            minutes = np.cumsum([r.get("iteration_s", 0.0) for r in rows]) / 60
            level = [stages.index(r["stage"]) for r in rows]
            jitter = 0.04 * (i - len(curves) / 2)  # keep overlapping variants visible
            ax.step(minutes, np.array(level) + jitter, where="post", color=color, alpha=0.7,
                    label=name if k == 0 else None)  # fmt: skip
    ax.set_yticks(range(len(stages)), stages)
    ax.set_xlabel("RL wall time (min)")
    ax.set_title("curriculum stage over time (one line per seed)", fontsize=9)
    if stages:
        ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, out)


def _save(fig: Any, out: Path) -> Path:
    import matplotlib.pyplot as plt

    with atomic_path(out) as tmp:
        fig.savefig(tmp, dpi=DPI, format="png")  # no bbox "tight": the size stays FIGSIZE x DPI
    plt.close(fig)
    return out


def run_plots(run_dir: Path, rows: list[dict[str, Any]]) -> list[Path]:
    """The plots of one run (`reflectrl launch` ends with them): curves and curriculum."""
    if not rows:
        return []
    curves = {run_dir.name: [rows]}
    folder = run_dir / "plots"
    return [
        learning_curves(curves, folder / "learning_curves.png"),
        curriculum(curves, folder / "curriculum.png"),
    ]
