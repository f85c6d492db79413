"""Bytes (and time) per weight sync to a rollout worker: LoRA + value head vs the full module state.

python benchmarks/weight_sync.py [--models tiny,smollm2]
"""

from __future__ import annotations

import argparse
import os
import time

import gymnasium as gym
import numpy as np
import torch

from benchmarks.common import print_table, write_results
from reflectrl.config import load_config
from reflectrl.data.scratch import resolve_or_build
from reflectrl.models.loading import load_tokenizer
from reflectrl.rl.rl_module import ReflectRLModule, module_config, state_nbytes
from reflectrl.text import prompts
from reflectrl.text.tokens import label_token_ids


def build(spec: str) -> ReflectRLModule:
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    model_dir = resolve_or_build(spec)
    tokenizer = load_tokenizer(model_dir)
    obs_space = gym.spaces.Dict(
        {
            "input_ids": gym.spaces.Box(0, len(tokenizer) - 1, (256,), np.int64),
            "attention_mask": gym.spaces.Box(0, 1, (256,), np.int64),
            "option_mask": gym.spaces.Box(0.0, 1.0, (6,), np.float32),
            "live": gym.spaces.Box(0, 1, (1,), np.int64),
        }
    )
    return RLModuleSpec(
        module_class=ReflectRLModule,
        observation_space=obs_space,
        action_space=gym.spaces.Discrete(6),
        model_config=module_config(
            load_config(None, []),
            model_dir,
            label_token_ids(tokenizer, "123456", prompts.ACTION_MARKER),
        ),
    ).build()


def timed_roundtrip(get: object, put: object, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        put(get())  # type: ignore[operator]
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default="tiny,smollm2")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    rows = []
    for spec in args.models.split(","):
        source, target = build(spec), build(spec)
        lora_bytes = state_nbytes(source.get_state(inference_only=True))
        full = {k: v.detach().numpy() for k, v in source.state_dict().items()}
        full_bytes = state_nbytes(full)
        lora_s = timed_roundtrip(
            lambda s=source: s.get_state(inference_only=True), target.set_state
        )
        full_s = timed_roundtrip(
            lambda s=source: {k: v.detach().numpy().copy() for k, v in s.state_dict().items()},
            lambda st, t=target: t.load_state_dict(
                {k: torch.as_tensor(v) for k, v in st.items()}, strict=False
            ),
        )
        rows.append(
            {
                "model": spec,
                "lora_bytes": lora_bytes,
                "full_bytes": full_bytes,
                "bytes_ratio_full_over_lora": full_bytes / lora_bytes,
                "lora_roundtrip_s": lora_s,
                "full_roundtrip_s": full_s,
                "time_ratio_full_over_lora": full_s / lora_s,
            }
        )
    print_table(rows, list(rows[0]))
    path = write_results("weight_sync", {"results": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
