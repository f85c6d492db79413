"""Question: which SFT player binds held-out success: the reflection's hint or the policy's
reading of it?
Answer (see docs/action_heads.md): on AutoExplore the reflection: given the expert's own hint
the policy takes the expert's command on 0.79 of the route's steps, but the model's reflection
names that command on 0.16 of them (0.20 with the command's tokens weighing 10x in its SFT).
Results: diagnostics/results/players_on_route_*.json.

Along the data expert's own route (`data.expert`, no mistakes) from every held-out start the
run's evaluation plays (its split, views and stages), at each step:
- the run's SFT reflection model writes its reflection greedily (transformers, the prompt the
  server gets, the client's stop strings); its hint is the last menu command it quotes;
- the run's SFT policy picks an action twice: with that reflection in its prompt, and with the
  expert's own reflection (what SFT data shows it: the perfect hint).
Per stage and in total:
- hint_on_menu: the model's reflection quotes a command of the menu at all;
- hint_is_expert: the model's hint is the expert's command;
- policy_given_expert_hint: the policy picks the expert's command under the perfect hint;
- policy_copies_hint: the policy picks whatever the model's hint names;
- policy_given_model_hint: the policy picks the expert's command under the model's reflection
  (the step accuracy a rollout has, while it stays on the expert's route);
- routes_all_right: the share of starts where that holds at every step of the route.

    python -m diagnostics.players_on_route --run RUN [--max-starts N] [--name NAME]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import print_table, write_results
from diagnostics.common import RESULTS, text_head_scores
from diagnostics.reflection_accuracy import STOPS
from diagnostics.reflection_accuracy import hint as hinted  # the last menu command quoted

COUNTS = ("steps", "on_menu", "hint", "expert_hint", "copies", "model_hint", "routes_all_right")


class Players:
    """The run's SFT reflection model and policy, run with transformers."""

    def __init__(self, run: Path, config: Any) -> None:
        import torch

        from reflectrl.models.loading import load_causal_lm, load_tokenizer
        from reflectrl.text.prompts import ACTION_MARKER
        from reflectrl.text.tokens import label_token_ids

        self.torch = torch
        self.config = config
        self.reflection_tokenizer = load_tokenizer(run / "sft" / "reflection")
        self.reflection = load_causal_lm(run / "sft" / "reflection").eval()
        self.tokenizer = load_tokenizer(run / "sft" / "policy")
        self.policy = load_causal_lm(run / "sft" / "policy").eval()
        self.label_ids = label_token_ids(self.tokenizer, config.policy.labels, ACTION_MARKER)

    def reflect(self, prompt: str) -> str:
        tokenizer = self.reflection_tokenizer
        ids = self.torch.tensor([tokenizer.encode(prompt, add_special_tokens=False)])
        with self.torch.no_grad():
            out = self.reflection.generate(
                ids, max_new_tokens=self.config.reflection.max_tokens, do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
            )  # fmt: skip
        text = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
        for stop in STOPS:
            text = text.split(stop)[0]
        return text

    def pick(self, prompt: str, menu: list[str]) -> str:
        """The policy's greedy command (label or text head, as the run's config says)."""
        ids = self.tokenizer.encode(prompt, add_special_tokens=False)
        with self.torch.no_grad():
            if self.config.policy.action_head == "text":
                scores = text_head_scores(self.policy, self.tokenizer, [ids], [menu])[0][0]
            else:
                logits = self.policy(self.torch.tensor([ids])).logits[0, -1]
                scores = logits[self.label_ids[: len(menu)]]
        return menu[int(scores.argmax())]


def measure(run: Path, max_starts: int | None) -> list[dict[str, Any]]:
    import numpy as np

    from reflectrl.config import load_config
    from reflectrl.data.dataset import make_writer
    from reflectrl.data.demos import demonstrator_for
    from reflectrl.data.episodes import episode_steps
    from reflectrl.data.scratch import resolve_or_build
    from reflectrl.envs.registry import make_text_env
    from reflectrl.evaluation.held_out import eval_config, held_out_starts
    from reflectrl.models.loading import load_tokenizer
    from reflectrl.text.prompts import ANALYZE_MARKER
    from reflectrl.text.rendering import PromptRenderer

    trained = load_config(run / "config.yaml", ["data.negative_rate=0", "data.wrong_hint_rate=0"])
    config, stages = eval_config(trained)
    players = Players(run, config)
    demo = demonstrator_for(config.env.name, config.data.expert)
    env = make_text_env(config.env.name, config.env.options)
    tokenizer = load_tokenizer(resolve_or_build(config.policy.model))
    reflection_tokenizer = load_tokenizer(resolve_or_build(config.reflection.model))
    renderer = PromptRenderer(config, tokenizer, env.max_actions, reflection_tokenizer)
    writer, rng = make_writer(config), np.random.default_rng(config.run.seed)
    rows, totals = [], {}
    for stage in stages:
        env.set_stage(stage)
        starts = (held_out_starts(config, stage) or [])[:max_starts]
        counts = dict.fromkeys(COUNTS, 0)
        for start in starts:
            obs, _ = env.reset(options={"start": start})
            all_right = True
            for step in episode_steps(config, env, obs, demo, renderer, writer, rng):
                menu = list(step.menu)
                reflection = players.reflect(step.reflection_prompt)
                hint = hinted(reflection, menu)
                ours = step.policy_prompt.replace(
                    ANALYZE_MARKER + step.reflection.strip(), ANALYZE_MARKER + reflection.strip(), 1
                )
                pick = players.pick(ours, menu)
                right = pick == step.expert_action
                counts["steps"] += 1
                counts["on_menu"] += hint is not None
                counts["hint"] += hint == step.expert_action
                counts["expert_hint"] += (
                    players.pick(step.policy_prompt, menu) == step.expert_action
                )
                counts["copies"] += hint is not None and pick == hint
                counts["model_hint"] += right
                all_right &= right
            counts["routes_all_right"] += all_right
        for key, value in counts.items():
            totals[key] = totals.get(key, 0) + value
        rows.append(row_of(str(run), stage, len(starts), counts))
        print(rows[-1], file=sys.stderr, flush=True)
        totals["starts"] = totals.get("starts", 0) + len(starts)
    rows.append(row_of(str(run), "total", totals.pop("starts"), totals))
    return rows


def row_of(run: str, stage: str, starts: int, counts: dict[str, int]) -> dict[str, Any]:
    steps = max(counts["steps"], 1)
    return {
        "run": run,
        "stage": stage,
        "starts": starts,
        "steps": counts["steps"],
        "hint_on_menu": counts["on_menu"] / steps,
        "hint_is_expert": counts["hint"] / steps,
        "policy_given_expert_hint": counts["expert_hint"] / steps,
        "policy_copies_hint": counts["copies"] / steps,
        "policy_given_model_hint": counts["model_hint"] / steps,
        "routes_all_right": counts["routes_all_right"] / max(starts, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="a run with sft/ and config.yaml")
    parser.add_argument("--max-starts", type=int, help="at most this many starts per stage")
    parser.add_argument("--name", default="players_on_route", help="results file name")
    args = parser.parse_args()
    started = time.perf_counter()
    rows = measure(args.run, args.max_starts)
    print_table(rows, list(rows[0]))
    command = "python -m diagnostics.players_on_route " + " ".join(sys.argv[1:])
    payload = {"command": command, "rows": rows, "wall_s": round(time.perf_counter() - started)}
    print(write_results(args.name, payload, folder=RESULTS))


if __name__ == "__main__":
    main()
