"""Every policy prompt a Taxi run's players can see, with its reflection and the oracle
advantage of each action there: the table that diagnostics/oracle_advantages.py trains on and
diagnostics/hint_dependence.py scores."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from diagnostics.failure_modes import Players
from diagnostics.reflection_accuracy import STOPS
from reflectrl.envs.taxi import (
    ACTIONS,
    DangerousTaxiEnv,
    TaxiOptions,
    _distances,
    _goal_kind,
    _is_goal,
)

DANGER_ADVANTAGE = -3.0
ORDER = list(range(len(ACTIONS)))  # the run's menus are not shuffled (env.shuffle_options off)


def oracle_advantage(taxi: Any, stage: str, state: int, action: int) -> float:
    ((_, nxt, _, _),) = taxi.P[state][action]
    if nxt == state:
        return DANGER_ADVANTAGE
    goal = _goal_kind(stage)
    if _is_goal(taxi, state, action, goal):
        return 0.0
    dist = _distances(taxi, goal)
    return max(DANGER_ADVANTAGE, float(dist[state] - 1 - dist.get(nxt, 10**6)))


class Prompts:
    """Every policy prompt the players can see: one per (instruction, taxi state), since
    `dropoff` and `full` share their instruction. Reflections are generated greedily once
    (prompts of one token length in a batch, without padding: checked identical to one at a
    time) and kept in `cache`."""

    def __init__(self, players: Players, options: TaxiOptions, cache: Path | None) -> None:
        p, tok = players, players.reflection_tokenizer
        known = json.loads(cache.read_text()) if cache and cache.exists() else {}
        texts, observations, envs = [], [], {}
        self.keys: list[tuple[bool, int]] = []
        for stage in ("pickup", "full"):
            env = envs[stage] = DangerousTaxiEnv(options)
            env.set_stage(stage)
            env.reset(seed=0)
            for state in range(500):
                *_, passenger, destination = env.taxi.decode(state)
                if passenger == destination or (stage == "pickup" and passenger == 4):
                    continue  # a state no episode of the stage shows
                env.taxi.s = state
                prompt = p.renderer.reflection_prompt(env, env._observation())
                self.keys.append((stage == "pickup", state))
                texts.append(prompt.text)
                observations.append((prompt.observation, prompt.level))
        by_length: dict[int, list[str]] = defaultdict(list)
        for text in texts:
            if text not in known:
                by_length[len(tok(text).input_ids)].append(text)
        self.generated = sum(map(len, by_length.values()))
        for group in by_length.values():
            for start in range(0, len(group), 64):
                part = group[start : start + 64]
                ids = tok(part, return_tensors="pt").input_ids
                with torch.no_grad():
                    out = p.reflection.generate(
                        ids, attention_mask=torch.ones_like(ids), do_sample=False,
                        max_new_tokens=p.config.reflection.max_tokens,
                        pad_token_id=tok.pad_token_id,
                    )  # fmt: skip
                for j, text in enumerate(part):
                    reply = tok.decode(out[j, ids.shape[1] :], skip_special_tokens=True)
                    for stop in STOPS:
                        reply = reply.split(stop)[0]
                    known[text] = reply
        if cache:
            cache.write_text(json.dumps(known))
        self.rows: list[list[int]] = []
        self.oracle: list[list[float]] = []  # A(s, a) of each prompt's state and action
        self.reflections: list[str] = [known[text] for text in texts]
        for i, (pickup, state) in enumerate(self.keys):
            (obs, level), text = observations[i], texts[i]
            env = envs["pickup" if pickup else "full"]
            env.taxi.s = state
            rendered = p.renderer.policy_prompt(env, obs, known[text], ORDER, level)
            self.rows.append(list(rendered.ids))
            stage = "pickup" if pickup else "full"
            self.oracle.append([oracle_advantage(env.taxi, stage, state, a) for a in ORDER])
        self.index = {key: i for i, key in enumerate(self.keys)}

    def of(self, env: DangerousTaxiEnv) -> int:
        """The index of the prompt `env` shows now."""
        return self.index[(env.episode_stage == "pickup", int(env.taxi.s))]


def logits_of(policy: Any, rows: list[list[int]], chunk: int = 128) -> torch.Tensor:
    """Label logits [N, 6] of prompt rows (right-padded), `chunk` rows per forward."""
    out = []
    for start in range(0, len(rows), chunk):
        part = rows[start : start + chunk]
        width = max(len(r) for r in part)
        ids = torch.zeros(len(part), width, dtype=torch.long)
        mask = torch.zeros(len(part), width, dtype=torch.long)
        for i, r in enumerate(part):
            ids[i, : len(r)], mask[i, : len(r)] = torch.tensor(r), 1
        out.append(policy(ids, mask, torch.ones(len(part), len(ACTIONS)))[0])
    return torch.cat(out)
