"""`reflectrl eval`: held-out success of a finished run or of an adapter, greedy and sampled."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from reflectrl.config import add_config_arguments
from reflectrl.errors import ConfigError
from reflectrl.evaluation.report import EvalReport


def add_commands(sub: Any) -> None:
    ev = sub.add_parser(
        "eval",
        help="evaluate a finished run or an adapter on held-out data",
        description="Play eval.episodes episodes per stage on the env's held-out split, with "
        "greedy and with sampled decoding, through the same vector env and reflection server "
        "as training, on Ray workers in parallel. Prints success rate (95% Wilson interval), "
        "mean return and mean length per stage / task kind, and writes them as JSON.",
    )
    source = ev.add_mutually_exclusive_group(required=True)
    source.add_argument("--run", metavar="DIR", help="a finished run directory")
    source.add_argument(
        "--adapter", metavar="DIR", help="a policy adapter (of `reflectrl sft` or a checkpoint)"
    )
    add_config_arguments(
        ev, "eval.episodes=60", "YAML config (default: the run's; with --adapter: defaults)"
    )
    ev.add_argument("--split", help="the env split to play (eval.split; default: held out)")
    ev.add_argument("--episodes", type=int, help="per stage and decoding (eval.episodes)")
    ev.add_argument("--seed", type=int, help="(eval.seed, else run.seed)")
    ev.add_argument(
        "--workers",
        type=int,
        default=2,
        help="eval workers at most (default 2; fewer where fewer play every episode at once)",
    )
    ev.add_argument("--out", metavar="FILE", help="JSON result (default: next to the policy)")
    ev.add_argument("--address", help="join this Ray cluster (default: $RAY_ADDRESS or local)")
    ev.set_defaults(handler=run_eval)


def run_eval(args: argparse.Namespace) -> int:
    from reflectrl.atomic_files import write_json
    from reflectrl.config import load_config
    from reflectrl.evaluation.held_out import eval_config
    from reflectrl.evaluation.report import format_table
    from reflectrl.run_dir import CONFIG_FILE

    if args.episodes is not None and args.episodes < 1:
        raise ConfigError(f"--episodes {args.episodes}: need at least 1")
    if args.workers < 1:
        raise ConfigError(f"--workers {args.workers}: need at least 1")
    overrides = list(args.overrides)
    for key, value in (("split", args.split), ("episodes", args.episodes), ("seed", args.seed)):
        if value is not None:
            overrides.append(f"eval.{key}={value}")
    if args.run:
        from reflectrl.evaluation.held_out import run_policy

        run_dir = Path(args.run)
        if not (run_dir / CONFIG_FILE).is_file():
            raise ConfigError(f"--run {run_dir}: no {CONFIG_FILE} there; is it a run directory?")
        config = load_config(args.config or run_dir / CONFIG_FILE, overrides)
        eval_config(config)  # a bad split or stage fails before any model is read
        config, source = run_policy(run_dir, config)
        home = run_dir
    else:
        config = load_config(args.config, overrides)
        eval_config(config)
        config, source = adapter_policy(config, Path(args.adapter))
        home = Path(args.adapter)
    import ray

    from reflectrl.cluster.ray_init import init_ray

    init_ray(args.address, config, args.workers)
    try:
        report = evaluate_with(config, source, args.workers, home)
    finally:
        ray.shutdown()
    print(format_table(report))
    out = Path(args.out) if args.out else home / f"eval_{report['split']}.json"
    write_json(out, report)
    print(f"wrote {out}")
    return 0


def adapter_policy(config: Any, adapter: Path) -> tuple[Any, Any]:
    """(config, PolicySource) for `--adapter`: an SFT adapter (no value head; checked as RL
    would check `policy.init_adapter`) or a checkpoint's adapter."""
    from reflectrl.evaluation.held_out import PolicySource
    from reflectrl.models.adapters import read_adapter_config

    read_adapter_config(adapter, "--adapter")
    from reflectrl.preflight import preflight  # seconds: the model libraries

    if (adapter / "value_head.pt").is_file():
        preflight(config)
        return config, PolicySource(checkpoint_adapter=adapter)
    config = config.model_copy(deep=True)
    config.policy.init_adapter = str(adapter)
    preflight(config)
    return config, PolicySource(sft_adapter=adapter)


def evaluate_with(
    config: Any, source: Any, workers: int, home: Path, servers: Any = None
) -> EvalReport:
    """On a running Ray: evaluate, with the reflection server the config serves. `servers`
    (ReflectionServers) are reused when they serve the same model, else started here (log:
    `home/eval_reflection_server.log`) and stopped after."""
    from reflectrl.data.scratch import build_model
    from reflectrl.evaluation.held_out import eval_config
    from reflectrl.evaluation.report import sft_observations
    from reflectrl.evaluation.runner import Evaluator
    from reflectrl.reflection.actor import ReflectionServers
    from reflectrl.reflection.endpoint import ReflectionEndpoint

    eval_config(config)  # a bad split or stage fails before anything starts
    own = servers is None
    servers = ReflectionServers(build_model) if own else servers
    evaluator = None
    try:
        endpoint = None
        r = config.reflection
        if r.enabled:
            if r.server == "local":
                endpoint = servers.start(r, home / "eval_reflection_server.log")
            else:
                endpoint = ReflectionEndpoint.external(r)
        evaluator = Evaluator(config, endpoint, workers, sft_observations(home))
        return evaluator.run(source, progress=True)
    finally:
        if evaluator is not None:
            evaluator.close()
        if own:
            servers.stop()
