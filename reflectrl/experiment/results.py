"""What a run directory says it achieved, and the same figures aggregated over seeds.

Every number comes from files the run wrote: the held-out eval JSON (`stages/eval.json` names
it), `metrics.jsonl` (one row per RL iteration) and the stage markers (`stages/<stage>.json`,
with their wall time). Nothing is recomputed from models.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
import subprocess
from pathlib import Path
from typing import Any

from reflectrl.evaluation.report import BEFORE_RL_FILE
from reflectrl.run_dir import METRICS_FILE, STAGES_DIR

# Two-sided 95% quantiles of Student's t by degrees of freedom (df > 30: the normal's).
T95 = {
    1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
    10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 25: 2.060, 30: 2.042,
}  # fmt: skip
PIPELINE_ORDER = ("data", "sft", "rl", "eval")
# Report columns in curriculum order where the stages are Taxi's (others sort after, by name).
CURRICULUM_ORDER = {"pickup": 0, "dropoff": 1, "full": 2}
NO_BOUNDS = (-math.inf, math.inf)
BOUNDS = {
    "success_greedy": (0.0, 1.0),
    "success_sampled": (0.0, 1.0),
    "env_steps": (0, math.inf),
    "wall_s": (0, math.inf),
}
METRICS = ("success_greedy", "success_sampled", "return_greedy", "env_steps", "wall_s")


def t95(df: int) -> float:
    if df > 30:
        return 1.960
    return T95[max(k for k in T95 if k <= df)]  # conservative between table entries


def mean_ci95(
    values: list[float], bounds: tuple[float, float] = (-math.inf, math.inf)
) -> dict[str, Any]:
    """Mean and its 95% t-interval over `values` (seeds), cut to the metric's `bounds` (a rate
    stays in [0, 1]); no interval from a single value."""
    n = len(values)
    if n == 0:
        return {"n": 0, "mean": None, "ci95": None}
    mean = statistics.fmean(values)
    if n == 1:
        return {"n": 1, "mean": mean, "ci95": None}
    half = t95(n - 1) * statistics.stdev(values) / math.sqrt(n)
    low, high = bounds
    return {"n": n, "mean": mean, "ci95": [max(low, mean - half), min(high, mean + half)]}


def git_commit() -> str | None:
    """The commit of the code that ran (None outside a git checkout)."""
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def read_json(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


def curve(run_dir: Path) -> list[dict[str, Any]]:
    """The RL iterations of a run (empty for a run without RL)."""
    path = run_dir / METRICS_FILE
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # the last line of a run killed mid-write
            continue
    return rows


def run_summary(run_dir: Path) -> dict[str, Any]:
    """The figures of one finished run; `finished` is False while its eval is missing."""
    markers = {p.stem: p for p in (run_dir / STAGES_DIR).glob("*.json")}
    order = [s for s in PIPELINE_ORDER if s in markers] + sorted(set(markers) - set(PIPELINE_ORDER))
    stages = {name: json.loads(markers[name].read_text()) for name in order}
    eval_marker = stages.get("eval")
    report = read_json(run_dir / eval_marker["file"]) if eval_marker else None
    summary: dict[str, Any] = {
        "dir": str(run_dir),
        "finished": report is not None,
        "stage_seconds": {name: s["seconds"] for name, s in stages.items()},
        "wall_s": sum(s["seconds"] for s in stages.values()),
        "env_steps": stages.get("rl", {}).get("env_steps", 0),
        "rl_iterations": stages.get("rl", {}).get("iterations", 0),
    }
    if report is not None:
        greedy, sampled = report["greedy"]["all"], report["sampled"]["all"]
        summary.update(
            eval_file=eval_marker["file"],
            eval_episodes=greedy["episodes"],
            success_greedy=greedy["success_rate"],
            success_greedy_ci95=greedy["success_ci95"],
            success_sampled=sampled["success_rate"],
            success_sampled_ci95=sampled["success_ci95"],
            return_greedy=greedy["return_mean"],
            return_sampled=sampled["return_mean"],
            success_greedy_by_stage={
                stage: s["success_rate"] for stage, s in report["greedy"]["stages"].items()
            },
        )
        extra = eval_marker.get("extra_splits", {})  # e.g. AutoExplore's unseen source trees
        summary["success_greedy_by_split"] = {
            split: figures["success_rate_greedy"] for split, figures in extra.items()
        }
        unseen = report["greedy"].get("unseen_states")
        if unseen is not None:  # episodes that met a state the SFT data never showed
            summary["unseen_states_episodes"] = unseen["all"]["episodes"]
            summary["success_greedy_unseen_states"] = unseen["all"]["success_rate"]
    before = read_json(run_dir / BEFORE_RL_FILE)  # runs with eval.every
    if before is not None:
        summary["success_before_rl_greedy"] = before["eval_success_rate"]
        summary["success_before_rl_sampled"] = before["eval_success_rate_sampled"]
        points = heldout_curve(run_dir)
        summary["heldout_curve"] = points
        summary["heldout_curve_mean"] = curve_mean(points)
    for player in ("reflection", "policy"):
        sft = stages.get("sft", {}).get(player)
        if sft:
            summary[f"sft_{player}_eval_loss"] = sft["loss_after"].get("eval")
    return summary


def with_start(run_dir: Path, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`curve` rows after a row at 0 env steps holding the held-out success before RL (in the
    first iteration's stage), where the run measured it: the curves' first point."""
    before = read_json(run_dir / BEFORE_RL_FILE)
    if before is None or not rows:
        return rows
    start = {"iteration": 0, "stage": rows[0]["stage"], "iteration_s": 0.0}
    return [{**start, **before, "env_steps": 0}, *rows]


