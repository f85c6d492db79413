"""Success replay: the last N successful episodes of the current curriculum stage, trained on
again at every update (the authors' RL keeps the last 50 and clears them at every stage switch:
`replay_buffer_size` in zhourunlong/Reflect-RL).

Here the replayed steps get a self-imitation term, not the policy gradient:
    loss += weight * mean over replayed steps of -log pi(a_t | s_t)
It pulls toward what succeeded where the reward alone may not: under the paper's reward a weak
policy gains by ending its episodes at once, and success replay keeps the successes in view.

The buffer lives in the driver, which sees every sampled episode before the learner does. An
episode cut across iterations (`ppo.batch_mode=truncate_episodes`) is joined from its chunks
(RLlib keeps the id). Each update gets copies, named `replay-...`: the learner connector
(rl/advantage_connector.py) keeps them out of the advantages and the PPO loss and marks their
rows for this term (rl/learner.py). Checkpoints save the buffer (`success_replay.pkl`).
"""

from __future__ import annotations

import copy
import pickle
from collections import deque
from pathlib import Path
from typing import Any

from ray.rllib.env.single_agent_episode import SingleAgentEpisode

from reflectrl.atomic_files import atomic_path

REPLAY_PREFIX = "replay-"
REPLAY_COLUMN = "success_replay"  # train batch column: 1 on replayed rows
REPLAY_FILE = "success_replay.pkl"


def is_replay(episode: Any) -> bool:
    return str(episode.id_).startswith(REPLAY_PREFIX)


class SuccessReplay:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.stage: str | None = None
        self.episodes: deque[SingleAgentEpisode] = deque(maxlen=capacity)
        self._open: dict[str, SingleAgentEpisode] = {}  # chunks of episodes still running

    def observe(self, episodes: list[Any], stage: str) -> None:
        """Take this iteration's sampled episodes (before the learner changes them), the
        curriculum being in `stage`. A stage switch clears the buffer."""
        if stage != self.stage:
            self.episodes.clear()
            self.stage = stage
        still_open: dict[str, SingleAgentEpisode] = {}
        for chunk in episodes:
            whole = self._join(chunk)
            if whole is None:
                continue
            if not chunk.is_done:
                still_open[chunk.id_] = whole
            elif _succeeded(whole) and _stage(whole) == stage:
                self.episodes.append(whole)
        self._open = still_open  # an episode's next chunk comes in the next iteration

    def _join(self, chunk: Any) -> SingleAgentEpisode | None:
        """The episode so far, up to this chunk; None when its start was never seen (the run
        began or resumed in the middle of it)."""
        if chunk.t_started == 0:
            return copy.deepcopy(chunk)
        earlier = self._open.get(chunk.id_)
        if earlier is None or earlier.t != chunk.t_started:
            return None
        earlier.concat_episode(copy.deepcopy(chunk))
        return earlier

    def for_update(self) -> list[SingleAgentEpisode]:
        """Copies of the buffered episodes, named as replays (the learner's connectors change
        the episodes they get)."""
        replays = []
        for k, episode in enumerate(self.episodes):
            replay = copy.deepcopy(episode)
            replay.id_ = f"{REPLAY_PREFIX}{k}-{episode.id_}"
            replays.append(replay)
        return replays

    # -- checkpoints ---------------------------------------------------------------------
    def save(self, path: Path) -> None:
        state = {
            "stage": self.stage,
            "episodes": [e.get_state() for e in self.episodes],
            "open": {k: e.get_state() for k, e in self._open.items()},
        }
        with atomic_path(path) as tmp:
            tmp.write_bytes(pickle.dumps(state))

    def load(self, path: Path) -> None:
        # Our own checkpoint file, written by `save` (never a file from elsewhere).
        state = pickle.loads(path.read_bytes())
        self.stage = state["stage"]
        self.episodes = deque(
            (SingleAgentEpisode.from_state(s) for s in state["episodes"]), maxlen=self.capacity
        )
        self._open = {k: SingleAgentEpisode.from_state(s) for k, s in state["open"].items()}


def _succeeded(episode: Any) -> bool:
    return bool(episode.get_infos(-1).get("success", False))


def _stage(episode: Any) -> str | None:
    stage = episode.get_infos(-1).get("stage")
    return None if stage is None else str(stage)
