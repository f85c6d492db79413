"""The AutoExplore expert: the shortest command path to the target, and negative examples.

The expert knows the target (privileged information). From any state its plan is: `cd ..`
up to the deepest common directory, `cd` down to the target's directory, `cat` the target
(unless read already), `id` it. Every command of a plan is on the menu when its turn comes:
the target's path is never dropped from the view, and tasks are generated only for targets
reachable under the menu cap.

`negative_plan` is a trajectory with one mistake and its recovery, for SFT data (METHOD.md,
"Negative example generation"): read a wrong file in the target's directory, or, where the
target is alone there, step into a wrong directory on the way and come back out.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from reflectrl.envs.auto_explore.env import AutoExploreEnv
from reflectrl.envs.auto_explore.shell import RelPath, path_text


@dataclass(frozen=True)
class PlanStep:
    command: str
    mistake: bool = False  # the perturbed step; SFT labels use the expert's step instead
    note: str = ""  # what a reflection should say about this step


def expert_plan(env: AutoExploreEnv) -> list[str]:
    """The shortest list of commands from the current state to a successful `id`."""
    return _route(env.shell.cwd, env.task.parts, env.shell.read)


def expert_action(env: AutoExploreEnv) -> int:
    """Index in `env.actions` of the expert's next command."""
    command = expert_plan(env)[0]
    try:
        return env.actions.index(command)
    except ValueError:
        raise RuntimeError(f"expert command {command!r} is not on the menu") from None


def run_expert_episode(env: AutoExploreEnv, task_id: str) -> tuple[dict, bool]:
    """Play task `task_id` with the expert to the end: (last info, terminated)."""
    env.reset(options={"task_id": task_id})
    terminated, truncated, info = False, False, {}
    while not (terminated or truncated):
        _, _, terminated, truncated, info = env.step(expert_action(env))
    return info, terminated


def _route(cwd: RelPath, target: RelPath, read: set[RelPath]) -> list[str]:
    directory = target[:-1]
    common = 0
    while common < min(len(cwd), len(directory)) and cwd[common] == directory[common]:
        common += 1
    commands = ["cd .."] * (len(cwd) - common)
    commands += [f"cd {name}" for name in directory[common:]]
    if target not in read:
        commands.append(f"cat {target[-1]}")
    commands.append(f"id {target[-1]}")
    return commands


def negative_plan(env: AutoExploreEnv, rng: random.Random) -> list[PlanStep] | None:
    """A plan from the current state with one mistake and the recovery; None if no mistake
    is possible (a target alone on a path with no side directories)."""
    target = env.task.parts
    shell, view = env.shell, env.shell.view
    directory = target[:-1]
    listing = view.listing(directory)
    wrong_files = [
        e.name
        for e in (listing.entries if listing else ())
        if not e.is_dir and e.name != target[-1] and (*directory, e.name) not in shell.read
    ]
    if wrong_files:
        wrong = rng.choice(wrong_files)
        steps = [PlanStep(c) for c in _route(shell.cwd, target, shell.read)]
        # Insert the wrong read right after arriving in the target's directory.
        at = next(i for i, s in enumerate(steps) if s.command.startswith(("cat ", "id ")))
        note = (
            f"{wrong} does not answer the question; {target[-1]} in this directory may, "
            "so read it next."
        )
        steps.insert(at, PlanStep(f"cat {wrong}", mistake=True, note=note))
        return steps
    # Wrong directory: from the current directory or one on the way down, enter a side
    # directory, then come back out and go on.
    route = _route(shell.cwd, target, shell.read)
    cwd = shell.cwd
    for i, command in enumerate(route):
        if cwd == directory[: len(cwd)]:  # on the way down (not still climbing up)
            here = view.listing(cwd)
            sides = [
                e.name
                for e in (here.entries if here else ())
                if e.is_dir and (*cwd, e.name) != directory[: len(cwd) + 1]
            ]
            if sides:
                side = rng.choice(sides)
                note = (
                    f"{path_text((*cwd, side))} is not on the way to the answer; go back to "
                    f"{path_text(cwd)}."
                )
                detour = [
                    PlanStep(f"cd {side}", mistake=True, note=note),
                    PlanStep("cd .."),
                ]
                return [PlanStep(c) for c in route[:i]] + detour + [PlanStep(c) for c in route[i:]]
        cwd = cwd[:-1] if command == "cd .." else (*cwd, command[3:])
        if not command.startswith("cd "):
            break
    return None
