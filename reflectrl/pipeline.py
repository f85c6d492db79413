"""`reflectrl launch`: the method as stages in one run directory.

    data -> sft (reflection, then policy) -> rl -> eval

Each stage writes its outputs under the run directory and then `stages/<stage>.json` (what it
did, how long it took); `--resume` skips the stages that have it and continues the one that
does not (RL from its latest checkpoint). `sft.enabled: false` is RL from scratch (no data,
no SFT), `rl.enabled: false` the SFT-only ablation, `eval.enabled: false` skips the final eval.

The run directory's layout, and how its files are written: reflectrl/run_dir.py.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray

from reflectrl.atomic_files import write_json, write_text
from reflectrl.cluster.node_files import Packed, pack_dir, unpack_dir
from reflectrl.cluster.ray_init import init_ray
from reflectrl.config import ReflectRLConfig, dump_config
from reflectrl.console import LibraryOutput
from reflectrl.data.scratch import build_model
from reflectrl.errors import ReflectRLError
from reflectrl.preflight import check_run, preflight
from reflectrl.provenance import record_launch
from reflectrl.reflection.actor import ReflectionServers
from reflectrl.run_dir import (
    CONFIG_FILE,
    LAUNCH_LOG,
    LaunchOptions,
    enabled_stages,
    resolve_run,
    rl_config,
    sft_players,
    stage_marker,
    stages_to_run,
)
from reflectrl.trackers import Record, check_trackers, numbers, open_trackers, read_records


# -- the stages ------------------------------------------------------------------------------
@dataclass
class StageContext:
    config: ReflectRLConfig
    run_dir: Path
    workers: int
    resume_from: Path | None
    # The local reflection servers, shared by the rl and eval stages.
    servers: ReflectionServers = field(default_factory=lambda: ReflectionServers(build_model))


def data_stage(ctx: StageContext) -> dict[str, Any]:
    from reflectrl.data.dataset import write_dataset

    out = ctx.run_dir / "data"
    shutil.rmtree(out, ignore_errors=True)  # unfinished (no marker): derived, so redo it
    stats = write_dataset(ctx.config, out)
    return {"steps": stats["steps"], "episodes": stats["episodes"]}


def use_all_cores() -> int:
    """Let torch use every core of this node. Ray sets OMP_NUM_THREADS to a task's num_cpus
    (1 here), which halved SFT speed on 2 cores; nothing else runs during the SFT stage."""
    import os

    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    return torch.get_num_threads()


def train_on_node(
    config: ReflectRLConfig,
    data: Path,
    player: str,
    out: Path,
    lines: Any,
    driver_node: str,
    data_files: Packed,
    tracker_runs: dict[str, Record],
) -> dict[str, Any]:
    """`train_player` in a Ray task; its progress lines go to the `lines` queue (the driver
    prints them: Ray does not forward task output here). On another node than the driver's,
    it trains from a copy of the data and returns the trained folder's files. On the driver's
    node its log lines go to the run's trackers (`tracker_runs`, their saved ids: the run
    directory, where a local MLflow store lives, is on that node)."""
    import functools
    import tempfile

    from reflectrl.sft.trainer import train_player

    use_all_cores()
    train = functools.partial(train_player, config, player=player, emit=lines.put)
    node = ray.get_runtime_context().get_node_id()
    if node == driver_node:
        with open_trackers(out.parent, config, tracker_runs) as trackers:  # out: RUN/sft
            result = train(data_dir=data, out=out, trackers=trackers)
        return {"result": result, "files": None, "node": node}
    with tempfile.TemporaryDirectory() as tmp:
        result = train(data_dir=unpack_dir(data_files, Path(tmp) / "data"), out=Path(tmp) / "out")
        return {"result": result, "files": pack_dir(Path(tmp) / "out" / player), "node": node}


def wait_printing(ref: Any, lines: Any) -> Any:
    """The task's result, printing its queued progress lines meanwhile."""
    while True:
        ready, _ = ray.wait([ref], timeout=1.0)
        for line in lines.get_nowait_batch(lines.qsize()):
            print(line, flush=True)
        if ready:
            return ray_result(ref)


