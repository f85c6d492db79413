"""Seeds derived from `run.seed`: every random choice of a run takes one from here."""

from __future__ import annotations

import numpy as np


def hash_seed(*parts: int) -> int:
    """A stable 31-bit seed from integers (Python's hash() of ints is not mixed enough)."""
    return int(np.random.SeedSequence(list(parts)).generate_state(1)[0] & 0x7FFFFFFF)
