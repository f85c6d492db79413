"""Small helpers shared by test modules."""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch


def perturb(module: torch.nn.Module, seed: int = 0) -> None:
    """Move every trainable weight off its init (LoRA B and the value head start at zero, so
    gradients of LoRA A and values would all be 0 at init)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn(p.shape, generator=generator))


def check_dataset(config: Any, out: Path, rate_bounds: tuple[float, float]) -> list[dict]:
    """Replay every episode of a data set in the real env and check what SFT data must hold:
    each label is the expert's action in that state; a step after a perturbed one is a
    negative example whose label is the expert's recovery; every row's prompt is byte-equal to
    what the rollout worker's vector env renders for the same state and reflection. Returns
    the rows."""
    from reflectrl.data.demos import demonstrator_for
    from reflectrl.data.scratch import resolve_or_build
    from reflectrl.models.loading import load_tokenizer
    from reflectrl.rollout.vector_env import ReflectRLVectorEnv
    from reflectrl.seeding import hash_seed

    rows = [json.loads(line) for line in (out / "data.jsonl").read_text().splitlines()]
    stats = json.loads((out / "stats.json").read_text())
    demo = demonstrator_for(config.env.name, config.data.expert)
    tokenizer = load_tokenizer(resolve_or_build(config.policy.model))

    class RowReflection:  # hands the vector env the row's reflection, records its prompts
        def __init__(self) -> None:
            self.seed: int | None = None
            self.text = ""
            self.prompts: list[str] = []

        def reflect(self, prompts: list[str]) -> list[str]:
            self.prompts = prompts
            return [self.text] * len(prompts)

    reflector = RowReflection()
    train = config.model_copy(deep=True)
    train.env.options["split"] = demo.train_split
    plain = train.model_copy(deep=True)
    plain.reflection.enabled = False
    vec = ReflectRLVectorEnv(train, tokenizer, reflector, num_envs=1)
    vec_plain = ReflectRLVectorEnv(plain, tokenizer, None, num_envs=1)
    by_step: dict[tuple[int, int], dict[str, dict]] = {}
    for row in rows:
        by_step.setdefault((row["episode"], row["step"]), {})[row["target"]] = row
    perturbed = negatives = 0
    for e in sorted({e for e, _ in by_step}):
        first = by_step[(e, 0)]["sft"]
        env, env_plain = vec.envs[0], vec_plain.envs[0]
        for each in (env, env_plain):
            each.set_stage(first["stage"])
        obs, _ = env.reset(seed=hash_seed(stats["seed"], e))
        env_plain.reset(seed=hash_seed(stats["seed"], e))
        assert demo.task_id(env) == first["task"]
        for t in sorted(t for ep, t in by_step if ep == e):
            row = by_step[(e, t)]
            policy = row["sft_policy"]
            assert obs.actions[demo.expert(env)] == policy["expert_action"]
            reflector.text = row["sft_reflection"]["completion"]
            if policy["wrong_hint"]:  # the policy's row quotes another reflection: render that
                start = len(row["sft_reflection"]["prompt"])
                reflector.text = policy["prompt"][
                    start : policy["prompt"].index("\nValid actions:")
                ]
                assert reflector.text != row["sft_reflection"]["completion"]
            vec._orders[0] = vec_plain._orders[0] = list(range(len(obs.actions)))
            vec._observe([obs], [True], [True])
            vec_plain._observe([obs], [True], [True])
            assert reflector.prompts == [row["sft_reflection"]["prompt"]]
            assert vec.last_prompts == [policy["prompt"]]
            assert vec_plain.last_prompts == [row["sft"]["prompt"]]
            lines = policy["prompt"].split("Valid actions:\n")[1].removesuffix(" # Action:\n")
            menu = dict(line.split(". ", 1) for line in lines.splitlines())
            assert menu[policy["completion"]] == policy["expert_action"]  # label = the expert
            assert all(r["menu"] == list(menu.values()) for r in row.values())  # label order
            assert row["sft"]["completion"] == policy["completion"]
            if t > 0 and by_step[(e, t - 1)]["sft"]["perturbed"]:
                assert policy["negative"]  # after a mistake: its reflection and the recovery
            if policy["perturbed"]:
                assert policy["taken_action"] != policy["expert_action"]
            perturbed += int(policy["perturbed"])
            negatives += int(policy["negative"])
            take = obs.actions.index(policy["taken_action"])
            obs, *_ = env.step(take)
            env_plain.step(take)
    assert perturbed == stats["perturbed_steps"] and negatives == stats["negative_steps"]
    assert negatives >= 0.8 * perturbed  # only a mistake on an episode's last step has none
    low, high = rate_bounds
    assert low <= perturbed / len(by_step) <= high, perturbed / len(by_step)
    return rows


def run_cli(
    *args: str, timeout: float = 600, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`reflectrl ARGS` in a fresh process on a local Ray, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "reflectrl.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=cli_env(extra_env),
        cwd=Path(__file__).resolve().parents[1],
    )


def cli_env(extra_env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a CLI process under test: offline, its own local Ray."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RAY_AUTH_MODE": "disabled", **(extra_env or {})}
    env.pop("RAY_ADDRESS", None)
    return env


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk; fails on anything that is not a PNG."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", f"{path} is not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


# What Ray, RLlib, vLLM's client and transformers print on their own: a timestamped log line,
# Ray's C++ core ("[2026-... E 123 123] core_worker.cc: ..."), warnings, progress bars.
LIBRARY_LINE = re.compile(
    r"^\d{4}-\d\d-\d\d[ T]\d\d:\d\d|^\[\d{4}-\d\d-\d\d |core_worker|Warning:|gputil|"
    r"Writing model shards|it/s\]|^\(\w+ pid=\d+\)"
)
OUR_STDERR = ("data: ", "eval: ")  # our progress lines on stderr (reflectrl/console.py)


def assert_console_is_ours(result: subprocess.CompletedProcess[str], run_dir: Path) -> None:
    """A launch's terminal shows our lines only; the libraries' went to the run's launch.log."""
    leaked = [line for line in result.stdout.splitlines() if LIBRARY_LINE.search(line)]
    leaked += [line for line in result.stderr.splitlines() if not line.startswith(OUR_STDERR)]
    assert leaked == [], leaked[:10]
    log = (run_dir / "launch.log").read_text()
    assert "Started a local Ray instance" in log and LIBRARY_LINE.search(log), log[-2000:]