def sft_stage(ctx: StageContext) -> dict[str, Any]:
    """Each player as a Ray task with the learner's resources (a GPU node on a cluster)."""
    from ray.util.queue import Queue

    from reflectrl.sft.trainer import finished

    out = ctx.run_dir / "sft"
    task = ray.remote(
        num_cpus=1,
        num_gpus=ctx.config.run.num_gpus_per_learner,
        resources=dict(ctx.config.run.learner_resources),  # where the learners go
    )(train_on_node)
    driver_node = ray.get_runtime_context().get_node_id()
    results = {}
    for player in sft_players(ctx.config):
        result = finished(out, player)  # a player finished before a crash is kept
        if result is None:
            print(f"sft: training the {player} ...", flush=True)
            lines = Queue(actor_options={"num_cpus": 0})
            data = ctx.run_dir / "data"
            ref = task.remote(
                ctx.config,
                data,
                player,
                out,
                lines,
                driver_node,
                ray.put(pack_dir(data)),
                read_records(ctx.run_dir),
            )
            done = wait_printing(ref, lines)
            ray.kill(lines.actor)
            if done["files"] is not None:  # trained on another node: its folder comes back
                unpack_dir(done["files"], out / player)
            result = {**done["result"], "node": done["node"]}
            with open_trackers(ctx.run_dir, ctx.config) as trackers:  # once the task is done
                for step, losses in (
                    (0, result["loss_before"]),
                    (result["steps"], result["loss_after"]),
                ):
                    trackers.log_metrics(numbers(losses, f"sft/{player}/completion_loss_"), step)
        before, after = result["loss_before"], result["loss_after"]
        print(
            f"sft: {player}: {result['steps']} steps in {result['seconds']:.0f} s, completion "
            f"loss {before['train']:.3f} -> {after['train']:.3f} (held-out "
            f"{before.get('eval', float('nan')):.3f} -> {after.get('eval', float('nan')):.3f})",
            flush=True,
        )
        keys = ("steps", "seconds", "loss_before", "loss_after", "node")
        results[player] = {k: result[k] for k in keys if k in result}
    return results


