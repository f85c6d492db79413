"""Held-out evaluation: intervals, unbiased episode quotas, the CLI's errors, a real run."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from reflectrl.config import load_config
from reflectrl.evaluation.episodes import play, slot_quotas
from reflectrl.evaluation.held_out import eval_actors_needed
from reflectrl.evaluation.report import format_table, grouped, wilson_interval
from reflectrl.models.policy import OptionPolicy
from reflectrl.rollout.vector_env import ReflectRLVectorEnv
from tests.helpers import run_cli

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "configs" / "smoke.yaml"


def test_wilson_interval_matches_known_values() -> None:
    low, high = wilson_interval(0, 10)
    assert low == 0.0 and high == pytest.approx(0.2775, abs=1e-4)
    low, high = wilson_interval(5, 10)
    assert (low, high) == (pytest.approx(0.2366, abs=1e-4), pytest.approx(0.7634, abs=1e-4))
    assert wilson_interval(10, 10)[0] == pytest.approx(0.7225, abs=1e-4)


def test_report_groups_by_stage_and_kind() -> None:
    records = [
        {"stage": "a", "kind": "x", "success": True, "episode_return": 1.0, "length": 2},
        {"stage": "a", "kind": "y", "success": False, "episode_return": -1.0, "length": 4},
        {"stage": "b", "kind": "x", "success": True, "episode_return": 0.5, "length": 6},
    ]
    report = grouped(records)
    assert report["all"]["episodes"] == 3 and report["all"]["success_rate"] == pytest.approx(2 / 3)
    assert report["stages"]["a"]["success_rate"] == 0.5
    assert report["kinds"]["x"]["success_rate"] == 1.0 and report["kinds"]["y"]["length_mean"] == 4
    table = format_table({"greedy": report})
    assert "stage a" in table and "kind y" in table and "[" in table


def test_each_env_slot_plays_its_own_quota(tiny_dir: Path, tokenizer: Any) -> None:
    config = load_config(SMOKE, ["reflection.enabled=false"])
    env = ReflectRLVectorEnv(config, tokenizer, None, num_envs=4)
    policy = OptionPolicy(tiny_dir, env.label_ids)
    assert slot_quotas(6, 4) == [2, 2, 1, 1]
    records = play(policy, env, episodes=6, greedy=False, seed=0)
    assert [r["env_index"] for r in records] == [0, 0, 1, 1, 2, 3]
    # Greedy play of the same policy on the same seeds is reproducible.
    again = ReflectRLVectorEnv(config, tokenizer, None, num_envs=4)
    first = play(policy, again, episodes=6, greedy=True)
    again = ReflectRLVectorEnv(config, tokenizer, None, num_envs=4)
    assert play(policy, again, episodes=6, greedy=True) == first


def test_eval_starts_no_more_actors_than_one_round_of_envs_needs() -> None:
    """Each actor plays its share in its `envs_per_worker` envs at once: 2 episodes over 2 envs
    need one actor, 5 need three, and a config of 1 episode still gets one."""
    needed = {
        (episodes, envs): eval_actors_needed(
            load_config(SMOKE, [f"eval.episodes={episodes}", f"env.envs_per_worker={envs}"])
        )
        for episodes, envs in [(2, 2), (5, 2), (1, 4), (8, 1)]
    }
    assert needed == {(2, 2): 1, (5, 2): 3, (1, 4): 1, (8, 1): 8}


def reflectrl(*args: str, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, timeout=timeout)


@pytest.fixture(scope="module")
def sft_policy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from reflectrl.data.dataset import write_dataset
    from reflectrl.sft.trainer import train_player

    root = tmp_path_factory.mktemp("eval")
    config = load_config(SMOKE, ["sft.max_steps=4"])
    write_dataset(config, root / "data", episodes=4, seed=0, progress=False)
    train_player(config, root / "data", "policy", root / "sft", progress=False)
    return root / "sft" / "policy"


def test_eval_cli_errors_are_one_line(sft_policy: Path, tmp_path: Path) -> None:
    cases = [
        (["--adapter", str(sft_policy), "--split", "valid_unseen"],
         "eval split 'valid_unseen': env dangerous_taxi has splits train, test, all"),
        (["--adapter", str(tmp_path)], "not a peft adapter"),
        (["--run", str(tmp_path)], "no config.yaml there"),
    ]  # fmt: skip
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text((SMOKE).read_text())
    unfinished = "no finished policy (stage rl has not finished)"
    cases.append((["--run", str(tmp_path / "run")], unfinished))
    for args, message in cases:
        done = reflectrl("eval", "--config", str(SMOKE), *args)
        assert done.returncode == 2, done.stderr
        assert done.stderr.count("\n") == 1 and message in done.stderr, done.stderr


def test_held_out_eval_plays_every_start_exactly_once(tiny_dir: Path, tokenizer: Any) -> None:
    """Taxi's 60 test starts, dealt over 4 env slots: 60 episodes from 60 distinct starts, in
    every stage (draws with replacement gave ~38 distinct starts in 60 episodes)."""
    from reflectrl.envs.taxi import start_states

    config = load_config(SMOKE, ["reflection.enabled=false", "env.options.split=test"])
    env = ReflectRLVectorEnv(config, tokenizer, None, num_envs=4)
    policy = OptionPolicy(tiny_dir, env.label_ids)
    starts = env.envs[0].start_ids("full")
    assert starts == [str(s) for s in start_states("test", 0.2, 0)] and len(starts) == 60
    for stage in ("pickup", "dropoff", "full"):
        env.set_stage(stage)
        records = play(policy, env, episodes=0, greedy=False, seed=1, starts=starts)
        assert sorted(r["start"] for r in records) == sorted(starts), stage
        report = grouped(records)["all"]
        assert report["episodes"] == report["distinct_starts"] == 60
    # A listed start is the state the episode starts in.
    taxi = env.envs[0]
    taxi.set_stage("full")
    taxi.reset(options={"start": starts[5]})
    assert int(taxi.taxi.s) == int(starts[5])
    with pytest.raises(ValueError, match="not in the 'test' split"):
        taxi.reset(options={"start": str(start_states("train", 0.2, 0)[0])})


def test_report_splits_out_episodes_on_states_the_sft_data_never_showed(
    tmp_path: Path, tiny_dir: Path, tokenizer: Any
) -> None:
    """Data rows carry the digest of the state they were taken in; eval episodes the digests of
    the states they acted on; `unseen_states` is over the episodes with one the data lacks."""
    import json

    from reflectrl.data.dataset import write_dataset
    from reflectrl.envs.taxi import DangerousTaxiEnv, TaxiOptions
    from reflectrl.evaluation.report import sft_observations

    config = load_config(SMOKE, ["reflection.enabled=false"])
    write_dataset(config, tmp_path / "data", episodes=6, seed=0, progress=False)
    rows = [json.loads(x) for x in (tmp_path / "data" / "data.jsonl").read_text().splitlines()]
    first = next(r for r in rows if r["step"] == 0 and r["stage"] == "full")
    env = DangerousTaxiEnv(TaxiOptions(max_steps=12))
    env.set_stage("full")
    obs, _ = env.reset(options={"start": first["task"]})
    assert obs.digest() == first["observation"]  # the data's digest is the env's
    seen = sft_observations(tmp_path)
    train_rows = {r["observation"] for r in rows if r["split"] == "train"}
    assert seen == train_rows and seen
    assert sft_observations(tmp_path / "nowhere") is None

    held_out = load_config(SMOKE, ["reflection.enabled=false", "env.options.split=test"])
    vector = ReflectRLVectorEnv(held_out, tokenizer, None, num_envs=4)
    vector.record_observations = True
    vector.set_stage("full")
    records = play(OptionPolicy(tiny_dir, vector.label_ids), vector, 12, greedy=False, seed=3)
    assert all(len(r["observed"]) == r["length"] > 0 for r in records)
    everything = frozenset(d for r in records for d in r["observed"])
    assert grouped(records, everything)["unseen_states"]["all"]["episodes"] == 0
    assert grouped(records, frozenset())["unseen_states"]["all"]["episodes"] == len(records)
    report = grouped(records, seen)
    expected = [r for r in records if not set(r["observed"]) <= seen]
    assert report["unseen_states"]["all"]["episodes"] == len(expected)
    assert report["unseen_states"]["stages"]["full"]["episodes"] == len(expected)
    assert "unseen states" in format_table({"greedy": report})
    assert "unseen_states" not in grouped(records)


def test_eval_samples_distinct_starts_when_asked_for_fewer() -> None:
    """`eval.episodes` below the number of starts: a seeded sample, each start at most once."""
    from reflectrl.evaluation.held_out import eval_config, held_out_starts

    config, _ = eval_config(load_config(SMOKE, ["eval.episodes=25"]))
    picked = held_out_starts(config, "full")
    assert picked is not None and len(picked) == len(set(picked)) == 25
    assert held_out_starts(config, "full") == picked  # seeded
    config.eval.episodes = 100
    assert len(held_out_starts(config, "full") or []) == 60  # all of them, once


@pytest.fixture(scope="module")
def checkpointed_run(sft_policy: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run directory after SFT (this module's SFT policy and a reflection adapter trained on
    the same data) and one RL checkpoint whose LoRA and value head moved off the SFT policy's,
    with an `eval_before_rl.json`."""
    import json
    import shutil

    from reflectrl.atomic_files import write_json, write_text
    from reflectrl.config import dump_config
    from reflectrl.data.scratch import resolve_or_build
    from reflectrl.models.policy import build_policy
    from reflectrl.run_dir import rl_config
    from reflectrl.sft.trainer import train_player
    from tests.helpers import perturb

    run = tmp_path_factory.mktemp("export") / "run"
    config = load_config(SMOKE, ["sft.max_steps=4", "run.iterations=1"])
    write_text(run / "config.yaml", dump_config(config))
    train_player(config, sft_policy.parents[1] / "data", "reflection", run / "sft", progress=False)
    shutil.copytree(sft_policy, run / "sft" / "policy")
    write_json(run / "stages" / "sft.json", {"stage": "sft"})
    derived = rl_config(config, run)
    plain = load_config(SMOKE, ["reflection.enabled=false"])  # (only the label tokens)
    env = ReflectRLVectorEnv(plain, load_tokenizer_of(derived), None, num_envs=1)
    policy = build_policy(
        derived.policy, resolve_or_build("tiny"), env.label_ids, 0, for_rollouts=False
    )
    policy.load_sft_adapter(run / "sft" / "policy")
    perturb(policy, seed=1)
    policy.save_adapter(run / "checkpoints" / "iter_1" / "adapter")
    write_json(run / "checkpoints" / "iter_1" / "reflectrl_state.json", {"iteration": 1})
    write_text(run / "checkpoints" / "latest", "iter_1")
    write_json(run / "stages" / "rl.json", {"stage": "rl", "iterations": 1})
    records = [
        {"stage": "full", "success": s, "episode_return": 0.0, "length": 3} for s in (1, 0, 0)
    ]
    report = {"split": "test", "episodes_per_stage": 3, "seed": 0}
    write_json(run / "eval_before_rl.json", {**report, "greedy": grouped(records[:1]),
                                              "sampled": grouped(records)})  # fmt: skip
    assert json.loads((run / "eval_before_rl.json").read_text())["sampled"]["all"]["episodes"] == 3
    return run


