"""An estimate of one RL iteration of `configs/gpu.yaml` on an H100-class GPU, from FLOPs
measured here (torch's FlopCounterMode, on the CPU: FLOPs do not depend on the device).

Measured per row, with SmolLM2-135M-Instruct (the recipe's model) on real Taxi prompts of the
recipe without their reflection, then scaled by (prompt + reflection tokens) / prompt tokens for
the reflection the policy also reads (linear in tokens: attention is a small share here):
- scoring: the policy's forward pass (the rollout workers' menu scoring);
- update: the PPO update's forward and backward (LoRA + value head trainable, trunk frozen);
- reflection: the reflection model's prefill of its prompt and the decoding of `max_tokens`.

The iteration's arithmetic then takes stated assumptions, not measurements: peak FLOP rates of
an H100 SXM, a model FLOPs utilisation for batched work, and a fixed time per vLLM engine step
for decoding, which for a 135M model is bound by per-step overhead rather than FLOPs (each
step reads 0.27 GB of bf16 weights: 0.08 ms at 3.35 TB/s).

    python -m benchmarks.gpu_iteration_estimate [--engine-step-ms 5] [--mfu 0.3]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.common import write_results
from benchmarks.rollout_dtype import policy_rows

REPO = Path(__file__).resolve().parents[1]
H100 = {"bf16_tflops": 989.0, "fp32_tflops": 67.0}  # dense peaks, H100 SXM datasheet


def flops(fn: Callable[[], object]) -> float:
    with FlopCounterMode(display=False) as counter:
        fn()
    return float(counter.get_total_flops())


def main() -> None:
    from reflectrl.config import load_config
    from reflectrl.models.loading import load_causal_lm
    from reflectrl.models.policy import OptionPolicy

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--mfu", type=float, default=0.3, help="assumed, for batched work")
    parser.add_argument("--engine-step-ms", type=float, default=5.0, help="assumed, vLLM decode")
    parser.add_argument("--forward-ms", type=float, default=10.0, help="assumed, one scoring pass")
    args = parser.parse_args()
    started = time.perf_counter()
    config = load_config(REPO / "configs" / "gpu.yaml")
    model_dir, labels, rows = policy_rows("smollm2", args.rows)
    tokens = float(rows["attention_mask"].sum(1).float().mean())
    policy = OptionPolicy(model_dir, labels)
    policy.eval()
    with torch.no_grad():
        score = flops(lambda: policy(rows["input_ids"], rows["attention_mask"],
                                     rows["option_mask"])) / args.rows  # fmt: skip
    policy.train()

    def update() -> None:
        logits, values = policy(rows["input_ids"], rows["attention_mask"], rows["option_mask"])
        (torch.log_softmax(logits, -1)[:, 0].mean() + values.pow(2).mean()).backward()

    update_row = flops(update) / args.rows
    r = config.reflection
    with_reflection = (tokens + r.max_tokens) / tokens
    score, update_row = score * with_reflection, update_row * with_reflection
    lm = load_causal_lm(model_dir)
    lm.eval()
    prompt = rows["input_ids"][:1, : int(tokens)]
    with torch.no_grad():
        reflection = flops(lambda: lm.generate(prompt, max_new_tokens=r.max_tokens,
                                               min_new_tokens=r.max_tokens, do_sample=False,
                                               pad_token_id=0))  # fmt: skip

    # One iteration: workers x envs_per_worker envs, rollout_fragment_length rounds each.
    workers, envs = 2, config.env.envs_per_worker
    rounds = config.ppo.rollout_fragment_length
    steps = workers * envs * rounds
    bf16 = H100["bf16_tflops"] * 1e12 * args.mfu
    fp32 = H100["fp32_tflops"] * 1e12 * 0.5
    decode_s = rounds * r.max_tokens * args.engine_step_ms / 1e3  # the workers' batches overlap
    prefill_s = steps * reflection / bf16
    scoring_s = max(rounds * args.forward_ms / 1e3, steps * score / bf16)
    update_s = config.ppo.num_epochs * steps * update_row / fp32
    total = decode_s + prefill_s + scoring_s + update_s
    lines = [
        f"measured FLOPs per row ({tokens:.0f} prompt + {r.max_tokens} reflection tokens): "
        f"scoring {score / 1e9:.1f} G, "
        f"update {update_row / 1e9:.1f} G, reflection ({r.max_tokens} tokens) "
        f"{reflection / 1e9:.1f} G",
        f"iteration: {workers} workers x {envs} envs x {rounds} rounds = {steps} env steps",
        f"reflection decode: {rounds} rounds x {r.max_tokens} engine steps x "
        f"{args.engine_step_ms:g} ms = {decode_s:.2f} s",
        f"reflection FLOPs: {steps} x {reflection / 1e9:.1f} G / ({H100['bf16_tflops']:g} T x "
        f"{args.mfu:g}) = {prefill_s * 1e3:.1f} ms",
        f"scoring: max({rounds} forwards x {args.forward_ms:g} ms, FLOPs {steps} x "
        f"{score / 1e9:.1f} G / {bf16 / 1e12:.0f} T) = {scoring_s:.2f} s",
        f"update (float32): {config.ppo.num_epochs} epochs x {steps} rows x "
        f"{update_row / 1e9:.1f} G / ({H100['fp32_tflops']:g} T x 0.5) = {update_s:.2f} s",
        f"total ~{total:.1f} s per iteration, ~{steps / total:.0f} env steps/s",
    ]
    print("\n".join(lines))
    command = "python -m benchmarks.gpu_iteration_estimate " + " ".join(sys.argv[1:])
    payload = {"command": command.strip(), "gpu": "H100 SXM (assumed, not measured)",
               "assumptions": {**H100, "mfu_bf16": args.mfu, "fp32_utilisation": 0.5,
                               "engine_step_ms": args.engine_step_ms,
                               "forward_ms": args.forward_ms},
               "measured_flops_per_row": {"prompt_tokens": tokens, "scoring": score,
                                          "update": update_row, "reflection": reflection},
               "estimate_s": {"reflection_decode": decode_s, "reflection_flops": prefill_s,
                              "scoring": scoring_s, "update": update_s, "total": total},
               "arithmetic": lines, "wall_s": round(time.perf_counter() - started)}  # fmt: skip
    print(write_results("gpu_iteration_estimate", payload))


if __name__ == "__main__":
    main()
