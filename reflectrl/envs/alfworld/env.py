"""ALFWorld as a text env: the real alfworld engine over generated or official games.

Observation: the room description from the game's start, then the last few (command, engine
text) pairs; the task goes in `TextObservation.instruction`; the menu is the engine's admissible
commands (capped at `max_actions` by `engine.capped_menu`'s documented rule). Reward 1 when the
engine says the game is won; the episode is cut after `max_steps` commands.

Curriculum stages are chosen by `curriculum`: `task_type` (one stage per task type present, then
`all`) or `walkthrough_length` (`walkthrough_le_N`: games whose walkthrough has at most N
commands, then `all`). The game data directory is only read; the engine is created at the first
reset and serves every later game of this env.

Ends: a won game is `terminated`. The step limit is `truncated`: the observation counts the
actions taken but never shows the limit, so the cut is outside the state the agent sees and
GAE bootstraps from the last state's value (a hidden time limit, as in ALFWorld's own setup).

Prompt budget: `shorter_observation(level)` shows fewer (command, feedback) pairs and then cuts
long feedback; the room description and the task are never cut.
"""

from __future__ import annotations

import operator
from pathlib import Path
from typing import Any, ClassVar, Literal

import gymnasium as gym
from gymnasium import spaces
from pydantic import BaseModel, ConfigDict, Field, field_validator

from reflectrl.envs.alfworld.engine import Engine, capped_menu, split_intro
from reflectrl.envs.alfworld.explorer import Sight
from reflectrl.envs.alfworld.games import (
    GameDataError,
    GameEntry,
    read_game,
    resolve_data_root,
    scan_games,
)
from reflectrl.envs.alfworld.tasks import DEFAULT_MAX_ACTIONS, TASK_TYPES, parse_task_types
from reflectrl.envs.base import StepInfo, TextEnv, TextObservation
from reflectrl.envs.registry import EnvSpec, register_env
from reflectrl.errors import ConfigError

ALL = "all"
FEEDBACK_CHARS = (300, 120)  # the last trimming levels cut each feedback text to these lengths


class AlfWorldOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Folder with train/valid_seen/valid_unseen (from `reflectrl alfworld-gen`), or the official
    # data ($ALFWORLD_DATA or its json_2.1.1). None: use $ALFWORLD_DATA.
    data_dir: str | None = None
    split: Literal["train", "valid_seen", "valid_unseen", "valid"] = "train"
    task_types: list[str] = Field(default_factory=lambda: list(TASK_TYPES))  # names or aliases
    # Keep only games whose folder name contains one of these, e.g. the paper's
    # "pick_and_place_simple-Tomato-None-Microwave". Empty: no filter.
    families: list[str] = Field(default_factory=list)
    max_steps: int = Field(50, gt=0)  # commands per episode (ALFWorld's usual budget)
    max_actions: int = Field(DEFAULT_MAX_ACTIONS, ge=2)  # menu cap, the policy's K (labels)
    history: int = Field(4, ge=1)  # (command, engine text) pairs shown, most recent last
    # Also show what the whole episode has shown (`Sight.summary`: where things were seen,
    # what is open, held, searched): the observable expert decides from all of it, and
    # without it the last `history` pairs alone hide some of its reasons.
    memory: bool = False
    # When data_dir does not exist yet, generate this many games there first (as
    # `reflectrl alfworld-gen --n N --seed generate_seed` does); 0: never.
    generate_games: int = Field(0, ge=0)
    generate_seed: int = 0
    curriculum: Literal["task_type", "walkthrough_length"] = "task_type"
    length_stages: list[int] = Field(default_factory=lambda: [6, 10])

    @field_validator("data_dir")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        # Absolute once, where the config is read: rollout workers may run in another folder.
        return str(Path(value).expanduser().absolute()) if value else value

    @field_validator("task_types")
    @classmethod
    def _task_types(cls, value: list[str]) -> list[str]:
        try:
            return list(parse_task_types(value))
        except ConfigError as err:
            raise ValueError(str(err)) from None

    @field_validator("length_stages")
    @classmethod
    def _lengths(cls, value: list[int]) -> list[int]:
        if any(v < 1 for v in value) or sorted(set(value)) != value:
            raise ValueError("length_stages must be increasing positive walkthrough lengths")
        return value


