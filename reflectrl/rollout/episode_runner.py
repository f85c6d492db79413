"""The rollout worker (RLlib's `SingleAgentEnvRunner`), sampling whole episodes without
favouring short ones.

With `batch_mode=complete_episodes`, RLlib 2.60's runner resets every env at each `sample()`,
steps until `num_envs` episodes have ended, returns those and drops the ones still running.
Which episodes come back then depends on their own length: the first 16 to end are mostly the
short ones. On the limited-data Taxi regime the learner got 40-68% of the env steps sampled,
in episodes of 2.9 steps on average in `pickup` (8.1 when every held-out start is played
once), so long successful episodes rarely reached the loss.

Here a `sample()` (with `complete_episodes` and no explicit count) resets every env, keeps
every episode that begins within the first `rollout_fragment_length` steps of its env, and
plays each of those to its end. Whether an episode is kept is decided before its
own length is known (it depends only on the episodes before it), so the kept set is not
length-biased. Episodes that begin later are dropped when the call ends, as before, and the
next call resets every env again: nothing is in flight between calls (exact resume holds).
The vector env leaves the episodes that begin after the cut out of its episode records, so
the curriculum's success rate is taken over the same episodes.
"""

from __future__ import annotations

from typing import Any

from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner


class WholeEpisodeEnvRunner(SingleAgentEnvRunner):
    def sample(
        self,
        *,
        num_timesteps: int | None = None,
        num_episodes: int | None = None,
        explore: bool | None = None,
        random_actions: bool = False,
        force_reset: bool = False,
        **kwargs: Any,
    ) -> list[Any]:
        whole = self.config.batch_mode == "complete_episodes"
        if not whole or num_timesteps is not None or num_episodes is not None:
            return super().sample(
                num_timesteps=num_timesteps,
                num_episodes=num_episodes,
                explore=explore,
                random_actions=random_actions,
                force_reset=force_reset,
                **kwargs,
            )
        vector_env = self.env.unwrapped
        steps = self.config.get_rollout_fragment_length(self.worker_index) * self.num_envs
        vector_env.recording = True
        first = super().sample(
            num_timesteps=steps, explore=explore, random_actions=random_actions, force_reset=True
        )
        vector_env.recording = False  # episodes that begin from here on are not kept
        done = [e for e in first if e.is_done]
        running: dict[str, Any] = {e.id_: e for e in first if not e.is_done}
        # An env reset in the cut's last step has an episode with no step yet, which RLlib
        # does not return; it began before the cut (the vector env recorded it): keep it too.
        for episode in self._ongoing_episodes:
            if episode.t == 0 and episode.is_reset and episode.id_ not in running:
                running[episode.id_] = None
        try:
            while running:  # one vector step a call, until every kept episode has ended
                for chunk in super().sample(
                    num_timesteps=self.num_envs, explore=explore, random_actions=random_actions
                ):
                    if chunk.id_ not in running:
                        continue  # began after the cut
                    episode = running.pop(chunk.id_)
                    if episode is None:
                        episode = chunk
                    else:
                        episode.concat_episode(chunk)
                    if episode.is_done:
                        done.append(episode)
                    else:
                        running[episode.id_] = episode
        finally:
            vector_env.recording = True
        return done
