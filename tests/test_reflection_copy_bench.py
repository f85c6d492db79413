"""benchmarks/reflection_copy.py scores the command a reflection quotes last, token for token,
and weighs it in the loss as asked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from benchmarks.reflection_copy import command_accuracy, completion_loss, reflection_rows

ROWS = [
    ("train", 'Mistake: "cat a.py" showed a.py. Fix it with "cat config.py".', "cat config.py"),
    ("eval", '"cat b.py" showed b.py, which states Foo. Next: "id b.py".', "id b.py"),
    ("eval", 'Nothing explored yet. First: "cd src".', "cd src"),
    ("eval", "No quote of the expert's command here.", "cd .."),
]


def write_data(folder: Path) -> Path:
    with (folder / "data.jsonl").open("w") as out:
        for split, completion, action in ROWS:
            for target in ("sft_reflection", "sft_policy"):
                row = {"target": target, "split": split, "prompt": "Where? # Analyze:\n",
                       "completion": completion, "expert_action": action}  # fmt: skip
                out.write(json.dumps(row) + "\n")
    return folder


def test_rows_mark_the_last_quoted_expert_command(tmp_path: Path, tokenizer: Any) -> None:
    rows = reflection_rows(write_data(tmp_path), "eval", tokenizer)
    # The row that never quotes its expert's command is left out; policy rows too.
    assert [kind for *_, kind in rows] == ["id", "cd"]
    for (ids, start, at, end, _), (_, completion, action) in zip(rows, ROWS[1:], strict=False):
        assert tokenizer.decode(ids[at:end]) == action
        assert tokenizer.decode(ids[start:-1]) == completion
        assert ids[-1] == tokenizer.eos_token_id


class Echo(torch.nn.Module):
    """Predicts every next token exactly, except token `wrong` (a fixed other id)."""

    def __init__(self, vocab: int, wrong: int) -> None:
        super().__init__()
        self.vocab, self.wrong = vocab, wrong

    def forward(self, input_ids: torch.Tensor, attention_mask: Any = None) -> Any:
        nxt = torch.roll(input_ids, -1, dims=1)
        nxt = torch.where(nxt == self.wrong, torch.zeros_like(nxt), nxt)
        logits = torch.nn.functional.one_hot(nxt, self.vocab).float() * 100
        return type("Out", (), {"logits": logits.requires_grad_()})()


def test_command_accuracy_and_weighting(tmp_path: Path, tokenizer: Any) -> None:
    rows = reflection_rows(write_data(tmp_path), "eval", tokenizer)
    (ids, _, _, end, _), _ = rows
    perfect = Echo(len(tokenizer), wrong=-1)
    assert command_accuracy(perfect, rows, tokenizer) == {"all": 1.0, "cd": 1.0, "id": 1.0}
    # One wrong token inside the `id` command fails that row only.
    broken = Echo(len(tokenizer), wrong=ids[end - 1])
    assert command_accuracy(broken, rows[:1], tokenizer)["id"] == 0.0
    # The command's weight moves the loss only through the command's tokens.
    plain = completion_loss(broken, rows[:1], tokenizer.pad_token_id, 1.0)
    heavy = completion_loss(broken, rows[:1], tokenizer.pad_token_id, 10.0)
    assert float(heavy.detach()) > float(plain.detach()) > 0
    assert float(completion_loss(perfect, rows, tokenizer.pad_token_id, 10.0).detach()) < 1e-3
