"""Every prompt of the method, in one place (METHOD.md, "Prompt layout").

- reflection prompt = task instruction + observation (no menu) + ANALYZE_MARKER
- policy prompt     = reflection prompt + reflection text + menu + ACTION_MARKER
- no-reflection     = task instruction + observation + menu + ACTION_MARKER

With `policy.show_menu: false` (the text action head only) both policy layouts drop the menu
(MENU_HEADER and its lines): the head scores the valid actions' own text after the prompt.

The policy answers with one label token right after ACTION_MARKER; the menu lists
"<label>. <action>" lines, in the order given by `order` (a permutation of the env's actions,
so per-step shuffling cannot be learned as label positions).

Every prompt is `head + body + tail` (`Prompt`): the head is the task header, the body is the
env's observation text, the tail holds the markers, the reflection and the menu. Fitting a
prompt to a token budget asks the env for a shorter body first (it trims history, never the
current state); only as a last resort is the end of the body cut. Head and tail are never cut.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from reflectrl.envs.base import TextObservation

ANALYZE_MARKER = " # Analyze:\n"
ACTION_MARKER = " # Action:\n"
MENU_HEADER = "\nValid actions:\n"


@dataclass(frozen=True)
class Prompt:
    head: str  # the task header
    body: str  # the observation text
    tail: str  # markers, reflection, menu

    @property
    def text(self) -> str:
        return self.head + self.body + self.tail


def render_menu(actions: Sequence[str], labels: Sequence[str], order: Sequence[int]) -> str:
    """Menu line i shows label i and action `actions[order[i]]`."""
    if len(order) != len(actions):
        raise ValueError(f"order has {len(order)} entries for {len(actions)} actions")
    if len(actions) > len(labels):
        raise ValueError(f"{len(actions)} actions but only {len(labels)} labels")
    return "\n".join(f"{labels[i]}. {actions[j]}" for i, j in enumerate(order))


def reflection_parts(obs: TextObservation) -> Prompt:
    return Prompt(f"{obs.instruction}\n", obs.observation, ANALYZE_MARKER)


def menu_block(
    obs: TextObservation, labels: Sequence[str], order: Sequence[int], show_menu: bool
) -> str:
    """MENU_HEADER and the menu's lines, or nothing when the prompt leaves the menu out."""
    return f"{MENU_HEADER}{render_menu(obs.actions, labels, order)}" if show_menu else ""


def policy_parts(
    obs: TextObservation,
    reflection: str,
    labels: Sequence[str],
    order: Sequence[int],
    show_menu: bool = True,
) -> Prompt:
    menu = menu_block(obs, labels, order, show_menu)
    tail = f"{ANALYZE_MARKER}{reflection.strip()}{menu}{ACTION_MARKER}"
    return Prompt(f"{obs.instruction}\n", obs.observation, tail)


def no_reflection_parts(
    obs: TextObservation, labels: Sequence[str], order: Sequence[int], show_menu: bool = True
) -> Prompt:
    menu = menu_block(obs, labels, order, show_menu)
    return Prompt(f"{obs.instruction}\n", obs.observation, f"{menu}{ACTION_MARKER}")


def prompt_head(obs: TextObservation) -> str:
    """The part of every prompt that truncation must keep (the task header)."""
    return f"{obs.instruction}\n"
