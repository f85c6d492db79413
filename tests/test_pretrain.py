"""The synthetic copy and lookup pretraining (reflectrl/data/pretrain.py): every kind's answer is
the right one, the text is seeded, the loss falls on answers only, and `pretrain_copy` writes
its figures beside trained weights."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from reflectrl.data import pretrain
from reflectrl.data.scratch import pretrain_copy
from reflectrl.models.loading import load_causal_lm
from reflectrl.models.model_dirs import SCRATCH_ARCHITECTURES, parse_scratch_spec, scratch_dirname


@pytest.fixture(scope="module")
def words(tokenizer: Any) -> list[str]:
    return pretrain.vocabulary_words(tokenizer)


def test_vocabulary_words_are_short_lower_case_tokens(words: list[str], tokenizer: Any) -> None:
    assert len(words) >= 20
    assert all(w.isalpha() and w.islower() and 3 <= len(w) <= 8 for w in words)
    assert all(len(tokenizer.encode(w, add_special_tokens=False)) == 1 for w in words[:50])


def test_the_text_is_seeded(words: list[str]) -> None:
    def draw(seed: int) -> list[pretrain.Example]:
        text = pretrain.SyntheticText(words, seed)
        return [text.example() for _ in range(20)]

    first, again, other = draw(7), draw(7), draw(8)
    assert first == again
    assert first != other
    assert len({e.kind for e in first}) >= 3


@pytest.mark.parametrize("seed", range(30))
def test_every_kind_answers_right(words: list[str], seed: int) -> None:
    text = pretrain.SyntheticText(words, seed)
    repeat = text.example("repeat")
    assert repeat.prompt == f"Say: {repeat.answer}\nAgain: "

    lookup = text.example("lookup")
    key = lookup.prompt.rsplit("\nWhat is ", 1)[1].removesuffix("? ")
    table = dict(line.split(" = ") for line in lookup.prompt.split("\n")[:-1])
    assert table[key] == lookup.answer

    match = text.example("match")
    listing, question = match.prompt.rsplit("\n", 1)
    camel = question.removeprefix("Which one is ").removesuffix("? ")
    named = match.answer.strip('"')
    assert named in listing.split("\n")
    assert camel == "".join(w.capitalize() for w in named.split(".")[0].split("_"))

    contains = text.example("contains")
    lines, question = contains.prompt.rsplit("\n", 1)
    name = question.removeprefix("Defines ").removesuffix("? ")
    defined = {line.split(" ", 1)[1] for line in lines.split("\n")}
    assert contains.answer == ("yes" if name in defined else "no")

    unseen = text.example("unseen")
    everything, done, _ = unseen.prompt.split("\n")
    names = everything.removeprefix("All: ").split(" ")
    finished = set(done.removeprefix("Done:").split())
    assert unseen.answer.strip('"') == next(n for n in names if n not in finished)


def test_the_loss_is_on_answers_only(words: list[str], tokenizer: Any) -> None:
    example = pretrain.SyntheticText(words, 0).example("lookup")
    ids, targets = pretrain.encode(tokenizer, example)
    answer = tokenizer.encode(example.answer, add_special_tokens=False)
    assert ids[-1] == tokenizer.eos_token_id
    assert [t for t in targets if t != -100] == [*answer, tokenizer.eos_token_id]
    assert targets[: len(ids) - len(answer) - 1] == [-100] * (len(ids) - len(answer) - 1)

    inputs, shifted = pretrain.packed_batch(tokenizer, pretrain.SyntheticText(words, 0), 2, 256)
    assert inputs.shape == shifted.shape == (2, 256)
    scored = shifted != -100
    assert 0 < int(scored.sum()) < scored.numel() // 2
    # Position t is scored on the token at t + 1.
    rows, cols = scored[:, :-1].nonzero(as_tuple=True)
    assert torch.equal(shifted[rows, cols], inputs[rows, cols + 1])


def test_llama_copy_is_a_scratch_architecture() -> None:
    assert "llama_copy" in SCRATCH_ARCHITECTURES
    assert parse_scratch_spec("scratch:auto_explore:llama_copy") == ("auto_explore", "llama_copy")
    assert scratch_dirname("auto_explore", "llama_copy") == "scratch-llama_copy-auto_explore"


@pytest.mark.parametrize("reading", [False, True], ids=["copy", "taxi_reading"])
def test_pretrain_copy_trains_in_place_and_writes_its_figures(
    tiny_dir: Path, tmp_path: Path, reading: bool
) -> None:
    """Both texts (copy and lookup; reading Taxi's map) train in place and score each kind."""
    from reflectrl.data.pretrain_taxi import READING_KINDS

    model_dir = tmp_path / "model"
    shutil.copytree(tiny_dir, model_dir)
    before = {k: v.clone() for k, v in load_causal_lm(model_dir).state_dict().items()}
    pretrain_copy(model_dir, steps=2, batch_rows=1, scored_per_kind=2, reading=reading)
    after = load_causal_lm(model_dir).state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    figures = json.loads((model_dir / "pretrain.json").read_text())
    assert figures["steps"] == 2
    assert set(figures["accuracy"]) == set(READING_KINDS if reading else pretrain.KINDS)
    assert all(0.0 <= share <= 1.0 for share in figures["accuracy"].values())


def taxi_and_target(grid: list[str]) -> tuple[tuple[int, int], tuple[int, int] | None]:
    """The taxi's cell and its target's (P, or D with X), read off the drawn grid; the target is
    None when the taxi hides it."""
    cells = {grid[1 + r][2 * c + 1]: (r, c) for r in range(5) for c in range(5)}
    taxi = "X" if "X" in cells else "T"
    return cells[taxi], cells.get("D" if taxi == "X" else "P")


@pytest.mark.parametrize("seed", range(40))
def test_every_taxi_reading_answer_is_what_the_drawing_shows(seed: int) -> None:
    from reflectrl.data.pretrain_taxi import READING_KINDS, TaxiReadingText, offset

    text = TaxiReadingText(seed)
    assert text.kinds == READING_KINDS
    blocked = text.example("blocked")
    grid = blocked.prompt.split("\n")
    (r, c), _ = taxi_and_target(grid)
    # A move is blocked by the edge or by a `|` between two cells of the drawing.
    walls = {
        "south": r == 4,
        "north": r == 0,
        "east": grid[1 + r][2 * c + 2] == "|",
        "west": grid[1 + r][2 * c] == "|",
    }
    assert blocked.answer == (" ".join(m for m, wall in walls.items() if wall) or "none")

    cell = text.example("cell")
    question = cell.prompt.rsplit("\n", 1)[1]
    r, c = (int(v) for v in question.removeprefix("At row ").removesuffix(": ").split(", column "))
    assert cell.answer == cell.prompt.split("\n")[1 + r][2 * c + 1]
    assert cell.answer in {".", "T", "X", "P", "D"}

    target = text.example("offset")
    (r, c), to = taxi_and_target(target.prompt.split("\n"))
    assert target.answer == ("here" if to is None else offset(r, c, *to))
    assert offset(3, 1, 0, 4) == "3 north 3 east" and offset(2, 2, 2, 2) == "here"


def test_the_taxi_reading_text_is_seeded_and_mixes_its_kinds() -> None:
    from reflectrl.data.pretrain_taxi import TaxiReadingText

    def draw(seed: int) -> list[pretrain.Example]:
        text = TaxiReadingText(seed)
        return [text.example() for _ in range(30)]

    first = draw(3)
    assert first == draw(3) and first != draw(4)
    assert {e.kind for e in first} == {"blocked", "cell", "offset"}
    # Half the drawings name the cells' coordinates, as env.options.coordinates does.
    assert 5 < sum("Cells (row, column)" in e.prompt for e in first) < 25


def test_gpt2_read_is_a_scratch_architecture_of_taxi_only() -> None:
    assert parse_scratch_spec("scratch:dangerous_taxi:gpt2_read") == ("dangerous_taxi", "gpt2_read")
    with pytest.raises(ValueError, match="dangerous_taxi only; use scratch:auto_explore:gpt2"):
        parse_scratch_spec("scratch:auto_explore:gpt2_read")
