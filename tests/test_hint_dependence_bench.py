"""`diagnostics/hint_dependence.py`: how far a policy's distribution depends on anything but the
reflection's hint, computed by hand on four prompts."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from diagnostics.hint_dependence import hint_dependence

# ACTIONS[0] is "go south", ACTIONS[1] "go north". Shortest-path actions get 0
# (diagnostics.taxi_prompts' A(s, a)), the others < 0.
RIGHT_SOUTH = [0.0, -2.0, -2.0, -2.0, -3.0, -3.0]
WRONG_SOUTH = [-2.0, 0.0, -2.0, -2.0, -3.0, -3.0]


def prompts() -> SimpleNamespace:
    """Three `pickup` prompts hinting "go south" (right, wrong, right), one `full` prompt hinting
    "go north" (wrong: "go south" is the shortest path there)."""
    return SimpleNamespace(
        keys=[(True, 1), (True, 2), (True, 3), (False, 4)],
        reflections=['Now do "go south".', 'Next: "go south".', 'Do "go south".', 'Do "go north".'],
        oracle=[RIGHT_SOUTH, WRONG_SOUTH, RIGHT_SOUTH, RIGHT_SOUTH],
        rows=[[0]] * 4,
    )


def logits_with(p_south: list[float], north_last: float) -> torch.Tensor:
    """Rows putting p on "go south" and the rest on "go north" (others ~0)."""
    rows = [[math.log(p), math.log(1 - p)] + [-30.0] * 4 for p in p_south]
    rows.append([math.log(1 - north_last), math.log(north_last)] + [-30.0] * 4)
    return torch.tensor(rows)


def test_a_policy_that_reads_only_the_hint_is_blind() -> None:
    out = hint_dependence(prompts(), logits_with([0.9, 0.9, 0.9], 0.9))
    assert out["hint_wrong"] == 2 and out["follows"] == 1.0
    assert out["auc"] == 0.5  # the wrong-hint prompt ties both right-hint ones
    assert out["within_group_tv"] == pytest.approx(0.0, abs=1e-4)
    assert out["p_hint_right"] == pytest.approx(0.9, abs=1e-4)
    assert out["p_hint_wrong"] == pytest.approx(0.9, abs=1e-4)
    assert out["wrong_left"] == 0


def test_a_policy_that_leaves_the_wrong_hint_is_seen() -> None:
    # The wrong "go south" gets 0.2 (its argmax now "go north", the shortest path there); the
    # right ones 0.9 and 0.8; the lone "go north" prompt follows its (wrong) hint.
    out = hint_dependence(prompts(), logits_with([0.9, 0.2, 0.8], 0.9))
    assert out["auc"] == 1.0
    assert out["follows"] == 0.75
    assert out["wrong_left"] == 1  # the north prompt's argmax, "go north", is off its path
    assert out["p_hint_right"] == pytest.approx((0.9 + 0.8) / 2, abs=1e-4)
    assert out["p_hint_wrong"] == pytest.approx((0.2 + 0.9) / 2, abs=1e-4)
    # The south group's mean puts 0.633 on south: TVs 0.267, 0.433, 0.167; the north one 0.
    assert out["within_group_tv"] == pytest.approx((0.2667 + 0.4333 + 0.1667 + 0) / 4, abs=1e-3)
