"""One PPO iteration's update on a fixed recorded batch: today's path vs the new one, same run.

The batch is one iteration of the default config (SmolLM2 policy, 2 workers x 4 envs x 16
steps = 128 env steps, reflections from a real SmolLM2 vLLM server, so prompts have their real
lengths), recorded once with `--record` into benchmarks/data/. Each variant runs in its own
process (its own peak RSS) from the same initial weights:

- reference: the launch path before this benchmark existed: RLlib's stock PPO learner, every
  row (bootstrap rows included) through the LM at the full 384-token width, a separate no-grad
  value pass over all rows (micro-batches of 16), gradient checkpointing on;
- fast: the default now: loss rows only, micro-batches of `policy.micro_batch_size` grouped by
  length and trimmed, GAE values from the rollouts, no checkpointing;
- fast_mbN / fast_ckpt: the same with another micro-batch size / with checkpointing.

    python -m benchmarks.learner_update --record      # once (~10 min: vLLM + 128 env steps)
    python -m benchmarks.learner_update [--variants reference,fast,fast_mb16]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import pickle
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import print_table, write_results

BATCH = Path(__file__).resolve().parent / "data" / "default_batch.pkl.gz"
REFERENCE = {
    "trim_padding": False,
    "values_from_rollouts": False,
    "gradient_checkpointing": True,
    "micro_batch_size": 16,
}
VARIANTS: dict[str, dict[str, Any]] = {
    "reference": REFERENCE,
    "fast": {},
    "fast_mb4": {"micro_batch_size": 4},
    "fast_mb16": {"micro_batch_size": 16},
    "fast_ckpt": {"gradient_checkpointing": True},
}


def default_config(overrides: list[str]) -> Any:
    from reflectrl.config import load_config

    # One in-process worker with the 8 envs of 2 workers x 4: the same 128-step batch shape.
    return load_config(None, ["env.envs_per_worker=8", *overrides])


def record(path: Path, overrides: list[str]) -> None:
    """Sample one iteration of the default config, with reflections, and store its episodes."""
    from reflectrl.data.scratch import resolve_or_build
    from reflectrl.reflection.endpoint import ReflectionEndpoint
    from reflectrl.reflection.server import VLLMServer
    from tests.support.in_process import build_in_process

    config = default_config(overrides)
    r = config.reflection
    with tempfile.TemporaryDirectory() as tmp:
        server = VLLMServer(
            resolve_or_build(r.model),
            Path(tmp) / "vllm.log",
            served_model_name=r.served_model_name,
            max_model_len=r.max_model_len,
        )
        with server:
            local = build_in_process(config, reflection=ReflectionEndpoint([server.url]))
            started = time.perf_counter()
            episodes = local.sample()
            seconds = time.perf_counter() - started
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wb") as f:
        pickle.dump([e.get_state() for e in episodes], f)
    steps = sum(len(e) for e in episodes)
    print(f"recorded {steps} env steps in {len(episodes)} chunks ({seconds:.0f} s) -> {path}")


def load_episodes(path: Path) -> list[Any]:
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    with gzip.open(path, "rb") as f:
        return [SingleAgentEpisode.from_state(state) for state in pickle.load(f)]


def run_variant(name: str, path: Path, overrides: list[str]) -> dict[str, Any]:
    """In this process: build the variant's learner, time one iteration's update."""
    import torch
    from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner
    from ray.rllib.core import DEFAULT_MODULE_ID

    from reflectrl.data.scratch import resolve_or_build
    from reflectrl.models.loading import load_tokenizer
    from reflectrl.rollout.vector_env import ReflectRLVectorEnv
    from tests.support.in_process import build_learner, in_process_ppo_config, ppo_update

    config = default_config(overrides)
    episodes = load_episodes(path)
    learner_class = PPOTorchLearner if name == "reference" else None
    ppo_config = in_process_ppo_config(
        config, learner_class=learner_class, policy_overrides=VARIANTS[name]
    )
    env = ReflectRLVectorEnv(config, load_tokenizer(resolve_or_build(config.policy.model)), None, 1)
    learner = build_learner(ppo_config, env)
    forwarded = {"update_rows": 0, "update_tokens": 0, "value_rows": 0, "value_tokens": 0}

    def count(_module: Any, _args: Any, kwargs: dict[str, Any], _out: Any) -> None:
        rows, width = kwargs["input_ids"].shape
        kind = "update" if torch.is_grad_enabled() else "value"
        forwarded[f"{kind}_rows"] += rows
        forwarded[f"{kind}_tokens"] += rows * width

    module = learner.module[DEFAULT_MODULE_ID]
    module.policy.lm.get_base_model().base_model.register_forward_hook(count, with_kwargs=True)
    started = time.perf_counter()
    results = ppo_update(learner, ppo_config, episodes)
    seconds = time.perf_counter() - started
    steps = sum(len(e) for e in episodes)
    losses = results[DEFAULT_MODULE_ID]
    return {
        "variant": name,
        "update_s": seconds,
        "s_per_sampled_row": seconds / steps,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        **forwarded,
        "policy_loss": float(losses["policy_loss"].peek()),
        "vf_loss": float(losses["vf_loss"].peek()),
    }


def batch_stats(path: Path) -> dict[str, Any]:
    import numpy as np

    episodes = load_episodes(path)
    lengths = [
        int(obs["attention_mask"].sum())
        for e in episodes
        for obs in [e.get_observations(i) for i in range(len(e))]
    ]
    return {
        "env_steps": sum(len(e) for e in episodes),
        "episode_chunks": len(episodes),
        "bootstrap_rows": len(episodes),
        "prompt_tokens_mean": float(np.mean(lengths)),
        "prompt_tokens_max": int(max(lengths)),
        "prompt_width": int(episodes[0].get_observations(0)["attention_mask"].shape[0]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--record", action="store_true", help="record the batch first")
    parser.add_argument("--batch", type=Path, default=BATCH)
    parser.add_argument("--variants", default="reference,fast")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="config overrides (e.g. policy.model=tiny for a quick check)",
    )  # fmt: skip
    parser.add_argument("--variant", help=argparse.SUPPRESS)  # internal: one variant, here
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.variant:
        print(json.dumps(run_variant(args.variant, args.batch, args.overrides)))
        return
    if args.record or not args.batch.is_file():
        record(args.batch, args.overrides)
    names = args.variants.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        parser.error(f"unknown variant {unknown[0]!r}; choose from {', '.join(VARIANTS)}")
    rows = []
    for name in names:
        print(f"running {name} ...", flush=True)
        out = subprocess.run(
            [sys.executable, "-m", "benchmarks.learner_update", "--variant", name,
             "--batch", str(args.batch), *(f"--set={o}" for o in args.overrides)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    base = next((r for r in rows if r["variant"] == "reference"), rows[0])
    for row in rows:
        row["speedup_vs_reference"] = base["update_s"] / row["update_s"]
    print_table(
        rows,
        ["variant", "update_s", "s_per_sampled_row", "speedup_vs_reference", "peak_rss_mib",
         "update_rows", "update_tokens", "value_rows", "value_tokens"],
    )  # fmt: skip
    stats = batch_stats(args.batch)
    print("batch:", stats)
    payload = {
        "overrides": args.overrides,
        "batch": stats,
        "variants": {n: VARIANTS[n] for n in names},
        "rows": rows,
    }
    path = write_results(
        "learner_update" if not args.overrides else "learner_update_custom", payload
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
