"""Question: how fast can a policy trunk learn to read the Taxi grid when it is *told* the
answer (the upper bound on what PPO from reward can teach it)?
Answer (see docs/diagnostics.md, docs/rl.md, docs/results/paper-regime.md): slowly: after 600
supervised steps of 32 the recipe's 2 x 128 Llama predicts 0.57 of the held-out first moves, a
GPT-2 trunk of the same size 0.75 (0.75-0.83 after 600-1,000 steps with the cells named).
Results: diagnostics/results/grid_reading*.json.

Supervised, not RL: the whole random-init trunk plus a linear head over the 6 actions is
trained (Adam, batch 32) on the expert's first action at every train start of stage `pickup`
(no reflection in the prompt; the menu in canonical order), and scored on the held-out test
starts every `--every` steps. A trunk that needs thousands of labelled steps to get there
cannot be taught it by a few successes per PPO iteration (diagnostics/random_exploration.py).

Trunks: `recipe` is the CPU recipe's model (`scratch:dangerous_taxi`: a 2 x 128 Llama, RoPE);
`gpt2` has the same size with learned absolute positions (the paper's family); `llama_4x256`
is wider and deeper; `gpt2_cells` is `scratch:dangerous_taxi:gpt2_cells`, the GPT-2 over a
tokenizer that keeps every grid cell one token.

    python -m diagnostics.grid_reading [--steps 1000] [--every 200] [--trunk recipe ...]
        [--set env.options.coordinates=true] [--name FILE]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import print_table, write_results
from diagnostics.common import RESULTS, build_trunk

REPO = Path(__file__).resolve().parents[1]
TRUNKS = ("recipe", "gpt2", "llama_4x256", "gpt2_cells")
# Trunks built as a scratch model of their own (their own tokenizer), not over the recipe's.
OWN_MODEL = {"gpt2_cells": "scratch:dangerous_taxi:gpt2_cells"}


def pickup_rows(tokenizer: Any, split: str, overrides: list[str]) -> tuple[Any, Any, Any]:
    """(input ids [starts, length], each row's last real position, the expert's first
    actions) of every start of `split` (rows are right-padded: the status line's length
    varies)."""
    import torch

    from reflectrl.config import load_config
    from reflectrl.envs.taxi import expert_action
    from reflectrl.rollout.vector_env import ReflectRLVectorEnv

    overrides = ["reflection.enabled=false", "env.shuffle_options=false",
                 f"env.options.split={split}", *overrides]  # fmt: skip
    config = load_config(REPO / "configs" / "cpu.yaml", overrides)
    env = ReflectRLVectorEnv(config, tokenizer, None, num_envs=1)
    env.set_stage("pickup")
    ids, actions = [], []
    for start in env.envs[0].unwrapped.start_ids("pickup") or []:
        env.set_starts([[start]])
        obs, _ = env.reset()
        ids.append(torch.as_tensor(obs["input_ids"])[0])
        actions.append(expert_action(env.envs[0].unwrapped))
    x = torch.stack(ids)
    last = (x != tokenizer.pad_token_id).sum(1) - 1
    return x[:, : int(last.max()) + 1], last, torch.tensor(actions)


def learning_curve(name: str, steps: int, every: int, overrides: list[str]) -> dict[str, Any]:
    import torch

    from reflectrl.data.scratch import resolve_or_build
    from reflectrl.models.loading import load_tokenizer

    model_dir = resolve_or_build(OWN_MODEL.get(name, "scratch:dangerous_taxi"))
    tokenizer = load_tokenizer(model_dir)
    x_train, last_train, y_train = pickup_rows(tokenizer, "train", overrides)
    x_test, last_test, y_test = pickup_rows(tokenizer, "test", overrides)
    pad = tokenizer.pad_token_id
    trunk = build_trunk("recipe" if name in OWN_MODEL else name, model_dir, len(tokenizer), 512)
    torch.manual_seed(0)
    head = torch.nn.Linear(trunk.config.hidden_size, 6)  # GPT2Config maps it to n_embd
    optimizer = torch.optim.Adam([*trunk.parameters(), *head.parameters()], lr=1e-3)
    draw = torch.Generator().manual_seed(0)

    def logits(x: Any, last: Any) -> Any:
        out = trunk(input_ids=x, attention_mask=(x != pad).long(), output_hidden_states=True)
        return head(out.hidden_states[-1][torch.arange(len(x)), last])

    def accuracy(x: Any, last: Any, y: Any) -> float:
        with torch.no_grad():
            return float((logits(x, last).argmax(-1) == y).float().mean())

    curve = []
    for step in range(1, steps + 1):
        batch = torch.randint(len(x_train), (32,), generator=draw)
        loss = torch.nn.functional.cross_entropy(
            logits(x_train[batch], last_train[batch]), y_train[batch]
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % every == 0:
            point = {"step": step, "train": accuracy(x_train, last_train, y_train),
                     "held_out": accuracy(x_test, last_test, y_test)}  # fmt: skip
            curve.append(point)
            print(f"{name}: step {step}, train {point['train']:.2f}, "
                  f"held-out {point['held_out']:.2f}", file=sys.stderr)  # fmt: skip
    majority = float(torch.bincount(y_train).max() / len(y_train))
    params = sum(p.numel() for p in trunk.parameters())
    return {
        "trunk": name,
        "overrides": overrides,
        "params": params,
        "train_starts": len(x_train),
        "test_starts": len(x_test),
        "majority_action_share": majority,
        "best_held_out": max(p["held_out"] for p in curve),
        "final_held_out": curve[-1]["held_out"],
        "final_train": curve[-1]["train"],
        "curve": curve,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trunk", action="append", choices=TRUNKS, help="default: all")
    parser.add_argument("--steps", type=int, default=1000, help="supervised steps per trunk")
    parser.add_argument("--every", type=int, default=200, help="score every this many steps")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override of the rendered prompts (repeatable), e.g. "
                        "env.options.coordinates=true")  # fmt: skip
    parser.add_argument("--name", default="grid_reading", help="results file name")
    args = parser.parse_args()
    started = time.perf_counter()
    rows = [learning_curve(t, args.steps, args.every, args.set) for t in args.trunk or TRUNKS]
    for row in rows:
        row["prompt"] = " ".join(row["overrides"]) or "cpu.yaml"
    print_table(rows, ["trunk", "prompt", "params", "majority_action_share", "best_held_out",
                       "final_held_out", "final_train"])  # fmt: skip
    command = "python -m diagnostics.grid_reading " + " ".join(sys.argv[1:])
    payload = {"command": command.strip(), "rows": rows,
               "wall_s": round(time.perf_counter() - started)}  # fmt: skip
    print(write_results(args.name, payload, folder=RESULTS))


if __name__ == "__main__":
    main()
