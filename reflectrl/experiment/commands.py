"""`reflectrl experiment FILE`: run an ablation grid, then write its report:
results.json, results.md and plots/ (learning curves, held-out success, curriculum)."""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path
from typing import Any

from reflectrl.atomic_files import atomic_dir, write_json, write_text
from reflectrl.errors import ConfigError
from reflectrl.experiment import plots
from reflectrl.experiment.grid import PlannedRun, load_spec, plan, run_grid
from reflectrl.experiment.results import (
    aggregate,
    curve,
    detail_table,
    git_commit,
    markdown_table,
    run_summary,
    with_start,
)
from reflectrl.run_dir import CONFIG_FILE, METRICS_FILE, STAGES_DIR

PLOTS = ("learning_curves.png", "heldout_success.png", "curriculum.png")
# What the report reads from a run, and all that `--export` keeps of it: a few dozen KB,
# against megabytes of models, checkpoints and data.
RUN_RECORD = (CONFIG_FILE, METRICS_FILE, "eval_*.json", f"{STAGES_DIR}/*.json")


def write_report(file: Path, output: Path, runs: list[PlannedRun], command: str) -> dict[str, Any]:
    """results.json, results.md and the plots, from what the run directories hold now."""
    summaries: dict[str, list[dict[str, Any]]] = {}
    curves: plots.Curves = {}
    for run in runs:
        summary = {"variant": run.variant, "seed": run.seed, **run_summary(run.dir)}
        summaries.setdefault(run.variant, []).append(summary)
        rows = with_start(run.dir, curve(run.dir))
        if rows:
            curves.setdefault(run.variant, []).append(rows)
    variants = {name: aggregate(rows) for name, rows in summaries.items()}
    per_seed = {
        name: {key: [r[key] for r in rows if r["finished"]]
               for key in ("success_greedy", "success_sampled")}
        for name, rows in summaries.items()
    }  # fmt: skip
    # Variants without RL (SFT only) have no curve: their held-out success is a level line.
    levels = {
        f"{name} (mean of {stat['success_greedy']['n']} seeds)": stat["success_greedy"]["mean"]
        for name, stat in variants.items()
        if name not in curves and stat["success_greedy"]["mean"] is not None
    }
    folder = output / "plots"
    made = [
        plots.learning_curves(curves, folder / PLOTS[0], levels),
        plots.success_bars(variants, per_seed, folder / PLOTS[1]),
        plots.curriculum(curves, folder / PLOTS[2]),
    ]
    results = {
        "experiment": str(file),
        "command": command,
        "commit": git_commit(),
        "written_at": time.strftime("%Y-%m-%d %H:%M:%S"),
        "variants": variants,
        "runs": [r for rows in summaries.values() for r in rows],
        "plots": [str(p.relative_to(output)) for p in made],
    }
    write_json(output / "results.json", results)
    write_text(output / "results.md", _markdown(results))
    return results


def _markdown(results: dict[str, Any]) -> str:
    lines = [
        f"# Results of `{results['experiment']}`",
        "",
        f"Command: `{results['command']}`  ",
        f"Commit: `{results['commit']}`; written {results['written_at']}.",
        "",
        "Held-out success is the share of held-out episodes solved (eval JSON of each run); "
        "every cell is the mean over seeds with its 95% t-interval over seeds.",
        "",
        markdown_table(results["variants"]),
        "",
        "Greedy held-out success per curriculum stage, before RL (the SFT policy), as the mean "
        "of the held-out curve over env steps, and on the episodes that acted on a state the "
        "SFT data never showed: mean over the seeds that have the figure (how many).",
        "",
        detail_table(results["runs"]),
        "",
        "## Runs",
        "",
        "| variant | seed | success, greedy | success, sampled | env steps | wall time (min) |",
        "|---|---|---|---|---|---|",
    ]
    for r in results["runs"]:
        if r["finished"]:
            lines.append(
                f"| {r['variant']} | {r['seed']} | {r['success_greedy']:.3f} "
                f"| {r['success_sampled']:.3f} | {r['env_steps']} | {r['wall_s'] / 60:.1f} |"
            )
        else:
            lines.append(f"| {r['variant']} | {r['seed']} | not finished | | | |")
    lines += ["", *[f"![{p}]({p})" for p in results["plots"]], ""]
    return "\n".join(lines)


def export_runs(runs: list[PlannedRun], dest: Path) -> list[PlannedRun]:
    """Copy the RUN_RECORD files of every finished run into DEST/<run>/ (replacing an older
    copy of that run); the runs copied, as planned in DEST."""
    exported = []
    for run in runs:
        if not run_summary(run.dir)["finished"]:
            continue
        files = [p for pattern in RUN_RECORD for p in sorted(run.dir.glob(pattern))]
        target = dest / run.name
        with atomic_dir(target) as staging:
            for path in files:
                copy = staging / path.relative_to(run.dir)
                copy.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, copy)
        exported.append(PlannedRun(run.variant, run.seed, target, run.overrides))
    return exported


