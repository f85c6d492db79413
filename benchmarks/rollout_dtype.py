"""Option scoring of a rollout batch in half precision against float32: do the label
probabilities agree, and how many rows per second does each score?

The rollout workers of `configs/gpu.yaml` score the menu in bf16 (`policy.dtype`) while the
learner trains in float32, so the PPO ratio's old log-probs come from bf16. This measures how
far they sit from float32's: the same `OptionPolicy` (SmolLM2-135M-Instruct by default, the
GPU recipe's policy, LoRA at its zero init) in float32 and in each half dtype, over the same
rows: Taxi policy prompts of `configs/gpu.yaml` (observation + menu, the no-reflection layout;
reflections would only lengthen them) from envs stepped with random actions.

Reported per dtype: the largest and the mean absolute difference of a label probability, the
share of rows whose most likely label is the same, the mean KL(float32 || dtype) in nats, the
largest |log-prob difference| of the label sampled from float32, and rows/s (after a warm-up),
with its ratio to float32's in the same run.

    python -m benchmarks.rollout_dtype [--rows 128] [--batch 16] [--device cpu|cuda]
                                       [--model smollm2] [--dtypes bfloat16,float16]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.common import print_table, write_results

REPO = Path(__file__).resolve().parents[1]


def policy_rows(model: str, rows: int, seed: int = 0) -> tuple[Any, list[int], dict[str, Any]]:
    """(model dir, label token ids, {input_ids, attention_mask, option_mask} of `rows` rows)."""
    from reflectrl.config import load_config
    from reflectrl.data.scratch import resolve_or_build
    from reflectrl.models.loading import load_tokenizer
    from reflectrl.rollout.vector_env import ReflectRLVectorEnv
    from reflectrl.text import prompts
    from reflectrl.text.tokens import label_token_ids

    overrides = [f"policy.model={model}", "reflection.enabled=false", f"run.seed={seed}"]
    config = load_config(REPO / "configs" / "gpu.yaml", overrides)
    model_dir = resolve_or_build(model)
    tokenizer = load_tokenizer(model_dir)
    env = ReflectRLVectorEnv(config, tokenizer, None, num_envs=16)
    labels = label_token_ids(tokenizer, config.policy.labels[:6], prompts.ACTION_MARKER)
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    batches = []
    while sum(len(b["input_ids"]) for b in batches) < rows:
        batches.append({k: np.asarray(v) for k, v in obs.items()})
        valid = [np.flatnonzero(m) for m in obs["option_mask"]]
        obs, *_ = env.step(np.array([rng.choice(v) for v in valid]))
    out = {k: torch.as_tensor(np.concatenate([b[k] for b in batches])[:rows]) for k in batches[0]}
    return model_dir, labels, out


def score(policy: Any, rows: dict[str, Any], batch: int, device: str) -> tuple[Any, float]:
    """Label probabilities of every row (float32, on the CPU) and rows per second."""

    def run() -> Any:
        probs = []
        with torch.no_grad():
            for start in range(0, len(rows["input_ids"]), batch):
                part = {k: v[start : start + batch].to(device) for k, v in rows.items()}
                logits, _ = policy(part["input_ids"], part["attention_mask"], part["option_mask"])
                probs.append(torch.softmax(logits.float(), dim=-1).cpu())
        return torch.cat(probs)

    run()  # warm-up (kernels, caches)
    if device == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    probs = run()
    if device == "cuda":
        torch.cuda.synchronize()
    return probs, len(probs) / (time.perf_counter() - started)


def main() -> None:
    from reflectrl.models.policy import OptionPolicy

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16, help="rows per forward pass")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--dtypes", default="bfloat16,float16")
    parser.add_argument("--name", default="rollout_dtype", help="results file name")
    args = parser.parse_args()
    started = time.perf_counter()
    model_dir, labels, rows = policy_rows(args.model, args.rows)
    results, reference = [], None
    for dtype in ["float32", *args.dtypes.split(",")]:
        policy = OptionPolicy(model_dir, labels, dtype=getattr(torch, dtype)).to(args.device)
        policy.eval()
        probs, rate = score(policy, rows, args.batch, args.device)
        if reference is None:
            reference, reference_rate = probs, rate
            sampled = torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(0))
        valid = rows["option_mask"] > 0
        diff = (probs - reference).abs()[valid]
        kl = reference * (reference.clamp_min(1e-30).log() - probs.clamp_min(1e-30).log())
        logp = (probs.gather(1, sampled).log() - reference.gather(1, sampled).log()).abs()
        results.append({
            "dtype": dtype,
            "rows": len(probs),
            "max_abs_prob_diff": float(diff.max()),
            "mean_abs_prob_diff": float(diff.mean()),
            "same_argmax": float((probs.argmax(1) == reference.argmax(1)).float().mean()),
            "mean_kl_nats": float(kl.sum(1).mean()),
            "max_abs_logp_diff_sampled": float(logp.max()),
            "rows_per_s": rate,
            "speed_vs_float32": rate / reference_rate,
        })  # fmt: skip
        del policy
    columns = list(results[0])
    print_table(results, columns)
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    command = "python -m benchmarks.rollout_dtype " + " ".join(sys.argv[1:])
    payload = {"command": command.strip(), "device": device_name, "model": args.model,
               "prompt_tokens_max": int(rows["attention_mask"].sum(1).max()),
               "batch": args.batch, "rows": results,
               "wall_s": round(time.perf_counter() - started)}  # fmt: skip
    print(write_results(args.name, payload))


if __name__ == "__main__":
    main()
