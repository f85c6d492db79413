"""AutoExplore: answer a question about a code repository by exploring it in a sandbox.

Modules: `sandbox` (the read-only, symlink-proof view of a root), `render` (what `cat` shows),
`shell` (the command interpreter, `Shell.run_command`), `tasks` (JSONL tasks and their
generator), `env` (the text env), `expert` (shortest-path and negative-example plans),
`writer` (optional LLM-written questions), `commands` (CLI). Importing this package registers
the env as `auto_explore`.
"""

from reflectrl.envs.auto_explore.env import AutoExploreEnv, AutoExploreOptions
from reflectrl.envs.auto_explore.expert import PlanStep, expert_action, expert_plan, negative_plan
from reflectrl.envs.auto_explore.sandbox import Sandbox, resolve_root
from reflectrl.envs.auto_explore.shell import CommandResult, Shell, View
from reflectrl.envs.auto_explore.tasks import (
    DEFAULT_ROOTS,
    GenerationSettings,
    Task,
    generate_tasks,
    load_tasks,
    write_tasks,
)

__all__ = [
    "DEFAULT_ROOTS",
    "AutoExploreEnv",
    "AutoExploreOptions",
    "CommandResult",
    "GenerationSettings",
    "PlanStep",
    "Sandbox",
    "Shell",
    "Task",
    "View",
    "expert_action",
    "expert_plan",
    "generate_tasks",
    "load_tasks",
    "negative_plan",
    "resolve_root",
    "write_tasks",
]