def command_line(args: argparse.Namespace) -> str:
    """The command that reproduces this grid (what results.md says was run)."""
    words = ["reflectrl", "experiment", str(args.file), "--workers", str(args.workers)]
    for flag in ("output", "variants", "seeds", "address", "export"):
        if getattr(args, flag):
            words += [f"--{flag}", str(getattr(args, flag))]
    if args.parallel != 1:
        words += ["--parallel", str(args.parallel)]
    words += ["--no-share"] if args.no_share else []
    return " ".join(words + (["--report-only"] if args.report_only else []))


def pick(chosen: str | None, names: Any, flag: str, file: Path) -> list[str]:
    """The comma-separated subset `chosen` of `names` (all of them when None)."""
    if not chosen:
        return list(names)
    wanted = chosen.split(",")
    unknown = [name for name in wanted if name not in names]
    if unknown:
        raise ConfigError(f"{flag}: {', '.join(unknown)} not in {file} (it has {', '.join(names)})")
    return wanted


def run_experiment(args: argparse.Namespace) -> int:
    if args.workers < 1 or args.parallel < 1:
        raise ConfigError("--workers and --parallel must be at least 1")
    file = Path(args.file)
    spec = load_spec(file)
    output = Path(args.output or Path("experiments") / "runs" / file.stem)
    if args.export and Path(args.export).resolve() == output.resolve():
        raise ConfigError(f"--export {args.export} is the runs' own folder; name another one")
    # Every run of the file may lend its data and SFT, also to a run outside --variants/--seeds.
    donors = plan(spec, output)
    spec.variants = {
        name: spec.variants[name] for name in pick(args.variants, spec.variants, "--variants", file)
    }
    spec.seeds = [
        int(seed) for seed in pick(args.seeds, [str(s) for s in spec.seeds], "--seeds", file)
    ]
    runs = plan(spec, output)
    print(
        f"experiment {file}: {len(spec.variants)} variants x {len(spec.seeds)} seeds = "
        f"{len(runs)} runs in {output}",
        flush=True,
    )
    outcome: dict[str, str] = {}
    if not args.report_only:
        outcome = run_grid(
            spec,
            runs,
            output,
            args.workers,
            args.parallel,
            args.address,
            share=not args.no_share,
            donors=donors,
        )
    results = write_report(file, output, runs, command_line(args))
    print(markdown_table(results["variants"]))
    print(f"report: {output / 'results.md'}; plots: {output / 'plots'}")
    if args.export:
        dest = Path(args.export)
        kept = export_runs(runs, dest)
        in_dest = [PlannedRun(r.variant, r.seed, dest / r.name, r.overrides) for r in runs]
        write_report(file, dest, in_dest, command_line(args))
        print(f"exported {len(kept)} runs and the report to {dest} (`--report-only --output "
              f"{dest}` rebuilds it)")  # fmt: skip
    failed = {name: why for name, why in outcome.items() if why != "finished"}
    for name, why in failed.items():
        print(f"{name}: {why}; log: {output / 'logs' / f'{name}.log'}")
    return 1 if failed else 0


def add_commands(sub: Any) -> None:
    parser = sub.add_parser(
        "experiment",
        help="run an ablation grid (variants x seeds) and write its results and plots",
        description="Run every variant x seed of an experiment file as its own `reflectrl "
        "launch` run in OUTPUT/<variant>-seed<seed>/ (finished runs are skipped, unfinished "
        "ones resume), then write OUTPUT/results.json, OUTPUT/results.md and OUTPUT/plots/.",
    )
    parser.add_argument("file", help="experiment YAML (base, set, seeds, variants)")
    parser.add_argument("--output", help="folder of the runs (default: experiments/runs/<file>)")
    parser.add_argument("--workers", type=int, default=2, help="rollout workers per run")
    parser.add_argument(
        "--parallel", type=int, default=1, help="runs at a time (default 1; more on a cluster)"
    )
    parser.add_argument("--address", help="join this Ray cluster (default: $RAY_ADDRESS or local)")
    parser.add_argument(
        "--no-share",
        action="store_true",
        help="train data and SFT in every run, also where an earlier run of the grid has the "
        "same data and SFT settings (by default such runs start from a copy of its)",
    )
    parser.add_argument(
        "--variants", help="comma-separated variants to run (default: all of the file)"
    )
    parser.add_argument("--seeds", help="comma-separated seeds to run (default: all of the file)")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="start nothing: write the report from the runs that finished so far",
    )
    parser.add_argument(
        "--export",
        metavar="DIR",
        help="also copy the report and each run's small files (config, metrics, eval JSON, "
        "stage markers) to DIR, a folder to commit: `--report-only --output DIR` rebuilds "
        "the report from it",
    )
    parser.set_defaults(handler=run_experiment)