def load_tokenizer_of(config: Any) -> Any:
    from reflectrl.data.scratch import resolve_or_build
    from reflectrl.models.loading import load_tokenizer

    return load_tokenizer(resolve_or_build(config.policy.model))


def test_export_writes_players_that_plain_transformers_scores_as_reflectrl_does(
    checkpointed_run: Path, tmp_path: Path
) -> None:
    """`reflectrl export`: the merged policy, loaded with transformers alone, gives every
    held-out menu the label probabilities (and values) the run's policy gives as eval loads
    it; the merged reflection the logits of base + SFT adapter."""
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from reflectrl.data.scratch import resolve_or_build
    from reflectrl.evaluation.export import final_source
    from reflectrl.evaluation.held_out import eval_config, run_policy
    from reflectrl.models.loading import load_causal_lm
    from reflectrl.models.policy import build_policy
    from reflectrl.text.prompts import ACTION_MARKER

    run, out = checkpointed_run, tmp_path / "export"
    done = reflectrl("export", str(run), "--out", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"wrote {out / 'policy'}" in done.stdout and f"wrote {out / 'reflection'}" in done.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]  # no build left behind

    # The run's own policy, as `reflectrl eval --run` loads it.
    config = load_config(run / "config.yaml")
    derived, source = run_policy(run, config)
    assert source.checkpoint_adapter == run / "checkpoints" / "iter_1" / "adapter"
    # Stopped during RL: its latest checkpoint too.
    marker = run / "stages" / "rl.json"
    marker.rename(run / "rl.json.aside")
    try:
        assert final_source(run, config)[1].checkpoint_adapter == source.checkpoint_adapter
    finally:
        (run / "rl.json.aside").rename(marker)
    held_out = eval_config(load_config(run / "config.yaml", ["reflection.enabled=false"]))[0]
    env = ReflectRLVectorEnv(held_out, load_tokenizer_of(derived), None, num_envs=4)
    env.set_stage("full")
    ours = build_policy(
        derived.policy, resolve_or_build("tiny"), env.label_ids, 0, for_rollouts=True
    )
    source.load_into(ours)
    ours.eval()

    plain = AutoModelForCausalLM.from_pretrained(out / "policy")
    tokenizer = AutoTokenizer.from_pretrained(out / "policy")
    labels = [tokenizer.encode(ACTION_MARKER + x, add_special_tokens=False)[-1] for x in "1234"]
    assert labels == env.label_ids[:4]  # the card's recipe finds the label tokens
    head = load_file(str(out / "policy" / "value_head.safetensors"))
    obs, _ = env.reset()
    label_ids = torch.tensor(env.label_ids)
    compared = 0
    with torch.no_grad():
        for _ in range(3):
            batch = {k: torch.as_tensor(v) for k, v in obs.items()}
            logits, hidden = ours.logits_and_hidden(batch)
            expected = torch.softmax(logits, dim=-1)
            ids, mask = batch["input_ids"], batch["attention_mask"]
            rows, last = torch.arange(ids.shape[0]), mask.sum(dim=1) - 1
            found = plain(input_ids=ids, attention_mask=mask).logits[rows, last][:, label_ids]
            found = found.masked_fill(batch["option_mask"] <= 0, float("-inf"))
            torch.testing.assert_close(torch.softmax(found, -1), expected, atol=1e-5, rtol=0)
            state = plain.base_model(input_ids=ids, attention_mask=mask).last_hidden_state
            value = state[rows, last] @ head["weight"].T + head["bias"]
            torch.testing.assert_close(value.squeeze(-1), ours.value(hidden), atol=1e-5, rtol=0)
            compared += ids.shape[0]
            obs, *_ = env.step(expected.argmax(dim=-1).numpy())
    assert compared == 12 and not torch.equal(head["weight"], torch.zeros_like(head["weight"]))

    reflection = AutoModelForCausalLM.from_pretrained(out / "reflection")
    served = PeftModel.from_pretrained(
        load_causal_lm(resolve_or_build("tiny")), run / "sft" / "reflection"
    )
    ids = torch.as_tensor(obs["input_ids"][:2, :40])
    with torch.no_grad():
        torch.testing.assert_close(
            reflection(input_ids=ids).logits.log_softmax(-1),
            served(input_ids=ids).logits.log_softmax(-1),
            atol=1e-5,
            rtol=0,
        )

    card = (out / "policy" / "README.md").read_text()
    for fact in ("eval_before_rl.json", "| greedy | 1.000", "| sampled | 0.333", "| 3 |",
                 "Action head `label`", "value_head.safetensors", "```yaml\nenv:"):  # fmt: skip
        assert fact in card, fact
    assert "sft/reflection" in (out / "reflection" / "README.md").read_text()


def test_export_cli_errors_are_one_line_and_never_overwrite(
    checkpointed_run: Path, tmp_path: Path
) -> None:
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "config.yaml").write_text(SMOKE.read_text())
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("keep me")
    before = (taken / "notes.txt").stat().st_mtime_ns
    cases = [
        ([str(tmp_path / "nowhere"), "--out", str(tmp_path / "a")], "no config.yaml there"),
        ([str(tmp_path / "bare"), "--out", str(tmp_path / "a")], "no SFT players"),
        ([str(checkpointed_run), "--out", str(taken)], "exists and is not an empty folder"),
    ]
    for args, message in cases:
        done = reflectrl("export", *args)
        assert done.returncode == 2, done.stderr
        assert done.stderr.count("\n") == 1 and message in done.stderr, done.stderr
    assert [p.name for p in taken.iterdir()] == ["notes.txt"]
    assert (taken / "notes.txt").read_text() == "keep me"
    assert (taken / "notes.txt").stat().st_mtime_ns == before
    assert not (tmp_path / "a").exists()
