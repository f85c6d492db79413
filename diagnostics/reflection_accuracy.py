"""Question: how often does the SFT reflection model's hint name a right next action on
DangerousTaxi?
Answer (see docs/results/paper-regime.md): after SFT on 40 expert episodes, on 87% / 94% / 89% of
the route's steps (pickup / dropoff / full), so every hint is right from only 55% / 78% / 33% of
the starts; after the CPU recipe's 600, on 99.7-100% of the steps.
Results: diagnostics/results/reflection_accuracy.json.

The reflection ends with the action to take (`Next: "go east".` and its variants). Along the
expert's route from every start state of a split, in every curriculum stage, this generates
the reflection greedily (transformers, the prompt the server gets, its stop strings) and checks
the last action it quotes: right when it is on a shortest path to success (any tie counts).
Also reported per stage: the share of starts whose every hint on the route is right, the
success a policy that copies the hint could reach.

    python -m diagnostics.reflection_accuracy --run RUN [--run RUN ...] [--split test]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import print_table, write_results
from diagnostics.common import RESULTS

STOPS = (" # Action", "\n\n")  # the reflection client's stop strings


def hint(text: str, actions: tuple[str, ...]) -> str | None:
    """The last action of the menu that the reflection quotes, or None."""
    quoted = [(text.rfind(f'"{a}"'), a) for a in actions]
    position, action = max(quoted)
    return action if position >= 0 else None


def measure(run: Path, split: str, max_tokens: int) -> list[dict[str, Any]]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from reflectrl.config import load_config
    from reflectrl.envs.taxi import (
        ACTIONS,
        DangerousTaxiEnv,
        TaxiOptions,
        actions_to_success,
        expert_action,
    )
    from reflectrl.text import prompts

    config = load_config(run / "config.yaml", [])
    model_dir = run / "sft" / "reflection"
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    options = TaxiOptions(**{**config.env.options, "split": split})
    env = DangerousTaxiEnv(options)
    rows = []
    for stage in env.stages:
        env.set_stage(stage)
        right = steps = clean = 0
        starts = env.start_ids(stage) or []
        for start in starts:
            obs, _ = env.reset(options={"start": start})
            all_right = True
            for _ in range(options.max_steps):
                ids = tokenizer(prompts.reflection_parts(obs).text, return_tensors="pt").input_ids
                with torch.no_grad():
                    out = model.generate(
                        ids, max_new_tokens=max_tokens, do_sample=False,
                        pad_token_id=tokenizer.pad_token_id,
                    )  # fmt: skip
                text = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
                for stop in STOPS:
                    text = text.split(stop)[0]
                named = hint(text, ACTIONS)
                now = actions_to_success(env)
                ok = named is not None and _on_shortest_path(env, ACTIONS.index(named), now)
                right += ok
                steps += 1
                all_right &= ok
                obs, _, terminated, truncated, _ = env.step(expert_action(env))
                if terminated or truncated:
                    break
            clean += all_right
        rows.append({"run": str(run), "stage": stage, "split": split, "starts": len(starts),
                     "steps": steps, "hint_right": right / steps,
                     "starts_all_hints_right": clean / len(starts)})  # fmt: skip
        print(rows[-1], flush=True)
    return rows


def _on_shortest_path(env: Any, action: int, now: int) -> bool:
    from reflectrl.envs.taxi import _distances, _goal_kind, _is_goal

    state = int(env.taxi.s)
    ((_, next_state, _, _),) = env.taxi.P[state][action]
    if next_state == state:
        return False
    if _is_goal(env.taxi, state, action, _goal_kind(env.episode_stage)):
        return True
    return _distances(env.taxi, _goal_kind(env.episode_stage)).get(next_state, 10**6) == now - 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--run", type=Path, action="append", required=True)
    parser.add_argument("--split", default="test")
    parser.add_argument("--max-tokens", type=int, default=40)
    parser.add_argument("--out", default="reflection_accuracy")
    args = parser.parse_args()
    started = time.perf_counter()
    rows = [row for run in args.run for row in measure(run, args.split, args.max_tokens)]
    print_table(rows, ["run", "stage", "starts", "steps", "hint_right", "starts_all_hints_right"])
    command = "python -m diagnostics.reflection_accuracy " + " ".join(sys.argv[1:])
    wall_s = round(time.perf_counter() - started)
    print(
        write_results(
            args.out, {"command": command, "rows": rows, "wall_s": wall_s}, folder=RESULTS
        )
    )


if __name__ == "__main__":
    main()
