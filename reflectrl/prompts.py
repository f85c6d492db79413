"""Every prompt of the method, in one place (METHOD.md, "Prompt layout").

- reflection prompt = task instruction + observation (no menu) + ANALYZE_MARKER
- policy prompt     = reflection prompt + reflection text + menu + ACTION_MARKER
- no-reflection     = task instruction + observation + menu + ACTION_MARKER

The policy answers with one label token right after ACTION_MARKER; the menu lists
"<label>. <action>" lines, in the order given by `order` (a permutation of the env's actions,
so per-step shuffling cannot be learned as label positions).
"""

from __future__ import annotations

from collections.abc import Sequence

from reflectrl.envs.base import TextObservation

ANALYZE_MARKER = " # Analyze:\n"
ACTION_MARKER = " # Action:\n"
MENU_HEADER = "\nValid actions:\n"


def reflection_prompt(obs: TextObservation) -> str:
    return f"{obs.instruction}\n{obs.observation}{ANALYZE_MARKER}"


def render_menu(actions: Sequence[str], labels: Sequence[str], order: Sequence[int]) -> str:
    """Menu line i shows label i and action `actions[order[i]]`."""
    if len(order) != len(actions):
        raise ValueError(f"order has {len(order)} entries for {len(actions)} actions")
    if len(actions) > len(labels):
        raise ValueError(f"{len(actions)} actions but only {len(labels)} labels")
    return "\n".join(f"{labels[i]}. {actions[j]}" for i, j in enumerate(order))


def policy_prompt(
    obs: TextObservation, reflection: str, labels: Sequence[str], order: Sequence[int]
) -> str:
    menu = render_menu(obs.actions, labels, order)
    return f"{reflection_prompt(obs)}{reflection.strip()}{MENU_HEADER}{menu}{ACTION_MARKER}"


def no_reflection_prompt(obs: TextObservation, labels: Sequence[str], order: Sequence[int]) -> str:
    menu = render_menu(obs.actions, labels, order)
    return f"{obs.instruction}\n{obs.observation}{MENU_HEADER}{menu}{ACTION_MARKER}"


def prompt_head(obs: TextObservation) -> str:
    """The part of every prompt that truncation must keep (the task header)."""
    return f"{obs.instruction}\n"
