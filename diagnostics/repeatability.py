"""Question: does a seeded SFT repeat, and how far does it drift when something beside the seed
changes?
Answer (see docs/repeatability.md): bitwise when run again, under load and with one torch
thread; other CPU kernels (no SIMD, MKL's SSE2 path) move a weight by at most 1.2e-07 and the
held-out loss not at all.
Results: diagnostics/results/repeatability_*.json.

Trains one player with `reflectrl sft` (a subprocess each, as a user runs it) under settings
that a seeded config does not fix, and compares each result with the first run's, weight by
weight: bitwise equal or not, the largest absolute difference of a weight, and the held-out
loss before the first step and after SFT.
    again            the same command a second time
    under load       the same, with a busy process on every core beside it
    1 torch thread   OMP_NUM_THREADS=1 (the machine's default: one thread per core)
    no SIMD kernels  ATEN_CPU_CAPABILITY=default: torch's own kernels without AVX2/AVX-512
    MKL's SSE2 path  MKL_CBWR=COMPATIBLE: MKL's matmuls by the code path of an older CPU

    python -m diagnostics.repeatability --data DIR [--config FILE] [--player policy] [--steps 40]
                                       [--variants "again,MKL's SSE2 path"]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import print_table, write_results
from diagnostics.common import RESULTS

VARIANTS: list[tuple[str, dict[str, str], bool]] = [
    ("first", {}, False),
    ("again", {}, False),
    ("under load", {}, True),
    ("1 torch thread", {"OMP_NUM_THREADS": "1"}, False),
    ("no SIMD kernels", {"ATEN_CPU_CAPABILITY": "default"}, False),
    ("MKL's SSE2 path", {"MKL_CBWR": "COMPATIBLE"}, False),
]


def spin(stop: Any) -> None:
    while not stop.is_set():
        sum(i * i for i in range(10_000))


def train(args: argparse.Namespace, out: Path, env: dict[str, str], load: bool) -> float:
    command = [
        sys.executable, "-m", "reflectrl.cli", "sft", "--config", args.config,
        "--data", args.data, "--player", args.player, "--out", str(out),
        "--set", f"sft.max_steps={args.steps}", "--set", f"sft.reflection_max_steps={args.steps}",
    ]  # fmt: skip
    stop = multiprocessing.Event()
    spinners = [
        multiprocessing.Process(target=spin, args=(stop,)) for _ in range(os.cpu_count() or 1)
    ]
    for process in spinners if load else []:
        process.start()
    started = time.perf_counter()
    try:
        subprocess.run(
            command, env={**os.environ, **env}, check=True, capture_output=True, text=True
        )
    except subprocess.CalledProcessError as err:
        raise SystemExit(f"reflectrl sft failed:\n{err.stderr[-2000:]}") from err
    finally:
        stop.set()
        for process in spinners if load else []:
            process.join()
    return time.perf_counter() - started


def weights(folder: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise SystemExit(f"no .safetensors in {folder}")
    return {f"{f.name}:{k}": v for f in files for k, v in load_file(f).items()}


def compare(first: Path, other: Path) -> dict[str, Any]:
    a, b = weights(first), weights(other)
    assert a.keys() == b.keys()
    bitwise = all(f.read_bytes() == (other / f.name).read_bytes()
                  for f in first.glob("*.safetensors"))  # fmt: skip
    largest = max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
    result = json.loads((other / "sft_result.json").read_text())
    return {
        "bitwise_equal": bitwise,
        "max_abs_weight_diff": largest,
        # before any step: the same seeded weights and rows, so only the sums can differ
        "heldout_loss_before": result["loss_before"]["eval"],
        "heldout_loss": result["loss_after"]["eval"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="a folder of `reflectrl data`")
    parser.add_argument("--config", default="configs/auto_explore_cpu.yaml")
    parser.add_argument("--player", default="policy", choices=["policy", "reflection"])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--name", default="repeatability")
    parser.add_argument("--variants", help="a comma list of variant names (the first always runs)")
    args = parser.parse_args()
    chosen = VARIANTS
    if args.variants:
        names = {v.strip() for v in args.variants.split(",")}
        unknown = names - {name for name, _, _ in VARIANTS}
        if unknown:
            parser.error(f"--variants: unknown {sorted(unknown)}")
        chosen = [v for v in VARIANTS if v[0] == "first" or v[0] in names]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for number, (name, env, load) in enumerate(chosen):
            out = Path(tmp) / str(number)
            seconds = train(args, out, env, load)
            figures = compare(Path(tmp) / "0" / args.player, out / args.player)
            rows.append({"variant": name, "seconds": round(seconds, 1), **figures})
            print(f"{name}: {seconds:.0f} s", file=sys.stderr, flush=True)
    first = rows[0]
    for row in rows:
        row["loss_before_diff"] = row["heldout_loss_before"] - first["heldout_loss_before"]
        row["heldout_loss_diff"] = row["heldout_loss"] - first["heldout_loss"]
    columns = ["variant", "bitwise_equal", "max_abs_weight_diff", "loss_before_diff",
               "heldout_loss", "heldout_loss_diff", "seconds"]  # fmt: skip
    print_table(rows, columns)
    settings = {k: getattr(args, k) for k in ("data", "config", "player", "steps")}
    path = write_results(args.name, {"settings": settings, "rows": rows}, folder=RESULTS)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
