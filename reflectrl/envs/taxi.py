"""DangerousTaxi: gymnasium's Taxi as a text env, where any no-op action ends the episode.

Curriculum stages: `pickup` (done once the passenger is aboard), `dropoff` (starts with the
passenger aboard) and `full` (the ordinary game). `expert_action` is a shortest-path expert
for tests and SFT data.

Splits: the 300 start states (taxi cell, passenger spot, destination; passenger not at the
destination) are split once, seeded by `split_seed`, into `train` (1 - `test_fraction`) and
`test`; an env draws its starts from its `split` only (`all`: gymnasium's own draw). SFT data
and RL use `train`, held-out evaluation `test`. The state space is tiny: expert routes from
train starts pass through most states test episodes visit (METHOD.md), so `test` measures
unseen starts, not unseen states.

Ends: a dangerous no-op, the pick-up (stage `pickup`) and the delivery are `terminated`. The
step limit (`max_steps`) is `truncated`: the observation does not show the steps taken, so the
limit is outside the state the agent sees and GAE bootstraps from the last state's value.
"""

from __future__ import annotations

import operator
from collections import deque
from typing import Any, ClassVar, Literal

import numpy as np
from gymnasium import spaces
from gymnasium.envs.toy_text.taxi import MAP, TaxiEnv
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from reflectrl.envs.base import StepInfo, TextEnv, TextObservation
from reflectrl.envs.registry import EnvSpec, register_env

# Canonical action texts, in gymnasium's action-id order (0 south ... 5 drop-off).
ACTIONS: tuple[str, ...] = (
    "go south",
    "go north",
    "go east",
    "go west",
    "pick up passenger",
    "drop off passenger",
)
PICKUP, DROPOFF = 4, 5
IN_TAXI = 4  # gymnasium's passenger index meaning "inside the taxi"

_RULES = (
    "The map legend: T taxi, X taxi with the passenger, P passenger, D destination, | wall; "
    "north is up. Hitting a wall or an illegal pick-up/drop-off ends the game."
)
_INSTRUCTIONS: dict[str, str] = {
    "pickup": "You drive a taxi on a 5x5 grid. Drive to the passenger and pick them up. " + _RULES,
    "dropoff": "You drive a taxi on a 5x5 grid. Take the passenger to the destination and drop "
    "them off. " + _RULES,
}
_INSTRUCTIONS["full"] = _INSTRUCTIONS["dropoff"]


class TaxiOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_steps: int = Field(default=30, gt=0)
    reward_scale: float = Field(default=1 / 20, gt=0)
    danger_penalty: float = -10.0
    pickup_bonus: float = 20.0
    # Every reset uses this seed: one fixed start state, for small deterministic learning tests.
    fixed_start_seed: int | None = Field(default=None, ge=0)
    split: Literal["train", "test", "all"] = "train"
    test_fraction: float = Field(default=0.2, gt=0, lt=1)
    split_seed: int = 0
    # Draw starts from these only (gymnasium's encoded states, each in `split`): a handful of
    # fixed starts for small learning tests. None: the whole split.
    starts: list[int] | None = Field(default=None, min_length=1)
    # Name the taxi's, the passenger's and the destination's cells (row, column) in the
    # status line below the grid. The grid shows the same facts, but a byte-level BPE merges
    # its runs of `.`, `|` and blanks differently around each letter, so where a letter sits
    # in the token sequence varies; a small model reads the named cells far more easily
    # (diagnostics/grid_reading.py).
    coordinates: bool = False

    @field_validator("starts")
    @classmethod
    def _starts_in_split(cls, starts: list[int] | None, info: ValidationInfo) -> list[int] | None:
        if starts is not None and {"split", "test_fraction", "split_seed"} <= info.data.keys():
            split = info.data["split"]
            allowed = set(start_states(split, info.data["test_fraction"], info.data["split_seed"]))
            outside = [s for s in starts if s not in allowed]
            if outside:
                raise ValueError(
                    f"{outside[0]} is not a start state of the {split!r} split (a taxi cell, a "
                    "passenger spot and another destination, as gymnasium's TaxiEnv.encode "
                    "numbers them); list starts of that split"
                )
        return starts


