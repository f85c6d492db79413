"""Peak memory and time of one PPO minibatch update (forward + backward) of the policy, with and
without gradient checkpointing. Each variant runs in its own process, so peak RSS is its own.

    python -m benchmarks.learner_memory [--model smollm2] [--batch 32] [--tokens 384]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

from benchmarks.common import print_table, write_results


def one_update(model: str, batch: int, tokens: int, checkpointing: bool) -> dict:
    import torch

    from reflectrl.data.scratch import resolve_or_build
    from reflectrl.models.loading import load_tokenizer
    from reflectrl.models.policy import OptionPolicy
    from reflectrl.text import prompts
    from reflectrl.text.tokens import label_token_ids

    model_dir = resolve_or_build(model)
    labels = label_token_ids(load_tokenizer(model_dir), "123456", prompts.ACTION_MARKER)
    policy = OptionPolicy(model_dir, labels, gradient_checkpointing=checkpointing)
    policy.train()
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 1000, (batch, tokens), generator=generator)
    mask = torch.ones(batch, tokens, dtype=torch.long)
    options = torch.ones(batch, 6)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    logits, values = policy(ids, mask, options)
    (logits.logsumexp(-1).mean() + values.pow(2).mean()).backward()
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "gradient_checkpointing": checkpointing,
        "update_s": seconds,
        "peak_rss_mib": peak / 1024,
        "update_rss_mib": (peak - before) / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=384)
    parser.add_argument("--variant", choices=["on", "off"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.variant:
        row = one_update(args.model, args.batch, args.tokens, args.variant == "on")
        print(json.dumps(row))
        return
    rows = []
    for variant in ("off", "on"):
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "benchmarks.learner_memory",
                "--variant",
                variant,
                "--model",
                args.model,
                "--batch",
                str(args.batch),
                "--tokens",
                str(args.tokens),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    for row in rows:
        row["memory_ratio_vs_off"] = row["update_rss_mib"] / rows[0]["update_rss_mib"]
        row["time_ratio_vs_off"] = row["update_s"] / rows[0]["update_s"]
    print_table(rows, list(rows[0]))
    payload = {"model": args.model, "batch": args.batch, "tokens": args.tokens, "results": rows}
    print(f"wrote {write_results('learner_memory', payload)}")


if __name__ == "__main__":
    main()
