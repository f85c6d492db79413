"""SFT data and SFT speed: data rows/s per env, SFT steps/s and peak memory per model.

1. `reflectrl data` on each env (tiny tokenizer; Taxi, AutoExplore on the installed `gymnasium`
   tree, ALFWorld on a few freshly generated games): rows and env steps per second.
2. SFT of each player for a few steps on Taxi data, for the tiny model and SmolLM2: steps/s
   and peak RSS, with our completion-only head (LM head only at completion positions) and,
   as the reference in the same run, TRL's own loss over the full-vocabulary logits. Each
   variant runs in its own process, so peak RSS is that variant's.

    python -m benchmarks.sft_speed [--steps 8] [--episodes 20] [--models tiny smollm2]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import print_table, write_results

REPO = Path(__file__).resolve().parents[1]
TINY = ["policy.model=tiny", "reflection.model=tiny"]


def env_configs(tmp: Path) -> dict[str, tuple[str | None, list[str]]]:
    from reflectrl.envs.alfworld import generator as gen
    from reflectrl.envs.auto_explore.tasks import generate_tasks, write_tasks

    tasks = tmp / "tasks.jsonl"
    write_tasks(generate_tasks(["pkg:gymnasium"], seed=0), tasks)
    games = tmp / "games"
    gen.generate_games(games, 8, 0, valid_seen=1 / 8, valid_unseen=1 / 8)
    return {
        "dangerous_taxi": (None, TINY),
        "auto_explore": (
            str(REPO / "configs" / "auto_explore.yaml"),
            [*TINY, f"env.options.tasks={tasks}", "env.options.unseen_roots=[]"],
        ),
        "alfworld": (
            str(REPO / "configs" / "alfworld.yaml"),
            [*TINY, f"env.options.data_dir={games}"],
        ),
    }


def data_speed(episodes: int, tmp: Path) -> list[dict[str, Any]]:
    from reflectrl.config import load_config
    from reflectrl.data.dataset import write_dataset

    rows = []
    for name, (path, overrides) in env_configs(tmp).items():
        config = load_config(path, overrides)
        started = time.perf_counter()
        stats = write_dataset(config, tmp / f"data_{name}", episodes=episodes, progress=False)
        seconds = time.perf_counter() - started
        n = sum(v for k, v in stats.items() if k.startswith("rows_"))
        rows.append(
            {
                "env": name,
                "episodes": episodes,
                "steps": stats["steps"],
                "rows": n,
                "seconds": round(seconds, 2),
                "rows_per_s": n / seconds,
                "steps_per_s": stats["steps"] / seconds,
            }
        )
    return rows


def sft_variant(model: str, player: str, full_logits: bool, steps: int, data: Path) -> dict:
    """One variant, in this process (run as a child by `main`): steps/s after one warm-up."""
    from reflectrl.config import load_config
    from reflectrl.sft.trainer import build_trainer

    config = load_config(
        None,
        [
            f"policy.model={model}",
            f"reflection.model={model}",
            f"sft.max_steps={steps + 1}",
            "sft.batch_size=8",
            "sft.eval_steps=100000",
        ],
    )
    with tempfile.TemporaryDirectory() as work:
        job = build_trainer(
            config, data, player, Path(work), progress=False, full_logits=full_logits
        )
        times: list[float] = []

        from transformers import TrainerCallback

        class Clock(TrainerCallback):
            def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
                self.started = time.perf_counter()

            def on_step_end(self, *args: Any, **kwargs: Any) -> None:
                times.append(time.perf_counter() - self.started)

        job.trainer.add_callback(Clock())
        job.trainer.train()
    measured = times[1:]  # the first step warms up allocators and kernels
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "model": model,
        "player": player,
        "loss": "full-vocab logits (TRL)" if full_logits else "completion head (ours)",
        "steps": len(measured),
        "s_per_step": sum(measured) / len(measured),
        "peak_rss_mib": round(peak_mib),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2"])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.child:  # model, player, full_logits, data dir
        model, player, full, data = args.child.split(",")
        print(json.dumps(sft_variant(model, player, full == "1", args.steps, Path(data))))
        return
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        data_rows = data_speed(args.episodes, tmp)
        print_table(data_rows, ["env", "episodes", "steps", "rows", "seconds", "rows_per_s"])
        sft_rows = []
        for model in args.models:
            from reflectrl.config import load_config
            from reflectrl.data.dataset import write_dataset

            data = tmp / f"sft_data_{model}"
            config = load_config(None, [f"policy.model={model}", f"reflection.model={model}"])
            write_dataset(config, data, episodes=args.episodes, progress=False)
            for player in ("policy", "reflection"):
                pair = []
                for full in ("0", "1"):
                    child = [
                        sys.executable,
                        "-m",
                        "benchmarks.sft_speed",
                        "--steps",
                        str(args.steps),
                    ]
                    child += ["--child", f"{model},{player},{full},{data}"]
                    done = subprocess.run(
                        child, capture_output=True, text=True, cwd=REPO, check=True
                    )
                    pair.append(json.loads(done.stdout.strip().splitlines()[-1]))
                pair[0]["speedup_vs_trl_loss"] = pair[1]["s_per_step"] / pair[0]["s_per_step"]
                pair[0]["memory_ratio_vs_trl_loss"] = (
                    pair[0]["peak_rss_mib"] / pair[1]["peak_rss_mib"]
                )
                sft_rows += pair
                print_table(pair, ["model", "player", "loss", "s_per_step", "peak_rss_mib"])
    print_table(
        sft_rows,
        ["model", "player", "loss", "s_per_step", "peak_rss_mib", "speedup_vs_trl_loss"],
    )
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO
    ).stdout.strip()
    path = write_results(
        "sft_speed",
        {"commit": commit, "batch_size": 8, "data": data_rows, "sft": sft_rows},
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