class DangerousTaxiEnv(TextEnv):
    stages: ClassVar[tuple[str, ...]] = ("pickup", "dropoff", "full")
    max_actions = len(ACTIONS)

    def __init__(self, options: TaxiOptions | None = None) -> None:
        super().__init__()
        self.options = options or TaxiOptions()
        # The dry, non-fickle game: every (state, action) has exactly one outcome.
        self.taxi = TaxiEnv()
        self.action_space = spaces.Discrete(len(ACTIONS))
        self._steps = 0
        self._done = True  # no episode until the first reset

    def decoded_state(self) -> tuple[int, int, int, int]:
        """(taxi row, taxi col, passenger index (4 = in the taxi), destination index)."""
        row, col, passenger, destination = self.taxi.decode(self.taxi.s)
        return int(row), int(col), int(passenger), int(destination)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[TextObservation, dict[str, Any]]:
        if self.options.fixed_start_seed is not None:
            seed = self.options.fixed_start_seed
        super().reset(seed=seed)
        self.taxi.reset(seed=seed)
        start = (options or {}).get("start")
        if start is not None:
            if int(start) not in self._split_starts():
                raise ValueError(f"start {start!r} is not in the {self.options.split!r} split")
            self.taxi.s = int(start)
        elif self.options.fixed_start_seed is None and self.options.split != "all":
            starts = self._split_starts()
            self.taxi.s = starts[int(self.taxi.np_random.integers(len(starts)))]
        self._begin_episode()
        if self._episode_stage == "dropoff":
            self._board_passenger(keep_cell=start is not None)
        self._steps = 0
        self._done = False
        return self._observation(), self._info(success=False, danger=False)

    def step(self, action: int) -> tuple[TextObservation, float, bool, bool, dict[str, Any]]:
        if self._done:
            raise RuntimeError("step() called on a finished episode; call reset() first")
        action = operator.index(action)  # accepts numpy and torch integer scalars too
        if not 0 <= action < len(ACTIONS):
            raise ValueError(f"action index {action} out of range 0..{len(ACTIONS) - 1}")
        state = int(self.taxi.s)
        # Read the deterministic table instead of calling TaxiEnv.step: its categorical
        # sample draws from np_random, which would make later unseeded starts depend on how
        # many steps earlier episodes took.
        ((_, next_state, reward, delivered),) = self.taxi.P[state][action]
        self.taxi.s = next_state
        self.taxi.lastaction = action
        self._steps += 1

        # Compare states on every step, the first one included (the authors' check missed it).
        danger = next_state == state
        picked_up = self.decoded_state()[2] == IN_TAXI and action == PICKUP
        if danger:
            reward, terminated, success = self.options.danger_penalty, True, False
        elif self._episode_stage == "pickup" and picked_up:
            # Replaces the step cost, as gymnasium's +20 delivery reward does.
            reward, terminated, success = self.options.pickup_bonus, True, True
        else:
            terminated = success = bool(delivered)
        truncated = not terminated and self._steps >= self.options.max_steps
        self._done = terminated or truncated
        info = self._info(success=success, danger=danger)
        return (
            self._observation(),
            float(reward) * self.options.reward_scale,
            terminated,
            truncated,
            info,
        )

    def _split_starts(self) -> tuple[int, ...]:
        o = self.options
        if o.starts is not None:
            return tuple(o.starts)
        return start_states(o.split, o.test_fraction, o.split_seed)

    def start_ids(self, stage: str) -> list[str] | None:
        """The split's start states (in `dropoff` each with the passenger put aboard)."""
        if self.options.fixed_start_seed is not None:
            return None
        return [str(s) for s in self._split_starts()]

    def _episode_random(self) -> np.random.Generator:
        return self.taxi.np_random  # seeded by reset; starts come from it too

    def _random_owners(self) -> list[Any]:
        # Start states come from the inner TaxiEnv's stream (and the drop-off cell too).
        return [self, self.taxi]

    def _board_passenger(self, keep_cell: bool = False) -> None:
        # Keep the seeded destination; move the taxi to a uniformly drawn cell other than the
        # destination (so no episode is solved by one drop-off) and put the passenger aboard.
        # A listed start (`keep_cell`) keeps its taxi cell unless that is the destination.
        row, col, _, destination = self.decoded_state()
        cells = [
            (r, c) for r in range(5) for c in range(5) if (r, c) != self.taxi.locs[destination]
        ]
        if not (keep_cell and (row, col) in cells):
            row, col = cells[int(self.taxi.np_random.integers(len(cells)))]
        self.taxi.s = self.taxi.encode(row, col, IN_TAXI, destination)

    def _observation(self) -> TextObservation:
        return TextObservation(
            instruction=_INSTRUCTIONS[self._episode_stage],
            observation=render_text(
                *self.decoded_state(), locs=self.taxi.locs, coordinates=self.options.coordinates
            ),
            actions=ACTIONS,
        )

    def _info(self, *, success: bool, danger: bool) -> dict[str, Any]:
        extra = {"stage": self._episode_stage, "danger": danger}
        return StepInfo(success=success, valid_actions=ACTIONS, extra=extra).as_dict()


def start_states(split: str, test_fraction: float, seed: int) -> tuple[int, ...]:
    """The encoded start states of a split (`train`, `test` or `all`), in a fixed order."""
    key = (split, test_fraction, seed)
    if key not in _SPLITS:
        every = [int(s) for s in np.flatnonzero(TaxiEnv().initial_state_distrib)]
        order = np.random.default_rng(seed).permutation(len(every))
        n_test = round(len(every) * test_fraction)
        test = sorted(every[i] for i in order[:n_test])
        train = sorted(every[i] for i in order[n_test:])
        _SPLITS[key] = tuple({"train": train, "test": test, "all": every}[split])
    return _SPLITS[key]


