"""ALFWorld: the alfworld engine over games generated offline from the package's own layouts
(`reflectrl alfworld-gen`) or over the official data. Importing this package registers the
`alfworld` env; the engine itself (textworld) is only imported at an env's first reset."""

from reflectrl.envs.alfworld.env import AlfWorldEnv, AlfWorldOptions
from reflectrl.envs.alfworld.expert import ExpertError, expert_action, expert_command
from reflectrl.envs.alfworld.games import GameDataError, GameEntry
from reflectrl.envs.alfworld.tasks import TASK_TYPES

__all__ = [
    "TASK_TYPES",
    "AlfWorldEnv",
    "AlfWorldOptions",
    "ExpertError",
    "GameDataError",
    "GameEntry",
    "expert_action",
    "expert_command",
]