def heldout_curve(run_dir: Path) -> list[list[float]]:
    """[env steps, held-out greedy success] before RL and at every `eval.every` iteration."""
    return [
        [float(r["env_steps"]), float(r["eval_success_rate"])]
        for r in with_start(run_dir, curve(run_dir))
        if "eval_success_rate" in r
    ]


def curve_mean(curve: list[list[float]]) -> float | None:
    """The held-out curve's mean over env steps (trapezoids; the area under it over its
    length): equal budgets compare on the whole curve, not only at its end."""
    if len(curve) < 2 or curve[-1][0] <= 0:
        return None
    area = sum((x2 - x1) * (y1 + y2) / 2 for (x1, y1), (x2, y2) in itertools.pairwise(curve))
    return area / curve[-1][0]


def aggregate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per metric, the mean and 95% interval over the finished runs (seeds) of one variant."""
    done = [r for r in runs if r["finished"]]
    return {
        "seeds": [r["seed"] for r in done],
        "missing_seeds": [r["seed"] for r in runs if not r["finished"]],
        **{m: mean_ci95([float(r[m]) for r in done], BOUNDS.get(m, NO_BOUNDS)) for m in METRICS},
    }


def cell(stat: dict[str, Any], digits: int = 2, scale: float = 1.0) -> str:
    if stat["mean"] is None:
        return "n/a"
    text = f"{stat['mean'] * scale:.{digits}f}"
    if stat["ci95"] is not None:
        low, high = (v * scale for v in stat["ci95"])
        text += f" [{low:.{digits}f}, {high:.{digits}f}]"
    return text


def markdown_table(variants: dict[str, dict[str, Any]]) -> str:
    """One row per variant: mean [95% interval over seeds] of every metric."""
    lines = [
        "| variant | seeds | held-out success, greedy | held-out success, sampled "
        "| return (greedy) | env steps | wall time (min) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, v in variants.items():
        seeds = f"{len(v['seeds'])}" + (
            f" ({len(v['missing_seeds'])} missing)" if v["missing_seeds"] else ""
        )
        lines.append(
            f"| {name} | {seeds} | {cell(v['success_greedy'])} | {cell(v['success_sampled'])} "
            f"| {cell(v['return_greedy'])} | {cell(v['env_steps'], 0)} "
            f"| {cell(v['wall_s'], 1, 1 / 60)} |"
        )
    return "\n".join(lines)


DETAIL_COLUMNS = (
    ("before RL", lambda r: r.get("success_before_rl_greedy")),
    ("curve mean", lambda r: r.get("heldout_curve_mean")),
    ("on unseen states", lambda r: r.get("success_greedy_unseen_states")),
)


def detail_table(runs: list[dict[str, Any]]) -> str:
    """One row per variant, each cell the mean over its finished seeds that have the figure:
    greedy success per stage, before RL, over the held-out curve, on the episodes that met a
    state the SFT data never showed, and on each of `eval.extra_splits`."""
    variants: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        if run["finished"]:
            variants.setdefault(run["variant"], []).append(run)
    stages = sorted({s for rows in variants.values() for r in rows
                     for s in r.get("success_greedy_by_stage", {})},
                    key=lambda s: (CURRICULUM_ORDER.get(s, 99), s))  # fmt: skip
    columns = [(stage, lambda r, s=stage: r.get("success_greedy_by_stage", {}).get(s))
               for stage in stages] + list(DETAIL_COLUMNS)  # fmt: skip
    splits = sorted({s for rows in variants.values() for r in rows
                     for s in r.get("success_greedy_by_split", {})})  # fmt: skip
    columns += [(f"{split} split", lambda r, s=split: r.get("success_greedy_by_split", {}).get(s))
                for split in splits]  # fmt: skip
    lines = [
        "| variant | " + " | ".join(name for name, _ in columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    for name, rows in variants.items():
        cells = []
        for _, get in columns:
            values = [get(r) for r in rows if get(r) is not None]
            cells.append(f"{sum(values) / len(values):.3f} ({len(values)})" if values else "n/a")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run_table(summary: dict[str, Any]) -> str:
    """The short table `reflectrl launch` ends with."""
    rows = [(f"stage {k}", f"{v:.0f} s") for k, v in summary["stage_seconds"].items()]
    for player in ("reflection", "policy"):
        loss = summary.get(f"sft_{player}_eval_loss")
        if loss is not None:
            rows.append((f"sft {player}: held-out loss", f"{loss:.3f}"))
    if summary["rl_iterations"]:
        rows.append(("rl: iterations / env steps", f"{summary['rl_iterations']} / "
                     f"{summary['env_steps']}"))  # fmt: skip
    if "success_before_rl_greedy" in summary:
        rows.append((
            "held-out success before RL",
            f"{summary['success_before_rl_greedy']:.3f} greedy / "
            f"{summary['success_before_rl_sampled']:.3f} sampled (eval.every's episodes)",
        ))  # fmt: skip
    if summary["finished"]:
        for decoding in ("greedy", "sampled"):
            low, high = summary[f"success_{decoding}_ci95"]
            rows.append((
                f"held-out success, {decoding}",
                f"{summary[f'success_{decoding}']:.3f} [{low:.2f}, {high:.2f}] "
                f"({summary['eval_episodes']} episodes)",
            ))  # fmt: skip
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)