def ray_result(ref: Any) -> Any:
    """`ray.get`, with our one-line errors raised as themselves, not wrapped by Ray."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as err:
        if isinstance(err.cause, ReflectRLError):
            raise err.cause from None
        raise


def rl_stage(ctx: StageContext) -> dict[str, Any]:
    from reflectrl.rl.driver import train

    config = rl_config(ctx.config, ctx.run_dir)
    run = train(config, ctx.run_dir, ctx.workers, ctx.resume_from, ctx.servers)
    return {"iterations": run.iteration, "env_steps": run.env_steps}


def eval_stage(ctx: StageContext) -> dict[str, Any]:
    from reflectrl.evaluation.commands import evaluate_with
    from reflectrl.evaluation.held_out import run_policy
    from reflectrl.evaluation.report import format_table

    config, source = run_policy(ctx.run_dir, ctx.config)
    result: dict[str, Any] = {}
    for split in [config.eval.split, *config.eval.extra_splits]:
        on_split = config.model_copy(
            update={"eval": config.eval.model_copy(update={"split": split})}
        )
        report = evaluate_with(on_split, source, ctx.workers, ctx.run_dir, ctx.servers)
        print(format_table(report), flush=True)
        out = ctx.run_dir / f"eval_{report['split']}.json"
        write_json(out, report)
        log_eval(ctx, report, out)
        greedy, sampled = report["greedy"]["all"], report["sampled"]["all"]
        figures = {
            "file": out.name,
            "success_rate_greedy": greedy["success_rate"],
            "success_rate_sampled": sampled["success_rate"],
        }
        if not result:  # the held-out split's figures stay at the top, where reports read them
            result = figures
        else:
            result.setdefault("extra_splits", {})[report["split"]] = figures
    return result


def log_eval(ctx: StageContext, report: dict[str, Any], path: Path) -> None:
    """The eval's figures (`eval/<split>/<decoding>/all/success_rate`, `.../stages/<stage>/...`)
    to the run's trackers, at the policy's RL iteration, and its JSON file as an artifact."""
    step = ctx.config.run.iterations if ctx.config.rl.enabled else 0
    with open_trackers(ctx.run_dir, ctx.config) as trackers:
        for decoding in ("greedy", "sampled"):
            prefix = f"eval/{report['split']}/{decoding}/"
            trackers.log_metrics(numbers(report[decoding], prefix), step)
        trackers.log_artifact(path)


STAGE_RUNNERS: dict[str, Callable[[StageContext], dict[str, Any]]] = {
    "data": data_stage,
    "sft": sft_stage,
    "rl": rl_stage,
    "eval": eval_stage,
}


def launch(opts: LaunchOptions, output: LibraryOutput | None = None) -> Path:
    """Run the stages of `opts`' run. `output`: the libraries' stderr, moved into the run's
    launch.log once the run directory exists."""
    config, run_dir, resume_from = resolve_run(opts)
    stages = enabled_stages(config)
    todo = stages_to_run(config, run_dir, stages)
    if not todo:
        print(f"every stage of {run_dir} ({', '.join(stages)}) finished earlier; nothing to do")
        return run_dir
    # Bad input fails here, before Ray starts (the SFT adapters are checked when RL starts).
    if "rl" in todo:
        check_run(config, opts.workers)
    else:
        preflight(config)
    check_trackers(config)
    # Ray first: it checks the GPUs the config asks for, and nothing is written if they are not
    # there.
    dashboard = init_ray(opts.address, config, opts.workers)
    run_dir.mkdir(parents=True, exist_ok=True)
    if output is not None:
        output.into(run_dir / LAUNCH_LOG)
    if not (run_dir / CONFIG_FILE).exists():
        write_text(run_dir / CONFIG_FILE, dump_config(config))
    changed = record_launch(run_dir)
    if changed:
        print(
            f"note: this launch runs on other software or another CPU than the run's first "
            f"({'; '.join(changed)}): its floats can differ from those of an uninterrupted run",
            flush=True,
        )
    if dashboard:
        print(f"Ray dashboard: {dashboard}", flush=True)
    if output is not None:
        print(f"Ray, RLlib and library messages: {run_dir / LAUNCH_LOG}", flush=True)
    ctx = StageContext(config, run_dir, opts.workers, resume_from)
    try:
        # Creates the MLflow / W&B runs (config as params and artifact), or finds a resumed run's.
        open_trackers(run_dir, config).close()
        for number, stage in enumerate(stages, 1):
            header = f"[stage {number}/{len(stages)}: {stage}]"
            if stage not in todo:
                print(f"{header} finished earlier; skipped", flush=True)
                continue
            print(f"{header} started", flush=True)
            started = time.perf_counter()
            summary = STAGE_RUNNERS[stage](ctx)
            seconds = time.perf_counter() - started
            mark_done(run_dir, stage, {"seconds": round(seconds, 1), **summary})
            print(f"{header} done in {seconds:.0f} s", flush=True)
    finally:
        ctx.servers.stop()
        ray.shutdown()
    print_outcome(run_dir)
    return run_dir


def print_outcome(run_dir: Path) -> None:
    """The short result table a run ends with, and where its plots are."""
    from reflectrl.experiment.plots import run_plots
    from reflectrl.experiment.results import curve, run_summary, run_table

    print(f"results of {run_dir}:\n{run_table(run_summary(run_dir))}", flush=True)
    made = run_plots(run_dir, curve(run_dir))
    if made:
        print(f"plots: {', '.join(str(p) for p in made)}", flush=True)


def mark_done(run_dir: Path, stage: str, summary: dict[str, Any]) -> None:
    write_json(stage_marker(run_dir, stage), {"stage": stage, **summary})