_SPLITS: dict[tuple[str, float, int], tuple[int, ...]] = {}


def render_text(
    row: int,
    col: int,
    passenger: int,
    destination: int,
    *,
    locs: list[tuple[int, int]],
    coordinates: bool = False,
) -> str:
    """The grid (cells `.`, walls `|`, open sides blank) and one status line (which also names
    each piece's cell with `coordinates`)."""
    grid = [list(line) for line in MAP]
    for line in grid[1:-1]:
        for j in range(1, len(line) - 1):
            if j % 2 == 1:
                line[j] = "."  # a cell; drops gymnasium's R/G/Y/B landmark names
            elif line[j] == ":":
                line[j] = " "

    def put(cell: tuple[int, int], letter: str) -> None:
        grid[1 + cell[0]][2 * cell[1] + 1] = letter

    if passenger == destination:  # only after a delivery (gymnasium never starts there)
        put((row, col), "T")
        return "\n".join("".join(line) for line in grid) + "\nThe passenger has been delivered."
    cells = ""
    if coordinates:  # the grid's letters, each with its (row, column)
        if passenger == IN_TAXI:
            pieces = [f"X {row},{col}"]
        else:
            pieces = [f"T {row},{col}", "P {},{}".format(*locs[passenger])]
        pieces.append("D {},{}".format(*locs[destination]))
        cells = "\nCells (row, column): " + "; ".join(pieces) + "."
    put(locs[destination], "D")
    if passenger == IN_TAXI:
        put((row, col), "X")
        status = "The passenger is in the taxi (X) and wants to go to D."
    else:
        put(locs[passenger], "P")
        put((row, col), "T")  # drawn last: the taxi hides a P or D below it
        status = "The passenger is at P and wants to go to D."
        if (row, col) == locs[passenger]:
            status += " The taxi is at the passenger's cell."
    if (row, col) == locs[destination]:
        status += " The taxi is at the destination."
    return "\n".join("".join(line) for line in grid) + "\n" + status + cells


# Distance (in actions) from each state to the goal, per goal kind; the transition table is
# the same for every dry TaxiEnv (fixed map), so one table per goal serves all envs.
_DISTANCES: dict[str, dict[int, int]] = {}


def _goal_kind(stage: str) -> str:
    return "pickup" if stage == "pickup" else "deliver"


def _is_goal(taxi: TaxiEnv, state: int, action: int, goal: str) -> bool:
    ((_, next_state, _, delivered),) = taxi.P[state][action]
    if goal == "pickup":
        return action == PICKUP and next_state != state
    return bool(delivered)


def _distances(taxi: TaxiEnv, goal: str) -> dict[int, int]:
    if goal in _DISTANCES:
        return _DISTANCES[goal]
    # Backward BFS: states with a goal action are at distance 1; no-op edges are excluded
    # (they would end the episode) and goal edges are not expanded (the episode ends there).
    predecessors: dict[int, list[int]] = {s: [] for s in taxi.P}
    dist: dict[int, int] = {}
    for state, by_action in taxi.P.items():
        for action, ((_, next_state, _, _),) in by_action.items():
            if _is_goal(taxi, state, action, goal):
                dist[state] = 1
            elif next_state != state:
                predecessors[next_state].append(state)
    queue = deque(dist)
    while queue:
        state = queue.popleft()
        for prev in predecessors[state]:
            if prev not in dist:
                dist[prev] = dist[state] + 1
                queue.append(prev)
    _DISTANCES[goal] = dist
    return dist


def actions_to_success(env: DangerousTaxiEnv, state: int | None = None) -> int:
    """Fewest actions from `state` (default: the current one) to success in the episode's stage."""
    dist = _distances(env.taxi, _goal_kind(env.episode_stage))
    return dist.get(int(env.taxi.s if state is None else state), 10**6)


def expert_action(env: DangerousTaxiEnv) -> int:
    """An action on a shortest path to success in the running episode's stage; never a no-op."""
    taxi = env.taxi
    state = int(taxi.s)
    goal = _goal_kind(env.episode_stage)
    dist = _distances(taxi, goal)
    best, best_cost = -1, float("inf")
    for action in range(len(ACTIONS)):  # ties go to the lowest action id: deterministic
        ((_, next_state, _, _),) = taxi.P[state][action]
        if next_state == state:
            continue
        if _is_goal(taxi, state, action, goal):
            cost: float = 1
        else:
            cost = 1 + dist.get(next_state, float("inf"))
        if cost < best_cost:
            best, best_cost = action, cost
    if best < 0:
        raise RuntimeError(f"no path to the {goal} goal from state {env.decoded_state()}")
    return best


register_env(
    EnvSpec(name="dangerous_taxi", options_model=TaxiOptions, factory=lambda o: DangerousTaxiEnv(o))
)
