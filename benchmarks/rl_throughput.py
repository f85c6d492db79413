"""RL throughput of the CPU recipe end to end, one commit against another, in the same run.

Each variant is a child process that runs the RL stage of `configs/cpu.yaml` *of the checkout
it measures* (its own envs per worker, fragment length, epochs) on real Ray, RLlib and, with
reflection, a real vLLM server, starting both players from the SFT models of a finished run
(`--from-run DIR`, which holds `sft/policy` and `sft/reflection`). After `--warmup` iterations
(server compile, the reflection cache filling) it times `--iterations` more and reports:

- env steps/s end to end (env steps over the iterations' wall time),
- env steps/s of sampling (over the sampling phase only),
- the share of an iteration in sampling and in the update (+ weight sync),
- where the workers' sampling time went (checkouts that count it): stepping envs and
  rendering prompts, waiting for reflections, the policy's forward pass and RLlib.

    python -m benchmarks.rl_throughput --from-run RUN [--baseline CHECKOUT] [--iterations 5]
                                       [--variant NAME:KEY=VALUE[,KEY=VALUE]] [--no-plain]

`--baseline` is a checkout of the older commit (`git worktree add /tmp/base <commit>`); its
variants run with PYTHONPATH pointing there, so Ray's workers import that code too.
`--variant` adds this checkout with overrides (e.g. `overlap:ppo.max_staleness=1`), compared
with the first row of the same reflection setting; `--no-plain` skips the reflection-less rows.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def child(args: argparse.Namespace) -> None:
    """Runs inside the measured checkout (PYTHONPATH): one variant, a JSON line on stdout."""
    import ray

    from reflectrl.config import load_config
    from reflectrl.rl.driver import Run

    run_dir = Path(args.from_run)
    overrides = [
        f"policy.model={run_dir / 'sft' / 'policy'}",
        f"reflection.model={run_dir / 'sft' / 'reflection'}",
        f"reflection.enabled={str(args.reflection).lower()}",
        "run.checkpoint_every=100000",
        "eval.every=0",
        "curriculum.enabled=false",  # every iteration plays `full`
        *args.set,
    ]
    config = load_config(Path(args.code) / "configs" / "cpu.yaml", overrides)
    ray.init(address="local", num_cpus=3, include_dashboard=False, log_to_driver=False)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        run = Run(config, Path(tmp) / "run", workers=2)
        try:
            run.start()
            for _ in range(args.warmup):
                run.train_iteration()
            for _ in range(args.iterations):
                rows.append(run.train_iteration())
        finally:
            run.close()
            ray.shutdown()
    print("RESULT " + json.dumps(summarize(rows)), flush=True)


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    steps = sum(r["env_steps_per_s"] * r["iteration_s"] for r in rows)
    wall = sum(r["iteration_s"] for r in rows)
    sample = sum(r["sample_s"] for r in rows)
    out: dict[str, Any] = {
        "iterations": len(rows),
        "env_steps": round(steps),
        "env_steps_per_iteration": round(steps / len(rows)),
        "wall_s": round(wall, 2),
        "end_to_end_steps_per_s": steps / wall,
        "sampling_steps_per_s": steps / sample,
        "sampling_share": sample / wall,
        "update_share": 1 - sample / wall,
        "reflection_cache_hit_rate": None,
    }
    parts = ("env_worker_s", "reflection_worker_s", "policy_worker_s")
    if all(p in rows[0] for p in parts):  # checkouts that count where sampling time goes
        for part in parts:
            out[f"{part.removesuffix('_worker_s')}_ms_per_step"] = (
                1000 * sum(r[part] for r in rows) / steps
            )
    if "reflection_cache_hits" in rows[0]:
        calls = rows[-1]["reflection_calls"] - rows[0]["reflection_calls"]
        hits = rows[-1]["reflection_cache_hits"] - rows[0]["reflection_cache_hits"]
        out["reflection_cache_hit_rate"] = hits / calls if calls else None
    return out


def measure(
    code: Path, name: str, reflection: bool, args: argparse.Namespace, extra: list[str]
) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(code), "HF_HUB_OFFLINE": "1"}
    env.setdefault("RAY_AUTH_MODE", "disabled")
    # The script by path, from the measured checkout: `-m` would put this checkout first.
    command = [
        sys.executable, str(Path(__file__).resolve()), "--child",
        "--code", str(code), "--from-run", str(args.from_run),
        "--iterations", str(args.iterations), "--warmup", str(args.warmup),
    ]  # fmt: skip
    if reflection:
        command.append("--reflection")
    for text in [*args.set, *extra]:
        command += ["--set", text]
    commit = subprocess.run(
        ["git", "describe", "--always", "--dirty"], capture_output=True, text=True, cwd=code
    ).stdout.strip()
    started = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=code, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        raise SystemExit(f"{name} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    result = json.loads(lines[-1].removeprefix("RESULT "))
    print(f"{name} reflection={reflection}: {result}", flush=True)
    return {"code": name, "commit": commit, "reflection": reflection,
            "process_s": round(time.perf_counter() - started, 1), **result}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--from-run", type=Path, required=True)
    parser.add_argument("--baseline", type=Path, help="a checkout of the commit to compare with")
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--set", action="append", default=[], help="extra config overrides")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--code", type=Path, default=REPO, help=argparse.SUPPRESS)
    parser.add_argument("--reflection", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--variant", action="append", default=[], help="NAME:KEY=VALUE[,...]")
    parser.add_argument("--no-plain", action="store_true", help="only the runs with reflection")
    parser.add_argument("--out", default="rl_throughput")
    args = parser.parse_args()
    if args.child:
        return child(args)
    args.from_run = args.from_run.resolve()  # the children run in the measured checkout
    from benchmarks.common import print_table, write_results

    codes: list[tuple[str, Path, list[str]]] = []
    if args.baseline:
        codes.append(("baseline", args.baseline, []))
    codes.append(("this", REPO, []))
    for text in args.variant:
        name, _, overrides = text.partition(":")
        codes.append((name, REPO, overrides.split(",")))
    rows = [
        measure(code, name, reflection, args, extra)
        for reflection in ((True,) if args.no_plain else (True, False))
        for name, code, extra in codes
    ]
    for row in rows:
        base = next(r for r in rows if r["reflection"] == row["reflection"])
        if base is not row:
            row["end_to_end_vs_baseline"] = (
                row["end_to_end_steps_per_s"] / base["end_to_end_steps_per_s"]
            )
            row["sampling_vs_baseline"] = row["sampling_steps_per_s"] / base["sampling_steps_per_s"]
    print_table(
        rows,
        ["code", "commit", "reflection", "env_steps_per_iteration", "end_to_end_steps_per_s",
         "sampling_steps_per_s", "update_share", "env_ms_per_step", "reflection_ms_per_step",
         "policy_ms_per_step", "reflection_cache_hit_rate", "end_to_end_vs_baseline"],
    )  # fmt: skip
    command = "python -m benchmarks.rl_throughput " + " ".join(sys.argv[1:])
    print(write_results(args.out, {"command": command, "rows": rows}))


if __name__ == "__main__":
    main()
