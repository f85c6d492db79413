"""`benchmarks/gpu_learner.py` runs where only torch, transformers and peft are: its CPU
dry run (tiny shapes) goes through every variant and writes its JSON, without Ray."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHECK = """
import sys
from benchmarks.gpu_learner import main
code = main(["--dry-run", "--out", sys.argv[1]])
assert code == 0, code
assert "ray" not in sys.modules and "vllm" not in sys.modules, "imports Ray or vLLM"
"""


def test_gpu_learner_dry_run_without_ray(tmp_path: Path) -> None:
    out = tmp_path / "gpu_learner.json"
    result = subprocess.run(
        [sys.executable, "-c", CHECK, str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    payload = json.loads(out.read_text())
    rows = payload["rows"]
    assert payload["dry_run"] is True
    assert [(r["model"], r["gradient_checkpointing"]) for r in rows] == [
        ("smollm2-135m", False),
        ("smollm2-135m", True),
        ("gpt2-xl-shape", False),
        ("gpt2-xl-shape", True),
    ]
    for row in rows:
        assert row["tokens_per_s"] > 0 and row["tokens_per_update"] > 0 and row["params"] > 0
    assert all(r["time_vs_no_checkpointing"] > 0 for r in rows[1::2])
    assert "tokens_per_s" in result.stdout


def test_rollout_dtype_compares_half_precision_scoring_with_float32(tmp_path: Path) -> None:
    """`benchmarks/rollout_dtype.py` on the tiny model: float32 against itself is exact, and
    bf16 / fp16 scoring of real Taxi prompts stays close to it (a dtype that broke the label
    logits, e.g. the mask overflowing float16, would not)."""
    out = tmp_path / "rollout_dtype"
    args = ["--rows", "16", "--model", "tiny", "--device", "cpu", "--name", str(out)]
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.rollout_dtype", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    rows = {r["dtype"]: r for r in json.loads(out.with_suffix(".json").read_text())["rows"]}
    assert set(rows) == {"float32", "bfloat16", "float16"}
    assert rows["float32"]["max_abs_prob_diff"] == 0 and rows["float32"]["same_argmax"] == 1
    for half in ("bfloat16", "float16"):
        assert 0 < rows[half]["mean_abs_prob_diff"] < 0.01
        assert rows[half]["mean_kl_nats"] < 1e-3 and rows[half]["rows_per_s"] > 0
