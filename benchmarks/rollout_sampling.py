"""Env steps/s of one rollout worker sampling with the policy LM, with and without the rollout
savings: trimming each batch to its longest real prompt, and skipping the LM on the episodes'
last observations (NEXT_STEP autoreset ignores the action computed for them).

One RLlib EnvRunner in this process, the default config's 4 envs, DangerousTaxi with the
policy's own menu prompts (reflection off, so the policy's forward is what is measured), the
policy model from the config (SmolLM2 by default). Variants run one after the other in one
process, from the same weights and env seeds; each samples `--steps` env steps after a warm-up.

    python -m benchmarks.rollout_sampling [--steps 64] [--set policy.model=tiny]
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from benchmarks.common import print_table, write_results

VARIANTS: dict[str, dict[str, Any]] = {
    "reference": {"trim_padding": False, "live_rows_only": False},
    "trim": {"trim_padding": True, "live_rows_only": False},
    "trim_live_rows": {"trim_padding": True, "live_rows_only": True},
}


def sample(overrides: list[str], options: dict[str, Any], steps: int) -> dict[str, Any]:
    import torch

    from reflectrl.config import load_config
    from tests.support.in_process import build_in_process

    config = load_config(None, ["reflection.enabled=false", *overrides])
    local = build_in_process(config, policy_overrides={"trim_padding": options["trim_padding"]})
    module = local.runner.module  # the EnvRunner's own copy of the policy
    module.live_rows_only = options["live_rows_only"]
    forwarded = {"lm_rows": 0, "lm_tokens": 0}

    def count(_module: Any, _args: Any, kwargs: dict[str, Any], _out: Any) -> None:
        rows, width = kwargs["input_ids"].shape
        forwarded["lm_rows"] += rows
        forwarded["lm_tokens"] += rows * width

    module.policy.lm.get_base_model().base_model.register_forward_hook(count, with_kwargs=True)
    torch.manual_seed(0)
    local.runner.sample(num_timesteps=8, explore=True)  # warm-up (first reset, allocations)
    forwarded.update(lm_rows=0, lm_tokens=0)
    started = time.perf_counter()
    episodes = local.runner.sample(num_timesteps=steps, explore=True)
    seconds = time.perf_counter() - started
    taken = sum(len(e) for e in episodes)
    return {
        "env_steps": taken,
        "seconds": seconds,
        "env_steps_per_s": taken / seconds,
        "lm_rows_per_step": forwarded["lm_rows"] / taken,
        "lm_tokens_per_step": forwarded["lm_tokens"] / taken,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    torch.set_num_threads(args.threads)
    rows = []
    for name, options in VARIANTS.items():
        print(f"sampling with {name} ...", flush=True)
        rows.append({"variant": name, **sample(args.overrides, options, args.steps)})
    base = rows[0]["env_steps_per_s"]
    for row in rows:
        row["speedup_vs_reference"] = row["env_steps_per_s"] / base
    print_table(
        rows,
        ["variant", "env_steps", "env_steps_per_s", "speedup_vs_reference", "lm_rows_per_step",
         "lm_tokens_per_step"],
    )  # fmt: skip
    name = "rollout_sampling" if not args.overrides else "rollout_sampling_custom"
    payload = {"overrides": args.overrides, "threads": args.threads, "rows": rows}
    print(f"wrote {write_results(name, {'variants': VARIANTS, **payload})}")


if __name__ == "__main__":
    main()
