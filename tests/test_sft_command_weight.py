"""`sft.reflection_command_weight`: the reflection's loss weighs the command it quotes last."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

from reflectrl.config import load_config
from reflectrl.data.dataset import DATA_FILE, write_dataset
from reflectrl.sft.rows import IGNORE, encode_rows, quoted_command_span
from reflectrl.sft.trainer import WeightedBatches, build_model, completion_loss, train_player

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "configs" / "smoke.yaml"
FAST = ["sft.max_steps=12", "sft.batch_size=8", "sft.lr=0.03", "sft.eval_steps=6"]
ROW = {
    "prompt": "Find the class Trainer. # Analyze:\n",
    "completion": 'Not "cd src" again. The next step is "cat trainer.py".',
    "expert_action": "cat trainer.py",
}


def test_the_weight_falls_on_the_last_quoted_expert_command(tokenizer: Any) -> None:
    plain = encode_rows([ROW], tokenizer, 64, single_token=False).examples[0]
    assert "loss_weights" not in plain  # weight 1: the rows are as before
    row = encode_rows([ROW], tokenizer, 64, single_token=False, command_weight=10.0).examples[0]
    weights, labels, ids = row["loss_weights"], row["labels"], row["input_ids"]
    assert len(weights) == len(labels) == len(ids)
    weighed = [i for i, w in enumerate(weights) if w == 10.0]
    assert tokenizer.decode([ids[i] for i in weighed]) == "cat trainer.py"
    assert weighed == list(range(weighed[0], weighed[-1] + 1))  # one span, the last quote
    assert [w == 0.0 for w in weights] == [label == IGNORE for label in labels]  # the prompt
    assert set(weights) == {0.0, 1.0, 10.0}
    assert weights[-1] == 1.0  # EOS
    # A reflection that does not quote its expert's command keeps weight 1 throughout.
    unquoted = {**ROW, "expert_action": "cd tests"}
    row = encode_rows([unquoted], tokenizer, 64, False, command_weight=10.0).examples[0]
    assert set(row["loss_weights"]) == {0.0, 1.0}
    assert quoted_command_span(tokenizer, ROW["completion"], "cd tests") is None


def test_the_weighted_loss_is_the_weighted_mean_and_weight_one_is_the_plain_loss(
    tiny_dir: Path, tokenizer: Any
) -> None:
    model = build_model(tiny_dir, "lora", load_config(None).policy.lora, seed=0)
    other = {**ROW, "completion": 'Then "cd ..".', "expert_action": "cd .."}
    examples = encode_rows([ROW, other], tokenizer, 64, False, command_weight=5.0).examples
    batch = WeightedBatches(DataCollatorForLanguageModeling(tokenizer.pad_token_id))(examples)
    assert batch["loss_weights"].shape == batch["labels"].shape
    args = (model, batch["input_ids"], batch["attention_mask"], batch["labels"])
    ours = completion_loss(*args, loss_weights=batch["loss_weights"])
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    losses = torch.nn.functional.cross_entropy(
        logits[:, :-1].flatten(0, 1), batch["labels"][:, 1:].flatten(), reduction="none"
    )
    w = batch["loss_weights"][:, 1:].flatten()
    torch.testing.assert_close(ours, (losses * w).sum() / w.sum(), rtol=1e-5, atol=1e-5)
    ones = torch.where(batch["labels"] == IGNORE, 0.0, 1.0)
    torch.testing.assert_close(completion_loss(*args, loss_weights=ones), completion_loss(*args))


@pytest.fixture(scope="module")
def quoting_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Taxi smoke data whose reflections end by quoting the expert's action, as AutoExplore's
    and ALFWorld's do."""
    out = tmp_path_factory.mktemp("weight") / "data"
    write_dataset(load_config(SMOKE), out, episodes=16, seed=0, progress=False)
    rows = [json.loads(line) for line in (out / DATA_FILE).open()]
    for row in rows:
        if row["target"] == "sft_reflection":
            row["completion"] += f' The next step is "{row["expert_action"]}".'
    (out / DATA_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


def test_sft_trains_the_reflection_with_the_weight(quoting_data: Path, tmp_path: Path) -> None:
    results, weights = {}, {}
    for weight in (1, 10):
        config = load_config(SMOKE, [*FAST, f"sft.reflection_command_weight={weight}"])
        out = tmp_path / f"w{weight}"
        results[weight] = train_player(config, quoting_data, "reflection", out, progress=False)
        weights[weight] = _lora_weights(out / "reflection")
        shutil.rmtree(out)
    # The held-out loss is the plain one, so both runs start from the same figure.
    assert results[1]["loss_before"] == results[10]["loss_before"]
    # The weight reaches the gradient: the same seed and rows train different adapters.
    assert any(not torch.equal(weights[1][k], weights[10][k]) for k in weights[1])


def _lora_weights(adapter: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(adapter / "adapter_model.safetensors"))
