"""Our rollout and update speed as ratios against the authors' published loop, same machine.

Reads the authors' timing (`run_official.sh A1` from shared/bench-official: their Taxi loop,
SmolLM2-135M fp32, batch 4, 2 threads, no reflection) and our results of the same hour
(benchmarks/results/rollout_sampling.json and learner_update.json), prints the ratios and
writes benchmarks/results/versus_official.json. Prompt lengths differ (theirs carry a longer
instruction), so per-token figures are given too.

    python -m benchmarks.versus_official --official /tmp/bench-official/results
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from benchmarks.common import RESULTS, print_table, write_results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--official", type=Path, required=True, help="folder with A1.json")
    args = parser.parse_args()
    official = json.loads((args.official / "A1.json").read_text())["summary"]
    sampling = json.loads((RESULTS / "rollout_sampling.json").read_text())
    update = json.loads((RESULTS / "learner_update.json").read_text())
    rollout = {r["variant"]: r for r in sampling["rows"]}
    learner = {r["variant"]: r for r in update["rows"]}
    theirs_steps = official["env_steps_per_s"]
    theirs_update = official["pg_update_s_per_sample"]
    theirs_tokens = official["policy_prompt_tokens_mean"]
    epochs = 2  # the default config's ppo.num_epochs; theirs is one policy-gradient pass
    our_tokens = update["batch"]["prompt_tokens_mean"]
    rows = []
    for name in ("reference", "trim_live_rows"):
        row = rollout[name]
        rows.append({
            "what": f"rollout, ours {name}",
            "ours": row["env_steps_per_s"],
            "theirs": theirs_steps,
            "unit": "env steps/s (higher is better)",
            "ours_over_theirs": row["env_steps_per_s"] / theirs_steps,
            "ours_tokens": row["lm_tokens_per_step"],
            "theirs_tokens": theirs_tokens,
        })  # fmt: skip
    for name in ("reference", "fast"):
        row = learner[name]
        per_epoch = row["s_per_sampled_row"] / epochs
        rows.append({
            "what": f"update, ours {name}",
            "ours": row["s_per_sampled_row"],
            "theirs": theirs_update,
            "unit": "s per sampled row, whole update (lower is better)",
            "ours_over_theirs": row["s_per_sampled_row"] / theirs_update,
            "ours_per_epoch_over_theirs": per_epoch / theirs_update,
            "ours_tokens": our_tokens,
            "theirs_tokens": theirs_tokens,
        })  # fmt: skip
    print_table(
        rows, ["what", "ours", "theirs", "ours_over_theirs", "ours_tokens", "theirs_tokens"]
    )
    stamp = time.strftime(
        "%Y-%m-%d %H:%M", time.gmtime((args.official / "A1.json").stat().st_mtime)
    )
    payload = {
        "official_measured_utc": stamp,
        "official": {k: official[k] for k in ("env_steps_per_s", "pg_update_s_per_sample",
                                              "policy_prompt_tokens_mean", "threads")},
        "rows": rows,
    }  # fmt: skip
    print(f"wrote {write_results('versus_official', payload)}")


if __name__ == "__main__":
    main()
