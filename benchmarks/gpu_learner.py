"""PPO update throughput of the policy on a GPU: tokens/s and model FLOPs utilisation (MFU).

Needs only torch, transformers and peft (no Ray, no vLLM). Models are random-initialised
from their configs (weights do not change speed): SmolLM2-135M's shape and GPT-2 XL's
(1.5B). Each variant runs `OptionPolicy` (LoRA + value head, the label-token head) through
the PPO update exactly as the learner does: micro-batches of `--micro-batch` rows, clipped
surrogate + value loss + entropy, one AdamW step per minibatch; bf16, with and without
gradient checkpointing.

FLOPs per token = 4 N + 4 L s d: the forward (2 N) and the backward into the activations
(2 N) of the frozen N-parameter trunk (LoRA needs no weight gradients of the trunk), plus
attention scores (L layers, s tokens, width d); gradient checkpointing runs the forward
again, which MFU does not count (it is the standard "model FLOPs" utilisation).

python -m benchmarks.gpu_learner                 # on a CUDA machine: the table + JSON
python -m benchmarks.gpu_learner --dry-run       # tiny shapes on CPU, to check the script
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from reflectrl.models.policy import OptionPolicy

RESULTS = Path(__file__).resolve().parent / "results"
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0}


def model_config(name: str, dry_run: bool) -> Any:
    from transformers import GPT2Config, LlamaConfig

    if name == "smollm2-135m":
        return LlamaConfig(
            vocab_size=49152,
            hidden_size=576,
            intermediate_size=1536,
            num_hidden_layers=2 if dry_run else 30,
            num_attention_heads=9,
            num_key_value_heads=3,
            max_position_embeddings=2048,
            tie_word_embeddings=True,
        )
    if name == "gpt2-xl-shape":
        return GPT2Config(
            vocab_size=50257,
            n_positions=1024,
            n_embd=64 if dry_run else 1600,
            n_layer=2 if dry_run else 48,
            n_head=4 if dry_run else 25,
        )
    raise ValueError(f"unknown model {name!r}")


LORA_TARGETS = {"smollm2-135m": ["q_proj", "v_proj"], "gpt2-xl-shape": ["c_attn"]}


def save_random(name: str, directory: Path, dry_run: bool) -> tuple[Path, int]:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(model_config(name, dry_run))
    params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(directory)
    return directory, params


def ppo_loss(policy: OptionPolicy, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    logits, values = policy(batch["input_ids"], batch["attention_mask"], batch["option_mask"])
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(1, batch["actions"][:, None]).squeeze(1)
    ratio = torch.exp(logp - batch["old_logp"])
    adv = batch["advantages"]
    surrogate = torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    value_loss = (values - batch["returns"]) ** 2
    return (-surrogate + 0.5 * value_loss - 0.01 * entropy).mean()


def fake_batch(rows: int, seq: int, vocab: int, device: str) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(seq // 2, seq + 1, (rows,), generator=g)
    mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()
    batch = {
        "input_ids": torch.randint(0, vocab, (rows, seq), generator=g) * mask,
        "attention_mask": mask,
        "option_mask": torch.ones(rows, 6),
        "actions": torch.randint(0, 6, (rows,), generator=g),
        "old_logp": torch.full((rows,), -1.79),
        "advantages": torch.randn(rows, generator=g),
        "returns": torch.randn(rows, generator=g),
    }
    return {k: v.to(device) for k, v in batch.items()}


def measure(
    name: str, checkpointing: bool, args: argparse.Namespace, device: str, dtype: torch.dtype
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        model_dir, params = save_random(name, Path(tmp), args.dry_run)
        policy = OptionPolicy(
            model_dir,
            label_token_ids=list(range(11, 17)),
            lora_target_modules=LORA_TARGETS[name],
            gradient_checkpointing=checkpointing,
            dtype=dtype,
        ).to(device)
    policy.train()
    config = policy.lm.get_base_model().config
    layers, width = config.num_hidden_layers, config.hidden_size
    trainable = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-5)
    batch = fake_batch(args.minibatch, args.seq, config.vocab_size, device)
    real_tokens = int(batch["attention_mask"].sum())

    def update() -> None:
        optimizer.zero_grad(set_to_none=True)
        for start in range(0, args.minibatch, args.micro_batch):
            part = {k: v[start : start + args.micro_batch] for k, v in batch.items()}
            (ppo_loss(policy, part) * part["actions"].numel() / args.minibatch).backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()

    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    update()  # warm-up (allocator, kernels)
    _sync(device)
    started = time.perf_counter()
    for _ in range(args.steps):
        update()
    _sync(device)
    seconds = (time.perf_counter() - started) / args.steps
    tokens_per_s = real_tokens / seconds
    flops_per_token = 4 * params + 4 * layers * args.seq * width
    achieved = tokens_per_s * flops_per_token
    peak = _peak_flops(device)
    return {
        "model": name,
        "params": params,
        "gradient_checkpointing": checkpointing,
        "dtype": str(dtype).removeprefix("torch."),
        "minibatch_rows": args.minibatch,
        "micro_batch": args.micro_batch,
        "seq": args.seq,
        "tokens_per_update": real_tokens,
        "update_s": round(seconds, 4),
        "tokens_per_s": round(tokens_per_s, 1),
        "model_tflops_per_s": round(achieved / 1e12, 3),
        "mfu": None if peak is None else round(achieved / peak, 4),
        "peak_memory_gb": round(torch.cuda.max_memory_allocated() / 2**30, 2)
        if device == "cuda"
        else None,
    }


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _peak_flops(device: str) -> float | None:
    if device != "cuda":
        return None
    gpu = torch.cuda.get_device_name()
    for key, tflops in PEAK_BF16_TFLOPS.items():
        if key in gpu:
            return tflops * 1e12
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="smollm2-135m,gpt2-xl-shape")
    parser.add_argument("--minibatch", type=int, default=64, help="rows per PPO minibatch")
    parser.add_argument("--micro-batch", type=int, default=16, help="rows per forward/backward")
    parser.add_argument("--seq", type=int, default=512, help="tokens per prompt (padded)")
    parser.add_argument("--steps", type=int, default=5, help="timed updates, after a warm-up")
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on CPU, float32")
    parser.add_argument("--out", type=Path, default=RESULTS / "gpu_learner.json")
    args = parser.parse_args(argv)
    if args.dry_run:
        device, dtype = "cpu", torch.float32
        args.minibatch, args.micro_batch, args.seq, args.steps = 4, 2, 32, 1
    elif torch.cuda.is_available():
        device, dtype = "cuda", torch.bfloat16
    else:
        print("no CUDA device: run on a GPU machine, or pass --dry-run to check the script")
        return 2
    rows = [
        measure(name, checkpointing, args, device, dtype)
        for name in args.models.split(",")
        for checkpointing in (False, True)
    ]
    columns = ["model", "gradient_checkpointing", "update_s", "tokens_per_s", "mfu"]
    print("  ".join(columns))
    for row in rows:
        print("  ".join(str(row[c]) for c in columns))
    for row in rows[1::2]:  # checkpointing costs: time ratio against the same model without
        base = next(
            r for r in rows if r["model"] == row["model"] and not r["gradient_checkpointing"]
        )
        row["time_vs_no_checkpointing"] = round(row["update_s"] / base["update_s"], 3)
    payload = {
        "device": torch.cuda.get_device_name() if device == "cuda" else platform.processor(),
        "torch": torch.__version__,
        "dry_run": args.dry_run,
        "flops_per_token": "4 N + 4 L s d (forward + backward into activations; LoRA)",
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
