"""Question: why do held-out Taxi episodes fail, before RL (the SFT policy) and after it: does
the policy follow a wrong reflection hint, or leave a right one?
Answer (see docs/results/paper-regime.md): it follows them: the SFT policy takes the hinted
action on 100% of the steps whose hint is wrong; after RL, on `full`, Reflect-RL still takes 92%
of the wrong hints and leaves 3.0% of the right ones.
Results: diagnostics/results/failure_modes.json.

For every held-out start of each curriculum stage this plays one greedy episode the way
evaluation does (the reflection generated greedily by the run's SFT reflection model with the
server's stop strings, the policy prompt rendered by `PromptRenderer`, the label chosen by the
run's policy) and records at every step whether the hint (the action the reflection quotes
last) is on a shortest path, whether the policy took it, and whether its action was right.
Per stage and policy it reports success, how episodes end (danger / step limit), and:
  - followed_wrong: of the steps with a wrong hint, the share where the policy took it;
  - left_right: of the steps with a right hint, the share where the policy did not;
  - first_error_*: what the first wrong action of each failed episode was (it followed a wrong
    hint, left a right one, or the reflection quoted no action).

    python -m diagnostics.failure_modes --run RUN [--run RUN ...] [--stages full]
    python -m diagnostics.failure_modes --from-json diagnostics/results/failure_modes.json

A second table averages each figure over the seeds of a variant (runs named VARIANT-seedN);
`--from-json` rebuilds it from a results file without playing anything.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import print_table, write_results
from diagnostics.common import RESULTS
from diagnostics.reflection_accuracy import STOPS, _on_shortest_path, hint


@dataclass
class Players:
    """A run's two players as RL saw them, and the renderer of their prompts."""

    config: Any
    policy: Any
    renderer: Any
    reflection: Any
    reflection_tokenizer: Any


def load_players(run: Path, after_rl: bool) -> Players:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from reflectrl.config import load_config
    from reflectrl.data.scratch import resolve_or_build
    from reflectrl.envs.taxi import ACTIONS
    from reflectrl.models.loading import load_tokenizer
    from reflectrl.models.policy import OptionPolicy
    from reflectrl.run_dir import latest_checkpoint, rl_config
    from reflectrl.text.rendering import PromptRenderer

    config = rl_config(load_config(run / "config.yaml", []), run)
    model_dir = resolve_or_build(config.policy.model)
    reflection_dir = run / "sft" / "reflection"
    reflection_tokenizer = AutoTokenizer.from_pretrained(reflection_dir)
    renderer = PromptRenderer(config, load_tokenizer(model_dir), len(ACTIONS), reflection_tokenizer)
    lora = config.policy.lora
    policy = OptionPolicy(
        model_dir, renderer.label_ids, lora.r, lora.alpha, lora.target_modules,
        seed=config.run.seed,
    ).eval()  # fmt: skip
    if after_rl:
        checkpoint = latest_checkpoint(run)
        if checkpoint is None:
            raise SystemExit(f"{run}: no checkpoint (RL has not run)")
        policy.load_adapter(checkpoint / "adapter")
    reflection = AutoModelForCausalLM.from_pretrained(reflection_dir, dtype=torch.float32).eval()
    return Players(config, policy, renderer, reflection, reflection_tokenizer)


