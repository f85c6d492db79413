"""The walkthrough as an expert policy, for SFT data (including perturbed, negative examples).

The expert plays the game's walkthrough, written when the game was generated (or shipped with the
official data), so no planner ever runs at training time. It follows the walkthrough from the
commands the episode has played in order (`AlfWorldEnv.walkthrough_progress`). When an episode
has left it (a wrong "go to", a receptacle closed again), the expert first recovers: it re-opens
what the walkthrough opened since its last "go to", or goes back there; from that spot the next
walkthrough command applies again. States that need more (an unplanned object in hand) have no
expert action: `ExpertError`.
"""

from __future__ import annotations

from collections.abc import Sequence

from reflectrl.envs.alfworld.env import AlfWorldEnv
from reflectrl.errors import ReflectRLError


class ExpertError(ReflectRLError):
    """No expert action: the game has no walkthrough, or the episode left it beyond recovery."""


def expert_command(env: AlfWorldEnv) -> str:
    """The expert's next command; it is always on `env.menu`."""
    walkthrough = env.walkthrough
    if env.game is None:
        raise ExpertError("no episode: call reset() first")
    if walkthrough is None:
        raise ExpertError(f"{env.game.path}: the game has no walkthrough, so no expert")
    done = walkthrough[: env.walkthrough_progress]
    if env.walkthrough_progress < len(walkthrough):
        planned = walkthrough[env.walkthrough_progress]
        if planned in env.menu:
            return planned
    recovery = _recovery(done, env.menu)
    if recovery is None:
        raise ExpertError(
            f"{env.game.path}: the episode left the walkthrough after "
            f"{env.walkthrough_progress} of its {len(walkthrough)} commands and cannot rejoin it"
        )
    return recovery


def expert_action(env: AlfWorldEnv) -> int:
    """The expert's next action as an index into the current menu (`obs.actions`)."""
    return env.menu.index(expert_command(env))


def _recovery(done: Sequence[str], menu: Sequence[str]) -> str | None:
    for command in reversed(done):
        if command.startswith("open ") and command in menu:
            return command  # closed again since: open it again
        if command.startswith("go to "):
            return command if command in menu else None  # back to where the plan was
    return None
