"""Warm-up SFT: completion-only rows, the loss, training both players, the CLI's errors."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from reflectrl.config import load_config
from reflectrl.data.dataset import write_dataset
from reflectrl.errors import ModelLoadError
from reflectrl.models.adapters import check_adapter_fits
from reflectrl.models.loading import load_causal_lm, load_tokenizer
from reflectrl.models.policy import OptionPolicy
from reflectrl.reflection.actor import ReflectionServerActor
from reflectrl.reflection.client import ReflectionClient
from reflectrl.sft.rows import IGNORE, encode_rows, load_rows
from reflectrl.sft.trainer import build_model, completion_loss, finished, train_player
from reflectrl.text.prompts import ACTION_MARKER
from reflectrl.text.tokens import label_token_ids
from tests.helpers import run_cli
from tests.test_reflection_server import needs_vllm

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "configs" / "smoke.yaml"
FAST = ["sft.max_steps=12", "sft.batch_size=8", "sft.lr=0.03", "sft.eval_steps=6"]


@pytest.fixture(scope="module")
def taxi_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sft") / "data"
    write_dataset(load_config(SMOKE), out, episodes=16, seed=0, progress=False)
    return out


def test_rows_put_the_loss_on_the_label_and_eos_only(taxi_data: Path, tokenizer: Any) -> None:
    config = load_config(SMOKE)
    train, held = load_rows(taxi_data, "sft_policy")
    assert train and held and {r["split"] for r in held} == {"eval"}
    encoded = encode_rows(train, tokenizer, config.env.max_prompt_tokens, single_token=True)
    labels = label_token_ids(tokenizer, config.policy.labels, ACTION_MARKER)
    for row, example in zip(train, encoded.examples, strict=True):
        prompt = tokenizer.encode(row["prompt"], add_special_tokens=False)
        assert example["input_ids"][: len(prompt)] == prompt  # as the vector env encodes it
        taught = [t for t in example["labels"] if t != IGNORE]
        # the label token the policy scores in context, then EOS
        expected = labels[config.policy.labels.index(row["completion"])]
        assert taught == [expected, tokenizer.eos_token_id]
        assert example["labels"][: len(prompt)] == [IGNORE] * len(prompt)


def test_completion_loss_equals_the_models_own_loss(tiny_dir: Path, tokenizer: Any) -> None:
    model = build_model(tiny_dir, "lora", load_config(None).policy.lora, seed=0)
    rows = [
        {"prompt": "You are at (1, 2). # Action:\n", "completion": "3"},
        {"prompt": "Short. # Analyze:\n", "completion": "Go north to reach the passenger."},
    ]
    examples = encode_rows(rows, tokenizer, 64, single_token=False).examples
    width = max(len(e["input_ids"]) for e in examples)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([e["input_ids"] + [pad] * (width - len(e["input_ids"])) for e in examples])
    labels = torch.tensor([e["labels"] + [IGNORE] * (width - len(e["labels"])) for e in examples])
    mask = torch.arange(width)[None] < torch.tensor([[len(e["input_ids"])] for e in examples])
    ours = completion_loss(model, ids, mask.long(), labels)
    theirs = model(input_ids=ids, attention_mask=mask.long(), labels=labels).loss
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def sft_out(taxi_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sft") / "adapters"
    for player in ("reflection", "policy"):
        train_player(load_config(SMOKE, FAST), taxi_data, player, out, progress=False)
    return out


def test_sft_lowers_the_completion_loss_and_saves_peft_adapters(
    taxi_data: Path, sft_out: Path, tmp_path: Path
) -> None:
    config = load_config(SMOKE, FAST)
    out = sft_out
    for player in ("reflection", "policy"):
        result = finished(out, player)
        assert result is not None and result["steps"] == 12
        assert result["loss_after"]["train"] < result["loss_before"]["train"] - 0.2, result
        assert result["loss_after"]["eval"] < result["loss_before"]["eval"], result
        adapter = json.loads((out / player / "adapter_config.json").read_text())
        assert adapter["peft_type"] == "LORA" and adapter["r"] == 8
    assert not list(out.glob(".*"))  # no temporary folder left behind
    # The same config and seed give the same adapter.
    again = train_player(config, taxi_data, "policy", tmp_path / "again", progress=False)
    assert again["loss_after"] == finished(out, "policy")["loss_after"]


def test_full_sft_writes_a_model_directory(taxi_data: Path, tmp_path: Path) -> None:
    config = load_config(SMOKE, [*FAST, "sft.method=full", "sft.lr=0.001"])
    result = train_player(config, taxi_data, "policy", tmp_path, progress=False)
    assert result["loss_after"]["train"] < result["loss_before"]["train"] - 0.2, result
    model = load_causal_lm(tmp_path / "policy")  # an ordinary HF model directory
    assert load_tokenizer(tmp_path / "policy").eos_token_id is not None
    assert sum(p.numel() for p in model.parameters()) > 1_000_000


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, timeout=300)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--player", "critic"], "--player 'critic': choose one of reflection, policy, both"),
        (["--data", "{tmp}/nothing"], "no data.jsonl; write a data set there"),
    ],
)
def test_sft_cli_errors_are_one_line(
    taxi_data: Path, tmp_path: Path, args: list[str], message: str
) -> None:
    argv = ["sft", "--config", str(SMOKE), "--data", str(taxi_data), "--out", str(tmp_path / "o")]
    argv += [a.format(tmp=tmp_path) for a in args]
    done = _cli(*argv)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and message in done.stderr, done.stderr


def test_sft_cli_never_overwrites_a_finished_adapter(taxi_data: Path, tmp_path: Path) -> None:
    argv = ["sft", "--config", str(SMOKE), "--data", str(taxi_data), "--out", str(tmp_path)]
    argv += ["--player", "policy", "--set", "sft.max_steps=2", "--set", "sft.logging_steps=1"]
    first = _cli(*argv)
    assert first.returncode == 0, first.stderr
    assert "sft policy: 2 steps" in first.stdout
    # Not a terminal: one progress line per logging step instead of a bar.
    assert "sft policy: step 2/2, loss " in first.stderr and "s left)" in first.stderr
    before = (tmp_path / "policy" / "adapter_model.safetensors").read_bytes()
    second = _cli(*argv)
    assert second.returncode == 2 and "already exists" in second.stderr
    assert (tmp_path / "policy" / "adapter_model.safetensors").read_bytes() == before


def test_the_policy_adapter_loads_into_the_option_policy(
    sft_out: Path, tiny_dir: Path, tokenizer: Any
) -> None:
    from peft import PeftModel

    config = load_config(SMOKE)
    labels = label_token_ids(tokenizer, config.policy.labels[:6], ACTION_MARKER)
    policy = OptionPolicy(tiny_dir, labels, seed=5)
    untrained = {k: v.clone() for k, v in policy.lora_state().items()}
    policy.load_sft_adapter(sft_out / "policy")
    assert any(not torch.equal(untrained[k], v) for k, v in policy.lora_state().items())
    # Its label logits are the SFT'd LM's next-token logits at the label tokens.
    reference = PeftModel.from_pretrained(load_causal_lm(tiny_dir), str(sft_out / "policy"))
    ids = torch.tensor([tokenizer.encode("Taxi at (2, 3). # Action:\n", add_special_tokens=False)])
    mask = torch.ones_like(ids)
    with torch.no_grad():
        logits, value = policy(ids, mask, torch.ones(1, len(labels)))
        expected = reference(input_ids=ids, attention_mask=mask).logits[0, -1, labels]
    torch.testing.assert_close(logits[0], expected, rtol=1e-4, atol=1e-4)
    assert float(value) == 0.0  # the value head is not part of SFT


def test_an_adapter_that_does_not_fit_is_a_one_line_error(
    sft_out: Path, tiny_dir: Path, tmp_path: Path
) -> None:
    policy = OptionPolicy(tiny_dir, [1, 2], lora_r=16, lora_alpha=32)
    with pytest.raises(ModelLoadError, match=r"r=8, alpha=16.*policy.lora has r=16, alpha=32"):
        policy.load_sft_adapter(sft_out / "policy")
    with pytest.raises(ModelLoadError, match="not a peft adapter"):
        check_adapter_fits(tmp_path, tiny_dir, "reflection.adapter")
    # Same LoRA settings, another model: the shapes name both sides.
    wider = tmp_path / "wider"
    shutil.copytree(tiny_dir, wider)
    config = AutoConfig.from_pretrained(tiny_dir)
    config.hidden_size *= 2
    AutoModelForCausalLM.from_config(config).save_pretrained(wider)
    with pytest.raises(ModelLoadError, match=r"has shape \[8, 128\] in the adapter but \[8, 256\]"):
        check_adapter_fits(sft_out / "policy", wider, "policy.init_adapter")


PROMPTS = [f"Taxi at ({i}, 2), passenger at R. # Analyze:\n" for i in range(4)]


def served_reflections(config: Any, log: Path, models: list[str]) -> list[list[str]]:
    """Greedy reflections of PROMPTS from a real vLLM server started as RL starts it."""
    actor = ReflectionServerActor(config.reflection.model_dump(mode="json"), str(log), None)
    url = actor.url()
    try:
        return [
            ReflectionClient(url, model=m, max_tokens=12, temperature=0.0).reflect(PROMPTS)
            for m in models
        ]
    finally:
        actor.stop()


@pytest.fixture(scope="module")
def adapter_server_reflections(sft_out: Path) -> list[list[str]]:
    """(base model, SFT adapter, SFT adapter again) from one server serving both."""
    config = load_config(SMOKE, [f"reflection.adapter={sft_out / 'reflection'}"])
    assert config.reflection.request_model == "reflection-sft"
    names = [config.reflection.served_model_name, config.reflection.request_model]
    return served_reflections(config, sft_out.parent / "server.log", [*names, names[1]])


@needs_vllm
def test_vllm_serves_the_reflection_adapter(adapter_server_reflections: list) -> None:
    base, adapted, again = adapter_server_reflections
    assert base != adapted, base
    assert adapted == again  # greedy: reproducible


@needs_vllm
def test_vllm_serves_a_fully_trained_reflection_model(
    taxi_data: Path, tmp_path: Path, adapter_server_reflections: list
) -> None:
    """sft.method=full: the output directory is the reflection model vLLM serves."""
    config = load_config(SMOKE, [*FAST, "sft.method=full", "sft.lr=0.001"])
    train_player(config, taxi_data, "reflection", tmp_path / "sft", progress=False)
    served = load_config(SMOKE, [f"reflection.model={tmp_path / 'sft' / 'reflection'}"])
    (trained,) = served_reflections(served, tmp_path / "log", ["reflection"])
    untrained = adapter_server_reflections[0]  # the same prompts on the base model
    assert trained != untrained, trained


def test_rl_starts_from_the_sft_policy_adapter(sft_out: Path) -> None:
    from peft.utils import load_peft_weights

    from tests.support.in_process import build_in_process

    adapter = sft_out / "policy"
    config = load_config(SMOKE, ["reflection.enabled=false", f"policy.init_adapter={adapter}"])
    local = build_in_process(config)
    saved = load_peft_weights(str(adapter))
    for module in (local.learner.module["default_policy"], local.runner.module):
        lora = {k: v for k, v in module.policy.lm.state_dict().items() if "lora_" in k}
        assert len(lora) == len(saved)
        for name, tensor in saved.items():
            torch.testing.assert_close(lora[name.replace(".weight", ".default.weight")], tensor)


def test_launch_refuses_an_adapter_of_another_lora_shape(sft_out: Path, tmp_path: Path) -> None:
    done = _cli(
        "launch", "--config", str(SMOKE), "--output", str(tmp_path / "run"),
        "--set", f"policy.init_adapter={sft_out / 'policy'}", "--set", "policy.lora.r=16",
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert "policy.lora has r=16" in done.stderr and "set policy.lora.r=8" in done.stderr
    assert not (tmp_path / "run").exists()