def play_stage(players: Players, stage: str) -> dict[str, Any]:
    import torch

    from reflectrl.envs.taxi import ACTIONS, DangerousTaxiEnv, TaxiOptions, actions_to_success

    config, policy, renderer = players.config, players.policy, players.renderer
    reflection, reflection_tokenizer = players.reflection, players.reflection_tokenizer
    env = DangerousTaxiEnv(TaxiOptions(**{**config.env.options, "split": "test"}))
    env.set_stage(stage)
    order = list(range(len(ACTIONS)))
    steps: Counter[str] = Counter()
    ends: Counter[str] = Counter()
    first_errors: Counter[str] = Counter()
    starts = env.start_ids(stage) or []
    for start in starts:
        obs, _ = env.reset(options={"start": start})
        first_error = None
        while True:
            prompt = renderer.reflection_prompt(env, obs)
            ids = reflection_tokenizer(prompt.text, return_tensors="pt").input_ids
            with torch.no_grad():
                out = reflection.generate(
                    ids, max_new_tokens=config.reflection.max_tokens, do_sample=False,
                    pad_token_id=reflection_tokenizer.pad_token_id,
                )  # fmt: skip
            text = reflection_tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
            for stop in STOPS:
                text = text.split(stop)[0]
            rendered = renderer.policy_prompt(env, prompt.observation, text, order, prompt.level)
            row = torch.tensor([rendered.ids])
            with torch.no_grad():
                logits, _ = policy(row, torch.ones_like(row), torch.ones(1, len(ACTIONS)))
            action = int(logits.argmax(-1))
            named = hint(text, ACTIONS)
            now = actions_to_success(env)
            hint_right = named is not None and _on_shortest_path(env, ACTIONS.index(named), now)
            followed = named is not None and ACTIONS.index(named) == action
            right = _on_shortest_path(env, action, now)
            steps["all"] += 1
            steps["hint_wrong"] += named is not None and not hint_right
            steps["hint_right"] += hint_right
            steps["followed_wrong"] += named is not None and not hint_right and followed
            steps["left_right"] += hint_right and not followed
            if not right and first_error is None:
                first_error = (
                    "no_hint" if named is None else "followed_wrong" if followed else "left_right"
                )
            obs, _, terminated, truncated, info = env.step(action)
            if terminated or truncated:
                break
        end = "success" if info["success"] else "danger" if info["danger"] else "step_limit"
        ends[end] += 1
        if end != "success":
            first_errors[first_error or "none"] += 1
    failed = max(1, len(starts) - ends["success"])
    return {
        "stage": stage,
        "starts": len(starts),
        "success": ends["success"] / len(starts),
        "danger": ends["danger"] / len(starts),
        "step_limit": ends["step_limit"] / len(starts),
        "steps": steps["all"],
        "hint_wrong_steps": steps["hint_wrong"],
        "followed_wrong": steps["followed_wrong"] / max(1, steps["hint_wrong"]),
        "left_right": steps["left_right"] / max(1, steps["hint_right"]),
        **{
            f"first_error_{kind}": first_errors[kind] / failed
            for kind in ("followed_wrong", "left_right", "no_hint")
        },
    }


MEANS = ("success", "danger", "step_limit", "hint_wrong_steps", "followed_wrong", "left_right")


def by_variant(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each figure's mean over the seeds of a variant, per policy and stage."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for row in rows:
        key = (row["run"].rsplit("-seed", 1)[0], row["policy"], row["stage"])
        groups.setdefault(key, []).append(row)
    return [
        {"variant": variant, "policy": policy, "stage": stage, "seeds": len(group),
         **{k: round(sum(r[k] for r in group) / len(group), 3) for k in MEANS}}
        for (variant, policy, stage), group in groups.items()
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--run", type=Path, action="append", default=[])
    parser.add_argument("--from-json", type=Path, help="summarise this results file instead")
    parser.add_argument("--stages", default="pickup,dropoff,full")
    parser.add_argument("--out", default="failure_modes")
    args = parser.parse_args()
    if args.from_json:
        results = json.loads(args.from_json.read_text())
        results["by_variant"] = by_variant(results["rows"])
        results["summary_command"] = "python -m diagnostics.failure_modes " + " ".join(sys.argv[1:])
        print_table(results["by_variant"], ["variant", "policy", "stage", "seeds", *MEANS])
        print(write_results(args.from_json.stem, results, folder=RESULTS))
        return
    if not args.run:
        parser.error("give --run RUN (one or more) or --from-json FILE")
    started = time.perf_counter()
    rows = []
    for run in args.run:
        for after_rl in (False, True):
            players = load_players(run, after_rl)
            for stage in args.stages.split(","):
                row = {"run": run.name, "policy": "after RL" if after_rl else "SFT"}
                rows.append({**row, **play_stage(players, stage)})
                print(rows[-1], flush=True)
    columns = ["run", "policy", "stage", "success", "danger", "step_limit", "hint_wrong_steps",
               "followed_wrong", "left_right", "first_error_followed_wrong",
               "first_error_left_right"]  # fmt: skip
    print_table(rows, columns)
    command = "python -m diagnostics.failure_modes " + " ".join(sys.argv[1:])
    wall_s = round(time.perf_counter() - started)
    summary = by_variant(rows)
    print_table(summary, ["variant", "policy", "stage", "seeds", *MEANS])
    results = {"command": command, "rows": rows, "by_variant": summary, "wall_s": wall_s}
    print(write_results(args.out, results, folder=RESULTS))


if __name__ == "__main__":
    main()
