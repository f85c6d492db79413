"""AutoExplore as a text env: answer a question about a code repository by exploring it.

Each episode plays one task (seeded choice among the tasks of the split and the curriculum
stage) in a sandbox of the task's root. The menu holds `cd ..` (not at the root),
`cd <dir>`, `cat <file>` (files not read yet) and `id <file>`; `step_text` accepts typed
commands instead (invalid ones are error observations that cost `error_penalty`).

Rewards (then times `reward_scale`): `-step_penalty` per step, another `-error_penalty` for
an error or warning (a file that cannot be shown, re-entering a visited directory, reading a
file again, an invalid typed command; the published code's cost here was always zero), and
at the end +horizon for identifying the target, -horizon for running out of steps, and for a
wrong `id` -horizon minus the step costs of the steps it leaves unused (horizon =
`terminal_reward`, by default `max_steps`). So answering at once never costs less than
exploring to the limit: with the flat -horizon (`wrong_id_pays_unused_steps: false`), an agent
that cannot yet find files learns to `id` on its first step, and our first run did (episode
length 11.4 -> 1.2 in ten iterations).

Ends: every end is `terminated`, the step limit included. The observation shows the steps
left, so running out is a terminal the agent can see coming, and it is paid for with the
-horizon penalty; `truncated` would make GAE add gamma * V(s_T) on top of that penalty.

Prompt budget: `shorter_observation(level)` halves the command history and the last output
per level; the current directory and its listing (the current state) are never cut.

`reset(options={"task_id": ...})` plays a given task of the split (the expert check does).

Splits: `train` and `test` (by file, over the training roots) and `unseen` (every file of the
`unseen_roots`, trees training never sees). `episode_kind` is the target's depth (`depth2`),
so held-out reports have a row per depth.

Stages: `depth1` plays targets at the root, `depth2` targets at most one directory down,
`all` every task (depth = the target's path components); a stage with no task of its depths
plays the shallowest tasks there are.
"""

from __future__ import annotations

import hashlib
import operator
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Literal

import gymnasium as gym
from gymnasium import spaces
from pydantic import BaseModel, ConfigDict, Field, field_validator

from reflectrl.envs.auto_explore.render import TRUNCATED
from reflectrl.envs.auto_explore.sandbox import (
    DEFAULT_MAX_READ_BYTES,
    DEFAULT_SUFFIXES,
    Sandbox,
    root_versions,
)
from reflectrl.envs.auto_explore.shell import (
    DEFAULT_MAX_ACTIONS,
    DEFAULT_MAX_OUTPUT_CHARS,
    RelPath,
    Shell,
    View,
    path_text,
)
from reflectrl.envs.auto_explore.tasks import (
    DEFAULT_ROOTS,
    GenerationSettings,
    Task,
    generate_tasks,
    load_tasks,
    root_id,
    unit_hash,
    write_tasks,
)
from reflectrl.envs.base import StepInfo, TextEnv, TextObservation
from reflectrl.envs.registry import EnvSpec, register_env
from reflectrl.errors import ConfigError

MIN_OUTPUT = 100  # characters of the last output that the shortest observation still shows
GUIDE = (
    "Explore the repository with `cd <dir>`, `cd ..` and `cat <file>`, then answer with "
    "`id <file>` on the file that answers the question."
)


class AutoExploreOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tasks: str  # a tasks JSONL (made absolute here: rollout workers may run in another cwd)
    split: Literal["train", "test", "unseen", "all"] = "train"
    # When `tasks` does not exist yet, generate it from these roots (dirs or pkg:NAME) first;
    # every task of `unseen_roots` goes to the `unseen` split.
    roots: list[str] = Field(default_factory=list)
    unseen_roots: list[str] = Field(default_factory=list)
    generate_seed: int = 0
    generate_max_tasks: int | None = Field(default=None, ge=1)
    max_steps: int = Field(default=20, gt=0)
    max_actions: int = Field(default=DEFAULT_MAX_ACTIONS, ge=3)
    drop_prob: float = Field(default=0.0, ge=0.0, lt=1.0)  # training: 0.5 as in the paper
    step_penalty: float = Field(default=1.0, ge=0.0)
    error_penalty: float = Field(default=1.0, ge=0.0)
    terminal_reward: float | None = Field(default=None, ge=0.0)  # None: max_steps
    reward_scale: float = Field(default=0.05, gt=0.0)
    wrong_id_pays_unused_steps: bool = True
    max_read_bytes: int = Field(default=DEFAULT_MAX_READ_BYTES, ge=1)
    max_output_chars: int = Field(default=DEFAULT_MAX_OUTPUT_CHARS, ge=100)
    history_len: int = Field(default=10, ge=0)
    suffixes: tuple[str, ...] = DEFAULT_SUFFIXES

    @field_validator("tasks")
    @classmethod
    def _absolute(cls, tasks: str) -> str:
        if not tasks:
            raise ValueError("set a tasks file (make one with `reflectrl autoexplore-tasks`)")
        return str(Path(tasks).expanduser().absolute())


