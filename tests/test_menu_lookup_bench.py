"""`diagnostics/menu_lookup.py --pretrain`: a drill row asks for every menu line once, and its
loss is taken where the next token is the asked line's label."""

from __future__ import annotations

import random

from diagnostics.menu_lookup import LABELS, drill_row, drill_targets
from reflectrl.data.scratch import train_tokenizer
from reflectrl.text.prompts import ACTION_MARKER, MENU_HEADER

WORDS = [f"{stem}{suffix}" for stem in ("apple", "river", "stone", "cloud") for suffix in "xyz"]


def parse(text: str) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """(label -> menu word, [(asked word, its answer)]) of one drill row."""
    menu_part, *asked = text.split("\nNext: ")
    lines = menu_part.removeprefix(MENU_HEADER.lstrip()).split("\n")
    menu = dict(line.split(". ", 1) for line in lines)
    return menu, [tuple(query.split(ACTION_MARKER)) for query in asked]


def test_drill_row_asks_every_line_once_with_its_label() -> None:
    draw = random.Random(0)
    for _ in range(20):
        menu, asked = parse(drill_row(WORDS, draw))
        assert 3 <= len(menu) <= 12
        assert sorted(word for word, _ in asked) == sorted(menu.values())
        assert all(menu[label] == word for word, label in asked)
        assert list(menu) == list(LABELS[: len(menu)])


def test_drill_targets_are_the_asked_labels_after_each_marker() -> None:
    draw = random.Random(1)
    texts = [drill_row(WORDS, draw) for _ in range(4)]
    tokenizer = train_tokenizer(iter([*texts, "\n".join(LABELS)] * 20), vocab_size=300)
    batch, positions, targets = drill_targets(tokenizer, texts)
    expected = [label for text in texts for _, label in parse(text)[1]]
    assert [tokenizer.decode([t]) for t in targets] == expected
    for (row, at), target in zip(positions, targets, strict=True):
        assert int(batch["input_ids"][row, at + 1]) == target
        prefix = tokenizer.decode(batch["input_ids"][row, : at + 1])
        assert prefix.endswith(ACTION_MARKER)
