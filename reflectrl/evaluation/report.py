"""Episode records -> success rate with a 95% interval, mean return and length, per group."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import NotRequired, TypedDict

from reflectrl.rollout.seams import EpisodeRecord

# Held-out success of the policy RL starts from, in the run directory (with eval.every).
BEFORE_RL_FILE = "eval_before_rl.json"
Z95 = 1.959964  # two-sided 95% quantile of the normal distribution


class Summary(TypedDict):
    episodes: int
    # Listed starts played (each once): equal to `episodes` when the env lists its starts.
    distinct_starts: int
    success_rate: float
    success_ci95: list[float]  # Wilson interval: [low, high]
    return_mean: float
    length_mean: float


class UnseenStates(TypedDict):
    all: Summary
    stages: dict[str, Summary]


class GroupedReport(TypedDict):
    all: Summary
    stages: dict[str, Summary]
    kinds: NotRequired[dict[str, Summary]]  # where the env has task kinds
    unseen_states: NotRequired[UnseenStates]  # where the run has SFT data


class EvalReport(TypedDict):
    """An `eval_<split>.json`: held-out figures of one policy, greedy and sampled."""

    split: str
    episodes_per_stage: int
    seed: int
    greedy: GroupedReport
    sampled: GroupedReport


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """95% Wilson score interval of a success rate: unlike the normal approximation it stays
    inside [0, 1] and is not zero-width at 0/n or n/n."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def summarize(records: list[EpisodeRecord]) -> Summary:
    """Success rate, its interval, mean return and mean length of `records`."""
    n = len(records)
    wins = sum(bool(r["success"]) for r in records)
    listed = [r["start"] for r in records if r.get("start")]
    low, high = wilson_interval(wins, n)
    return Summary(
        episodes=n,
        distinct_starts=len(set(listed)),
        success_rate=wins / n if n else 0.0,
        success_ci95=[low, high],
        return_mean=sum(r["episode_return"] for r in records) / n if n else 0.0,
        length_mean=sum(r["length"] for r in records) / n if n else 0.0,
    )


def sft_observations(run_dir: Path) -> frozenset[str] | None:
    """Digests of every state the run's SFT data trained on (its `train` rows), or None where
    the run has no such data (RL from scratch, an adapter, data written before digests)."""
    path = run_dir / "data" / "data.jsonl"
    if not path.is_file():
        return None
    seen: set[str] = set()
    with path.open() as f:
        for line in f:
            row = json.loads(line)
            if not row.get("observation"):
                return None
            if row["split"] == "train":
                seen.add(row["observation"])
    return frozenset(seen)


def grouped(records: list[EpisodeRecord], seen: frozenset[str] | None = None) -> GroupedReport:
    """`summarize` over all records, per stage, and per task kind where the env has kinds.
    With `seen` (`sft_observations`), also over the episodes that acted on at least one state
    the SFT data never showed (`unseen_states`), in all and per stage."""
    by_stage: dict[str, list[EpisodeRecord]] = defaultdict(list)
    by_kind: dict[str, list[EpisodeRecord]] = defaultdict(list)
    for record in records:
        by_stage[record["stage"]].append(record)
        if record.get("kind"):
            by_kind[record["kind"]].append(record)
    report = GroupedReport(
        all=summarize(records),
        stages={stage: summarize(rows) for stage, rows in by_stage.items()},
    )
    if by_kind:
        report["kinds"] = {kind: summarize(rows) for kind, rows in sorted(by_kind.items())}
    if seen is not None:
        new = [r for r in records if any(d not in seen for d in r.get("observed", ()))]
        stages = {stage: [r for r in new if r["stage"] == stage] for stage in by_stage}
        report["unseen_states"] = UnseenStates(
            all=summarize(new),
            stages={stage: summarize(rows) for stage, rows in stages.items()},
        )
    return report


def format_table(report: EvalReport) -> str:
    """The report as an aligned text table: one row per decoding x group."""
    lines = [
        f"{'decoding':<9} {'group':<22} {'episodes':>8} {'success':>8} {'95% CI':>13} "
        f"{'return':>7} {'length':>7}"
    ]
    for decoding in ("greedy", "sampled"):
        if decoding not in report:
            continue
        part = report[decoding]
        groups = [("all", part["all"])]
        if len(part["stages"]) > 1:
            groups += [(f"stage {k}", v) for k, v in part["stages"].items()]
        groups += [(f"kind {k}", v) for k, v in part.get("kinds", {}).items()]
        if "unseen_states" in part:  # episodes that met a state the SFT data never showed
            unseen = part["unseen_states"]
            groups.append(("unseen states", unseen["all"]))
            if len(unseen["stages"]) > 1:
                groups += [(f"unseen {k}", v) for k, v in unseen["stages"].items()]
        for name, s in groups:
            low, high = s["success_ci95"]
            interval = f"[{low:.2f}, {high:.2f}]"
            lines.append(
                f"{decoding:<9} {name:<22} {s['episodes']:>8} {s['success_rate']:>8.3f} "
                f"{interval:>13} {s['return_mean']:>7.2f} {s['length_mean']:>7.1f}"
            )
    return "\n".join(lines)