class AutoExploreEnv(TextEnv):
    stages: ClassVar[tuple[str, ...]] = ("depth1", "depth2", "all")
    held_out_options: ClassVar[dict[str, Any]] = {"drop_prob": 0.0}

    def __init__(self, options: AutoExploreOptions) -> None:
        super().__init__()
        self.options = options
        self.max_actions = options.max_actions
        self.action_space = spaces.Discrete(options.max_actions)
        path = Path(options.tasks)
        if not path.exists() and options.roots:
            settings = GenerationSettings(
                max_actions=options.max_actions,
                max_output_chars=options.max_output_chars,
                max_read_bytes=options.max_read_bytes,
                suffixes=options.suffixes,
            )
            found = generate_tasks(
                options.roots,
                options.generate_seed,
                options.generate_max_tasks,
                settings,
                options.unseen_roots,
            )
            write_tasks(found, path)
        every = load_tasks(path)
        held_out = {t.root for t in every if t.split == "unseen"}
        missing = [r for r in options.unseen_roots if root_id(r) not in held_out]
        if missing:
            raise ConfigError(
                f"tasks file {path} has no unseen tasks of {missing[0]}; delete it to have it "
                "generated again with env.options.unseen_roots"
            )
        self.tasks = [t for t in every if options.split in ("all", t.split)]
        if not self.tasks:
            raise ConfigError(f"tasks file {path} has no {options.split!r} tasks")
        self._sandboxes: dict[str, Sandbox] = {}
        for task in self.tasks:  # a missing target fails here, not in the middle of training
            if not View(self.sandbox(task.root), self.max_actions).reachable(task.parts):
                raise ConfigError(
                    f"tasks {path}: task {task.id}: target {task.target} is not a reachable "
                    f"file under root {task.root} (regenerate the tasks)"
                )
        self._by_id = {t.id: t for t in self.tasks}
        self.task: Task = self.tasks[0]
        self.shell = Shell(View(self.sandbox(self.task.root), self.max_actions))
        self._actions: tuple[str, ...] = ()
        self._steps = 0
        self._done = True  # no episode until the first reset

    # --- public API -----------------------------------------------------------------------

    def sandbox(self, root: str) -> Sandbox:
        if root not in self._sandboxes:
            self._sandboxes[root] = Sandbox(
                root, suffixes=self.options.suffixes, max_read_bytes=self.options.max_read_bytes
            )
        return self._sandboxes[root]

    def start_ids(self, stage: str) -> list[str] | None:
        return [t.id for t in self.stage_tasks(stage)]

    def stage_tasks(self, stage: str) -> list[Task]:
        if stage == "all":
            return self.tasks
        limit = int(stage.removeprefix("depth"))
        chosen = [t for t in self.tasks if t.depth <= limit]
        if not chosen:
            shallowest = min(t.depth for t in self.tasks)
            chosen = [t for t in self.tasks if t.depth == shallowest]
        return chosen

    @property
    def episode_kind(self) -> str:
        return f"depth{self.task.depth}"

    @property
    def actions(self) -> tuple[str, ...]:
        """The menu of the current observation."""
        return self._actions

    @property
    def steps(self) -> int:
        return self._steps

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[TextObservation, dict[str, Any]]:
        gym.Env.reset(self, seed=seed)  # seeds self.np_random (TextEnv.reset is abstract)
        self._begin_episode()
        task_id = (options or {}).get("task_id", (options or {}).get("start"))
        if task_id is not None:
            if task_id not in self._by_id:
                raise ValueError(f"no task {task_id!r} in the {self.options.split!r} split")
            self.task = self._by_id[task_id]
        else:
            pool = self.stage_tasks(self._episode_stage)
            self.task = pool[int(self.np_random.integers(len(pool)))]
        # Drawn on every reset, so the task stream does not depend on drop_prob.
        salt = int(self.np_random.integers(2**62))
        keep = _keep_on_path(self.task.parts, salt, self.options.drop_prob)
        view = View(self.sandbox(self.task.root), self.max_actions, keep)
        self.shell = Shell(view, max_output_chars=self.options.max_output_chars)
        self._steps = 0
        self._done = False
        self._actions = self.shell.menu()
        obs = self._observation()
        return obs, self._info(success=False, status="ok")

    def step(self, action: int) -> tuple[TextObservation, float, bool, bool, dict[str, Any]]:
        self._check_running()
        action = operator.index(action)  # accepts numpy and torch integer scalars too
        if not 0 <= action < len(self._actions):
            raise ValueError(f"action index {action} is not on the menu (0..{len(self._actions)})")
        return self._apply(self._actions[action])

    def step_text(self, command: str) -> tuple[TextObservation, float, bool, bool, dict[str, Any]]:
        """A step with a typed command (anything; invalid ones are error observations)."""
        self._check_running()
        return self._apply(command)

    # --- internals ------------------------------------------------------------------------

    def _check_running(self) -> None:
        if self._done:
            raise RuntimeError("step() called on a finished episode; call reset() first")

    def _apply(self, command: str) -> tuple[TextObservation, float, bool, bool, dict[str, Any]]:
        opts = self.options
        result = self.shell.execute(command)
        self._steps += 1
        horizon = opts.terminal_reward if opts.terminal_reward is not None else opts.max_steps
        reward = -opts.step_penalty
        if result.status != "ok":
            reward -= opts.error_penalty
        identified = result.identified is not None
        success = identified and result.identified == self.task.parts
        out_of_steps = not identified and self._steps >= opts.max_steps
        if success:
            reward += horizon
        elif identified:
            unused = opts.max_steps - self._steps if opts.wrong_id_pays_unused_steps else 0
            reward -= horizon + opts.step_penalty * unused
        elif out_of_steps:
            reward -= horizon
        # A visible step limit is a real terminal (see the module docstring): never truncated.
        terminated = identified or out_of_steps
        self._done = terminated
        self._actions = self.shell.menu()
        obs = self._observation()
        info = self._info(success=success, status=result.status)
        return obs, float(reward) * opts.reward_scale, terminated, False, info

    def shorter_observation(self, level: int) -> TextObservation | None:
        if level < 1:
            raise ValueError("level must be >= 1")

        def budget(k: int) -> tuple[int, int]:
            opts = self.options
            return opts.history_len >> k, max(MIN_OUTPUT, opts.max_output_chars >> k)

        if budget(level) == budget(level - 1):
            return None  # the previous level was already the shortest
        return self._observation(*budget(level))

    def _observation(
        self, history_len: int | None = None, output_chars: int | None = None
    ) -> TextObservation:
        shell = self.shell
        keep = self.options.history_len if history_len is None else history_len
        history = shell.history[-keep:] if keep else []
        earlier = len(shell.history) - len(history)
        shown = (["..."] if earlier else []) + history
        last = shell.last.output if shell.last is not None else "(no command yet)"
        if output_chars is not None and len(last) > output_chars:
            last = last[:output_chars] + TRUNCATED
        left = self.options.max_steps - self._steps
        observation = (
            f"Current directory: {path_text(shell.cwd)}\n"
            f"Contents:\n{shell.listing_text()}\n"
            f"Commands so far: {'; '.join(shown) if shown else '(none)'} "
            f"({left} steps left)\n"
            f"Last output:\n{last}"
        )
        return TextObservation(
            instruction=f"{self.task.question} {GUIDE}",
            observation=observation,
            actions=self._actions,
        )

    def _info(self, *, success: bool, status: str) -> dict[str, Any]:
        extra = {
            "stage": self._episode_stage,
            "task_id": self.task.id,
            "depth": self.task.depth,
            "status": status,
        }
        return StepInfo(success=success, valid_actions=self._actions, extra=extra).as_dict()


