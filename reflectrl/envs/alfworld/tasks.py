"""The six ALFWorld task types, their short aliases, and parsing of user-given lists.

Kept free of alfworld/textworld imports: option validation (config loading) needs it, and that
must stay fast and must not require the engine.
"""

from __future__ import annotations

from collections.abc import Iterable

from reflectrl.errors import ConfigError

# In ALFWorld's own order (its config's task ids 1..6), which is also a sensible curriculum order:
# plain pick-and-place first, the two-object task last.
TASK_TYPES: tuple[str, ...] = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)

# The env's default menu cap (the policy's K); the generator keeps only games whose walkthrough
# stays within it, and the check command checks the same.
DEFAULT_MAX_ACTIONS = 60

ALIASES: dict[str, str] = {
    "pick": "pick_and_place_simple",
    "look": "look_at_obj_in_light",
    "clean": "pick_clean_then_place_in_recep",
    "heat": "pick_heat_then_place_in_recep",
    "cool": "pick_cool_then_place_in_recep",
    "two": "pick_two_obj_and_place",
}


def canonical_task_type(name: str) -> str:
    """`pick` or `pick_and_place_simple` -> `pick_and_place_simple`; anything else is an error."""
    key = name.strip()
    if key in TASK_TYPES:
        return key
    if key in ALIASES:
        return ALIASES[key]
    valid = ", ".join(f"{alias} ({full})" for alias, full in ALIASES.items())
    raise ConfigError(f"unknown ALFWorld task type {name!r}; valid: {valid}")


def parse_task_types(names: Iterable[str] | str) -> tuple[str, ...]:
    """A comma-separated string or a list -> canonical names, deduplicated, in ALFWorld's order."""
    items = names.split(",") if isinstance(names, str) else list(names)
    chosen = {canonical_task_type(n) for n in items if n.strip()}
    if not chosen:
        raise ConfigError("no ALFWorld task type given; valid: " + ", ".join(ALIASES))
    return tuple(t for t in TASK_TYPES if t in chosen)


def task_type_of_folder(name: str) -> str | None:
    """ALFWorld game folders are named `<task_type>-<Object>-<MRecep>-<Recep>-<scene>`."""
    prefix = name.split("-", 1)[0]
    return prefix if prefix in TASK_TYPES else None
