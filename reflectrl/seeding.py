"""Seeds derived from `run.seed` (every random choice of a run takes one from here), and a
process's global random streams (Python `random`, NumPy's global generator, torch's CPU
generator) as JSON data, so a checkpoint can hold them and a resumed run continue them.

RLlib seeds these once when it builds a worker or learner; actions are sampled from torch's
stream and minibatches shuffled with NumPy's, so a resume that re-seeds them would replay
the first iteration's draws instead of continuing where the checkpoint left off.
"""

from __future__ import annotations

import base64
import random
from typing import Any

import numpy as np
import torch


def hash_seed(*parts: int) -> int:
    """A stable 31-bit seed from integers (Python's hash() of ints is not mixed enough)."""
    return int(np.random.SeedSequence(list(parts)).generate_state(1)[0] & 0x7FFFFFFF)


def capture_streams() -> dict[str, Any]:
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    return {
        "python": [version, list(internal), gauss_next],
        "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(gauss)],
        "torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode("ascii"),
    }


def restore_streams(state: dict[str, Any]) -> None:
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss))
    raw = np.frombuffer(base64.b64decode(state["torch"]), dtype=np.uint8).copy()
    torch.set_rng_state(torch.from_numpy(raw))