class AlfWorldEnv(TextEnv):
    # The class-level default (curriculum `task_type`, all six types); each instance narrows it
    # to the stages its games can fill (the coordinator reads the instance's).
    stages: ClassVar[tuple[str, ...]] = (*TASK_TYPES, ALL)
    held_out_split: ClassVar[str] = "valid_unseen"  # unseen floor plans

    def __init__(self, options: AlfWorldOptions | None = None) -> None:
        self.options = options or AlfWorldOptions()
        self.max_actions = self.options.max_actions
        if self.options.generate_games and self.options.data_dir:
            from reflectrl.envs.alfworld.generator import ensure_games

            opts = self.options
            ensure_games(Path(opts.data_dir), opts.generate_games, opts.generate_seed)
        self.root = resolve_data_root(self.options.data_dir)
        self.games: tuple[GameEntry, ...] = tuple(
            self._select(scan_games(self.root, self.options.split))
        )
        self._stage_games = self._build_stages()
        self.stages = tuple(self._stage_games)  # type: ignore[misc]
        super().__init__()
        self.action_space = spaces.Discrete(self.max_actions)
        self._engine: Engine | None = None
        self.game: GameEntry | None = None
        self.walkthrough: tuple[str, ...] | None = None
        self.walkthrough_progress = 0  # walkthrough commands played in order so far
        self.task = ""
        self._description = ""
        self._history: list[tuple[str, str]] = []
        self.admissible: tuple[str, ...] = ()  # the engine's commands now, before the cap
        self.menu: tuple[str, ...] = ()
        self._steps = 0
        self._done = True

    def _select(self, entries: list[GameEntry]) -> list[GameEntry]:
        wanted = set(self.options.task_types)
        families = self.options.families
        chosen = [
            g
            for g in entries
            if g.task_type in wanted and (not families or any(f in g.family for f in families))
        ]
        if not chosen:
            raise GameDataError(
                f"{self.root}: no games of task types {', '.join(sorted(wanted))}"
                + (f" and families {', '.join(families)}" if families else "")
                + f" in split {self.options.split!r}"
            )
        return chosen

    def _build_stages(self) -> dict[str, tuple[GameEntry, ...]]:
        stages: dict[str, tuple[GameEntry, ...]] = {}
        if self.options.curriculum == "task_type":
            for task_type in TASK_TYPES:
                stages[task_type] = tuple(g for g in self.games if g.task_type == task_type)
        else:
            for limit in self.options.length_stages:
                stages[f"walkthrough_le_{limit}"] = tuple(
                    g
                    for g in self.games
                    if g.walkthrough_length is not None and g.walkthrough_length <= limit
                )
        stages = {name: games for name, games in stages.items() if games}  # no empty stage
        stages[ALL] = self.games
        return stages

    @property
    def episode_kind(self) -> str:
        return self.game.task_type if self.game is not None else ""

    @property
    def description(self) -> str:
        """The room description the game starts with (every observation shows it)."""
        return self._description

    @property
    def history(self) -> tuple[tuple[str, str], ...]:
        """Every (command, engine text) pair of the episode so far, oldest first."""
        return tuple(self._history)

    @property
    def last_feedback(self) -> str:
        """The engine's answer to the last command ("" before the first)."""
        return self._history[-1][1] if self._history else ""

    def start_ids(self, stage: str) -> list[str] | None:
        """Indices (into `self.games`) of the stage's games."""
        pool = set(self._stage_games[stage])
        return [str(i) for i, game in enumerate(self.games) if game in pool]

    def stage_games(self, stage: str | None = None) -> tuple[GameEntry, ...]:
        return self._stage_games[stage or self._stage]

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[TextObservation, dict[str, Any]]:
        """`options={"game": i}` plays `self.games[i]` (or a game file path); else a game of the
        stage, drawn with the env's seeded generator."""
        gym.Env.reset(self, seed=seed)  # seeds self.np_random (TextEnv.reset is abstract)
        self._begin_episode()
        options = options or {}
        start = options.get("start")
        self.game = self._choose_game(options.get("game") if start is None else int(start))
        data = read_game(self.game.path)
        if self._engine is None:
            self._engine = Engine()
        self._engine.load(data, name=str(self.game.path))
        state = self._engine.reset()
        walkthrough = data.get("walkthrough")
        self.walkthrough = tuple(walkthrough) if walkthrough is not None else None
        self.walkthrough_progress = 0
        self._description, self.task = split_intro(state.feedback)
        self._history = []
        self._steps = 0
        self._done = False
        self._update_menu(state.admissible)
        return self._observation(), self._info(success=False)

    def step(self, action: int) -> tuple[TextObservation, float, bool, bool, dict[str, Any]]:
        if self._done or self._engine is None:
            raise RuntimeError("step() called on a finished episode; call reset() first")
        action = operator.index(action)
        if not 0 <= action < len(self.menu):
            raise ValueError(f"action index {action} out of range 0..{len(self.menu) - 1}")
        command = self.menu[action]
        state = self._engine.step(command)
        self._steps += 1
        walkthrough = self.walkthrough or ()
        k = self.walkthrough_progress
        if k < len(walkthrough) and command == walkthrough[k]:
            self.walkthrough_progress += 1
        self._history.append((command, state.feedback.strip()))
        self._update_menu(state.admissible)
        terminated = state.won
        truncated = not terminated and self._steps >= self.options.max_steps
        self._done = terminated or truncated
        reward = 1.0 if state.won else 0.0
        return self._observation(), reward, terminated, truncated, self._info(success=state.won)

    def close(self) -> None:
        self._engine = None  # the engine holds a planner library copy; let it go
        self._done = True

    def _choose_game(self, choice: Any) -> GameEntry:
        if choice is None:
            pool = self._stage_games[self._episode_stage]
            return pool[int(self.np_random.integers(len(pool)))]
        if not isinstance(choice, str | Path):
            index = operator.index(choice)  # ints, numpy and torch integer scalars
            if not 0 <= index < len(self.games):
                raise ValueError(f"game index {index} out of range 0..{len(self.games) - 1}")
            return self.games[index]
        path = Path(choice)
        for entry in self.games:
            if entry.path == path or entry.path.parent == path:
                return entry
        raise GameDataError(f"{path}: not one of this env's games")

    def _update_menu(self, admissible: tuple[str, ...]) -> None:
        self.admissible = admissible
        self.menu = capped_menu(admissible, self.max_actions)

    def shorter_observation(self, level: int) -> TextObservation | None:
        if level < 1:
            raise ValueError("level must be >= 1")
        # Halve the pairs shown down to one, then cut each feedback text shorter.
        halvings = max(0, self.options.history.bit_length() - 1)
        pairs = max(1, self.options.history >> level)
        cuts = max(0, level - halvings)
        if cuts > len(FEEDBACK_CHARS):
            return None
        return self._observation(pairs, FEEDBACK_CHARS[cuts - 1] if cuts else None)

    def _observation(
        self, pairs: int | None = None, feedback_chars: int | None = None
    ) -> TextObservation:
        parts = [self._description]
        if self._history and self.options.memory:
            sight = Sight.observe(self.task, self._description, self._history, self.menu)
            parts.append(f"\nWhat you know so far:\n{sight.summary()}")
        if self._history:
            shown = self._history[-(pairs or self.options.history) :]
            hidden = len(self._history) - len(shown)
            more = f", {hidden} earlier not shown" if hidden else ""
            parts.append(
                f"\nYour last actions and what happened ({len(self._history)} so far{more}):"
            )
            parts += [
                f"> {command}\n{_cut(feedback, feedback_chars)}" for command, feedback in shown
            ]
        return TextObservation(
            instruction=f"You are in a household. Your task is to: {self.task}.",
            observation="\n".join(parts),
            actions=self.menu,
        )

    def _info(self, *, success: bool) -> dict[str, Any]:
        game = self.game
        extra = {
            "stage": self._episode_stage,
            "task_type": game.task_type if game else "",
            "game": str(game.path) if game else "",
            "steps": self._steps,
            "admissible_count": len(self.admissible),
            "walkthrough_length": game.walkthrough_length if game else None,
        }
        return StepInfo(success=success, valid_actions=self.menu, extra=extra).as_dict()


def _cut(text: str, limit: int | None) -> str:
    return text if limit is None or len(text) <= limit else text[:limit] + " ..."


CORPUS_GAMES = 24  # training games a scratch tokenizer's corpus plays (~2 s each to make)


def corpus_config(cache: Path) -> dict[str, Any]:
    """A scratch tokenizer's corpus: games generated once into `cache` (seed 0, seen floor
    plans only), with the prompt budgets and the 60 labels of configs/alfworld_cpu.yaml."""
    from reflectrl.envs.alfworld.generator import ensure_games

    games = cache / "alfworld-corpus-games"
    ensure_games(games, CORPUS_GAMES, 0, valid_seen=0.0, valid_unseen=0.0)
    return {
        "env": {"options": {"data_dir": str(games)}, "max_prompt_tokens": 1024},
        "policy": {"labels": "123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"},
        "reflection": {"max_model_len": 2048},
    }


register_env(
    EnvSpec(
        name="alfworld",
        options_model=AlfWorldOptions,
        factory=lambda o: AlfWorldEnv(o),
        corpus_config=corpus_config,
        corpus_episodes=48,  # ~2 s an episode in the engine
    )
)