def _keep_on_path(target: RelPath, salt: int, drop_prob: float) -> Callable[[RelPath], bool] | None:
    """The episode's drop view: entries on the way to the target always stay."""
    if drop_prob <= 0:
        return None

    def keep(parts: RelPath) -> bool:
        if parts == target[: len(parts)]:
            return True
        return unit_hash(f"{salt}/{'/'.join(parts)}") >= drop_prob

    return keep


def corpus_config(cache: Path) -> dict[str, Any]:
    """A scratch tokenizer's corpus: the default roots' tasks (seed 0), with the prompt budgets
    and the 40 labels of configs/auto_explore.yaml.

    The tasks file is named by the installed versions of the roots' packages: tasks generated
    under another version name files that may be gone, so an upgrade generates them anew.
    """
    versions = hashlib.sha256(root_versions(DEFAULT_ROOTS).encode()).hexdigest()[:12]
    options = {
        "tasks": str(cache / f"auto_explore-corpus-tasks-{versions}.jsonl"),
        "roots": list(DEFAULT_ROOTS),
    }
    return {
        "env": {"options": options, "max_prompt_tokens": 1024},
        "policy": {"labels": "123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"},
        "reflection": {"max_model_len": 2048},
    }


register_env(
    EnvSpec(
        name="auto_explore",
        options_model=AutoExploreOptions,
        factory=lambda o: AutoExploreEnv(o),
        corpus_config=corpus_config,
    )
)
