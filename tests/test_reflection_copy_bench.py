"""diagnostics/reflection_copy.py scores the command a reflection quotes last, token for token,
and weighs it in the loss as asked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from diagnostics.reflection_copy import command_accuracy, completion_loss, reflection_rows

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


def test_errors_are_sorted_by_what_the_screen_shows(tmp_path: Path) -> None:
    from diagnostics.reflection_errors import outcome, screen
    from tests.test_auto_explore_env import build_repo, make_env, reset_to

    env = make_env(tmp_path, build_repo(tmp_path))
    reset_to(env, "pkg/models.py")
    for command in ("cd pkg", "cat __init__.py"):
        obs, *_ = env.step(env.actions.index(command))
    names, taken = screen(f"{obs.instruction}\n{obs.observation} # Analyze:\n")
    assert names == ["sub", "__init__.py", "models.py", "utils.py"]  # "sub/" shown
    assert taken == {"pkg", "__init__.py"}
    expert = "cat models.py"
    sorted_as = {
        "cat models.py": "right",
        "cd sub": "first_unread",  # the first entry the history does not name
        "cat __init__.py": "named_before",
        "cat utils.py": "other_unread",
        "cat model.py": "not_listed",
        "id models.py": "wrong_kind",
        "cd ..": "wrong_kind",
    }
    assert {said: outcome(said, expert, names, taken) for said in sorted_as} == sorted_as
    assert outcome("cat models.py", "cd ..", names, taken) == "wrong_kind"


def test_renamed_rows_keep_the_experts_choice_under_new_names() -> None:
    import random

    from diagnostics.reflection_copy import renamed

    prompt = (
        "Which file defines the class `ModelConfig`? Explore the repository.\n"
        "Current directory: pkg\nContents:\nsub/\n__init__.py\nconfig.py\nmodels.py\n"
        "utils.py\nCommands so far: cd pkg; cat __init__.py (17 steps left)\n"
        "Last output:\n__init__.py:\nfrom .utils import helper # Analyze:\n"
    )
    row = {"prompt": prompt, "expert_action": "cat utils.py",
           "completion": '"cat __init__.py" showed __init__.py. Then "cat utils.py".'}  # fmt: skip
    first, again = renamed(row, random.Random(3)), renamed(row, random.Random(3))
    assert first == again  # seeded
    listing = first["prompt"].split("Contents:\n")[1].split("\nCommands")[0].split("\n")
    # Names like the key stay (config.py, models.py: "Config", "Model"); the others change,
    # keep their suffix and their alphabetical order; directories stay.
    assert listing[:1] == ["sub/"] and listing[2:4] == ["config.py", "models.py"]
    init, utils = listing[1], listing[4]
    assert init.endswith(".py") and utils.endswith(".py") and init < utils
    assert {init, utils}.isdisjoint({"__init__.py", "utils.py"})
    assert first["expert_action"] == f"cat {utils}"
    assert first["completion"] == f'"cat {init}" showed {init}. Then "cat {utils}".'
    assert f"cd pkg; cat {init} (17" in first["prompt"]
    assert "from .utils import" in first["prompt"]  # a module name in code is not a file name
