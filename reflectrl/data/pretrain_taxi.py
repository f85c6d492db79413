"""A short pretraining of a from-scratch trunk on reading DangerousTaxi's map
(`scratch:dangerous_taxi:gpt2_read`), so SFT starts from a trunk that can tell where things are,
as a pretrained LM's trunk brings reading to the paper's policy.

Each example is one rendered observation of a uniformly drawn Taxi state (the grid and its
status line, with the cells' coordinates on every other example) and a question about what it
shows. No expert action, reward or start split enters: the answers are read off the drawing
(and the fixed map the drawing shows). States come from every undelivered one, held-out starts'
included; no question says which action to take or how an episode ends. Three kinds, the loss on
the answers only:
- `blocked`: which moves from the taxi run into a wall or the edge (`north east`, or `none`);
- `cell`: what is drawn at a row and column (`.`, `T`, `X`, `P` or `D`);
- `offset`: where the taxi's target is from the taxi, in rows and columns (`2 south 1 west`,
  or `here`): the passenger, or the destination once the passenger is aboard.
"""

from __future__ import annotations

import numpy as np
from gymnasium.envs.toy_text.taxi import TaxiEnv

from reflectrl.data.pretrain import Example
from reflectrl.envs.taxi import ACTIONS, IN_TAXI, render_text

READING_KINDS = ("blocked", "cell", "offset")
MOVES = 4  # ACTIONS[:4] are the moves: south, north, east, west


class TaxiReadingText:
    """Examples of every reading kind, drawn from a seeded generator."""

    kinds = READING_KINDS

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.taxi = TaxiEnv()  # only its fixed transition table and landmark cells are read
        self.states = [s for s in range(self.taxi.observation_space.n) if not self._delivered(s)]

    def _delivered(self, state: int) -> bool:
        _, _, passenger, destination = self.taxi.decode(state)
        return passenger == destination

    def example(self, kind: str | None = None) -> Example:
        kind = kind or READING_KINDS[int(self.rng.integers(len(READING_KINDS)))]
        state = self.states[int(self.rng.integers(len(self.states)))]
        row, col, passenger, destination = (int(v) for v in self.taxi.decode(state))
        shown = render_text(
            row, col, passenger, destination, locs=self.taxi.locs,
            coordinates=bool(self.rng.integers(2)),
        )  # fmt: skip
        if kind == "blocked":
            blocked = [
                ACTIONS[a].removeprefix("go ")
                for a in range(MOVES)
                if self.taxi.P[state][a][0][1] == state
            ]
            return Example(kind, f"{shown}\nBlocked moves: ", " ".join(blocked) or "none")
        if kind == "cell":
            r, c = (int(v) for v in self.rng.integers(5, size=2))
            drawn = shown.split("\n")[1 + r][2 * c + 1]
            return Example(kind, f"{shown}\nAt row {r}, column {c}: ", drawn)
        target = self.taxi.locs[destination if passenger == IN_TAXI else passenger]
        return Example(kind, f"{shown}\nTarget from the taxi: ", offset(row, col, *target))


def offset(row: int, col: int, to_row: int, to_col: int) -> str:
    """`2 south 1 west`: rows first, then columns; `here` on the same cell."""
    parts = []
    if to_row != row:
        parts.append(f"{abs(to_row - row)} {'south' if to_row > row else 'north'}")
    if to_col != col:
        parts.append(f"{abs(to_col - col)} {'east' if to_col > col else 'west'}")
    return " ".join(parts) or "here"
