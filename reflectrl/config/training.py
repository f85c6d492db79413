"""The training stages: ppo, curriculum, run, data, sft, rl and eval sections."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import Field

from reflectrl.config.base import Strict
from reflectrl.errors import ConfigError


class PPOSettings(Strict):
    lr: float = Field(1e-4, gt=0)
    """Learning rate of the PPO update."""
    gamma: float = Field(0.99, ge=0, le=1)
    """Discount factor."""
    lambda_: float = Field(0.95, ge=0, le=1)
    """GAE's lambda."""
    clip_param: float = Field(0.2, gt=0)
    """PPO's clip range of the probability ratio."""
    vf_clip_param: float = Field(100.0, gt=0)
    """RLlib clamps the *squared* value error at this: beyond it the value gradient is 0. Our
    returns stay within a few units (rewards scaled to ~1), so 100 (errors up to 10) never
    freezes the critic; 10 could (an error of 3.2, e.g. V=1.8 for a return of -1.5)."""
    vf_loss_coeff: float = Field(0.5, ge=0)
    """Weight of the value loss in the PPO loss."""
    entropy_coeff: float = Field(0.01, ge=0)
    """Weight of the entropy bonus in the PPO loss."""
    kl_coeff: float = Field(0.0, ge=0)
    """Weight of RLlib's KL loss against the sampling policy; 0: no KL loss."""
    num_epochs: int = Field(2, ge=1)
    """Passes over each iteration's batch in the update."""
    minibatch_size: int = Field(32, ge=1)
    """Rows per minibatch of the update."""
    rollout_fragment_length: int = Field(16, ge=1)
    """Env steps each env takes per sampling round. Short fragments cut almost every episode into
    chunks that GAE bootstraps from an untrained critic."""
    train_batch_size: int | None = Field(None, ge=1)
    """Env steps per iteration. None: workers x env.envs_per_worker x rollout_fragment_length (one
    round); otherwise a multiple of that (RLlib drops what overshoots a round)."""
    batch_mode: Literal["truncate_episodes", "complete_episodes"] = "truncate_episodes"
    """truncate_episodes: each round takes exactly rollout_fragment_length steps per env, cutting
    episodes (GAE bootstraps the cut); complete_episodes: whole episodes only (iterations then
    hold no episode in flight, so a resumed run repeats a straight one exactly)."""
    grad_clip: float = Field(1.0, gt=0)
    """The gradient norm each update step is clipped to."""
    max_staleness: int = Field(0, ge=0, le=1)
    """Policy updates the sampling weights may lag the learner's. 0: sample, then update (on-policy
    PPO, RLlib's own training step). 1: the workers sample the next batch while the learner
    updates on this one, so a batch is one update old when it is learned from (the PPO ratio is
    taken against the log-probs it was sampled with; `staleness` in metrics.jsonl). Deeper
    pipelines are not implemented."""

    def batch_size(self, workers: int, envs_per_worker: int) -> int:
        """Env steps per iteration for this many workers; ConfigError when it cannot work."""
        round_size = workers * envs_per_worker * self.rollout_fragment_length
        if self.train_batch_size is None:
            return round_size
        if self.train_batch_size % round_size:
            raise ConfigError(
                f"ppo.train_batch_size={self.train_batch_size} is not a multiple of one sampling "
                f"round: {workers} workers x env.envs_per_worker={envs_per_worker} x "
                f"ppo.rollout_fragment_length={self.rollout_fragment_length} = {round_size}; "
                "leave ppo.train_batch_size unset or change those keys"
            )
        return self.train_batch_size


class StageConfig(Strict):
    name: str
    """The env's stage (Taxi: pickup, dropoff, full)."""
    success_threshold: float = Field(0.8, ge=0, le=1)
    """The stage's bar: the success rate over the curriculum window (all workers together) that
    moves the run to the next stage."""
    max_iterations: int | None = Field(None, ge=1)
    """fallback: advance after this many"""


class CurriculumConfig(Strict):
    enabled: bool = True
    """false: every episode plays the last stage."""
    stages: list[StageConfig] = Field(default_factory=list)
    """empty: the env's own stages"""
    window: int = Field(50, ge=1)
    """episodes (across all workers) the success rate is over"""
    min_episodes: int = Field(20, ge=1)
    """no switch before this many episodes in a stage"""
    review: float = Field(0.0, ge=0, lt=1)
    """After the first stage, this share of the episodes replays a stage already passed (drawn
    uniformly), so RL in `full` does not unlearn `pickup`; they do not count toward the bar."""

    def stages_of(self, env_stages: Sequence[str]) -> list[StageConfig]:
        """The stages the curriculum runs through (the env's own when none are listed); a
        stage the env does not have is a config error."""
        unknown = [s.name for s in self.stages if s.name not in env_stages]
        if unknown:
            raise ConfigError(
                f"curriculum.stages: unknown stage {unknown[0]!r}; valid: {', '.join(env_stages)}"
            )
        return self.stages or [StageConfig(name=s) for s in env_stages]


# The experiment trackers `run.trackers` may name.
TrackerName = Literal["tensorboard", "mlflow", "wandb"]


class RunConfig(Strict):
    seed: int = 0
    """The run's seed (data, SFT and evaluation use it unless they set their own)."""
    iterations: int = Field(200, ge=1)
    """RL iterations."""
    checkpoint_every: int = Field(10, ge=1)
    """A checkpoint every this many iterations."""
    num_learners: int = Field(0, ge=0)
    """0: the learner runs in the driver process (a laptop); N >= 1: N RLlib Learner actors,
    data-parallel (DDP) over the LoRA + value head when N > 1, each with
    num_gpus_per_learner GPUs."""
    num_gpus_per_learner: float = Field(0.0, ge=0)
    """GPUs of each learner (the SFT tasks ask for the same)."""
    num_gpus_per_worker: float = Field(0.0, ge=0)
    """per rollout worker (EnvRunner)"""
    worker_resources: dict[str, float] = Field(default_factory=dict)
    """Custom Ray resources each rollout worker / learner actor asks for: place them on the nodes
    started with those resources (`ray start --resources '{"rollout": 8}'`)."""
    learner_resources: dict[str, float] = Field(default_factory=dict)
    """Custom Ray resources each learner actor (and SFT task) asks for; see worker_resources."""
    restart_failed_workers: bool = True
    """Restart a rollout worker that died (RLlib's fault tolerance)."""
    max_failed_iterations: int = Field(3, ge=1)
    """Stop the run (one line naming the last worker error) when rollout workers fail in this many
    iterations in a row, instead of restarting them forever."""
    worker_restart_delay_s: float = Field(10.0, ge=0)
    """How long a failed rollout worker waits before it exits and Ray restarts it (RLlib's default
    is 60 s per restart)."""
    sample_timeout_s: float = Field(3600.0, gt=0)
    """How long one iteration's sampling may take before RLlib gives up on a worker's batch; an LM
    policy plus a reflection per step is far slower than RLlib's 60 s default expects."""
    heartbeat_s: float = Field(20.0, gt=0, le=30)
    """Within an iteration, a line with its phase, env steps and minibatches this often (a live
    line on a terminal instead)."""
    dashboard_host: str = "127.0.0.1"
    """The address the Ray dashboard of a local Ray (one the run starts) listens on."""
    dashboard_port: int = Field(8265, ge=1, le=65535)
    """The port of that dashboard."""
    trackers: list[TrackerName] = Field(default_factory=lambda: ["tensorboard"])
    """Where the run's figures go besides metrics.jsonl: tensorboard (RUN/tensorboard), mlflow
    (`MLFLOW_TRACKING_URI`, else a local store in RUN/mlruns) and wandb (offline in RUN/wandb
    unless `WANDB_MODE` or `WANDB_API_KEY` is set). mlflow and wandb get the SFT losses, every
    RL iteration's row, the final eval and the config, all in one run that `--resume`
    continues (reflectrl/trackers.py)."""


class WriterConfig(Strict):
    url: str | None = None
    """An OpenAI-compatible base URL (e.g. https://api.openai.com/v1) whose chat model words the
    data's reflections; None: the built-in templated writer."""
    model: str = "gpt-4o-mini"
    """The chat model at `url` that words the reflections."""
    api_key_env: str = "OPENAI_API_KEY"
    """the environment variable holding the key"""
    timeout_s: float = Field(60.0, gt=0)
    """Seconds one request to it may take."""


class DataConfig(Strict):
    """SFT data (`reflectrl data`): expert episodes from the env's training split only."""

    episodes: int = Field(300, ge=1)
    """spread evenly over the curriculum stages"""
    expert: Literal["observable", "oracle"] = "observable"
    """observable: the expert and the reflections' facts come from what the agent sees (plus
    statistics of the training split); oracle: from hidden state (where AutoExplore's target is,
    what ALFWorld's closed receptacles hold), a named variant. Taxi's are the same."""
    negative_rate: float = Field(0.2, ge=0, le=1)
    """steps where a wrong action is taken"""
    wrong_hint_rate: float = Field(0.0, ge=0, le=1)
    """Steps whose policy row (sft_policy) quotes a wrong next action in its reflection, still
    labelled with the expert's action: the policy learns that a hint can be wrong. 0: every hint
    in the data is right (the paper)."""
    eval_fraction: float = Field(0.1, ge=0, lt=1)
    """episodes kept for SFT's eval loss"""
    seed: int | None = None
    """None: run.seed"""
    writer: WriterConfig = Field(default_factory=WriterConfig)
    """What words the data's reflections: the built-in templates, or a chat model at an
    OpenAI-compatible URL."""


class SFTSettings(Strict):
    """Warm-up SFT of both players (`reflectrl sft`) on the data of `reflectrl data`."""

    enabled: bool = True
    """The pipeline's data and sft stages (`reflectrl launch`); false: RL from scratch."""
    policy: bool = True
    """false: only the reflection model trains here; the policy starts RL from its base model (the
    paper's "RL only" column: RL from scratch, with a trained reflection)."""

    method: Literal["lora", "full"] = "lora"
    """lora: a peft adapter over the frozen model; full: every weight (for small models trained
    from scratch, where a LoRA over random weights cannot learn much)."""
    lr: float = Field(2e-4, gt=0)
    """Learning rate of SFT."""
    epochs: float = Field(1.0, gt=0)
    """Passes over the data (unless max_steps is set)."""
    max_steps: int | None = Field(None, ge=1)
    """set: this many steps instead of `epochs`"""
    reflection_max_steps: int | None = Field(None, ge=1)
    """The reflection model's steps, when it needs more than the policy (it writes whole sentences;
    the policy one label). None: `max_steps`."""
    reflection_command_weight: float = Field(1.0, gt=0)
    """The reflection's training loss weighs the tokens of the command its completion quotes last
    (the expert's next action) this many times each other token: a one-token slip there misleads
    the policy, one in the analysis does not. 1: the plain completion loss (the held-out loss is
    always the plain one)."""
    batch_size: int = Field(8, ge=1)
    """Rows per SFT step."""
    warmup_steps: int = Field(0, ge=0)
    """Steps of learning-rate warmup."""
    logging_steps: int = Field(10, ge=1)
    """A progress line with the loss every this many steps."""
    eval_steps: int = Field(50, ge=1)
    """eval loss on the held-out rows every this many steps"""
    seed: int | None = None
    """None: run.seed"""

    def max_steps_of(self, player: str) -> int | None:
        if player == "reflection" and self.reflection_max_steps is not None:
            return self.reflection_max_steps
        return self.max_steps


# The advantage estimators (`rl.advantage`; the math is reflectrl/rl/advantages.py's). All but
# `gae` use no critic: no value head is built or trained.
AdvantageEstimator = Literal[
    "gae", "reinforce", "rloo", "grpo", "gigpo", "state_table", "state_model"
]
CRITIC_FREE: frozenset[str] = frozenset(
    {"reinforce", "rloo", "grpo", "gigpo", "state_table", "state_model"}
)
# The estimators that key steps by a digest of their policy prompt.
DIGEST_ESTIMATORS: frozenset[str] = frozenset({"gigpo", "state_table", "state_model"})
# The estimators whose table (rl/advantages.py's StateTable) lives on across iterations in one
# learner and its checkpoints.
TABLE_ESTIMATORS: frozenset[str] = frozenset({"state_table", "state_model"})


class SuccessReplayConfig(Strict):
    """The last `episodes` successful episodes of the current curriculum stage, cleared at a
    stage switch, added to every update with a self-imitation term (rl/success_replay.py)."""

    episodes: int = Field(0, ge=0)
    """0: off; the authors keep 50"""
    weight: float = Field(1.0, ge=0)
    """of the replayed steps' mean -log pi(a|s)"""


class RLStage(Strict):
    enabled: bool = True
    """the pipeline's rl stage; false: the SFT-only ablation"""
    advantage: AdvantageEstimator = "gae"
    """gae: PPO over the value head; reinforce: the discounted return-to-go (the authors' default);
    rloo / grpo: the episode's return against its group; gigpo: grpo plus a step advantage over
    the steps that saw the same prompt; state_table: the return minus the running mean return of
    every earlier step that saw the same prompt (a table critic, kept by a single learner);
    state_model: r + gamma V(next prompt) - V(prompt), V the policy's value on the empirical model
    of every transition between prompts seen so far (kept by a single learner). The critic-free
    ones need whole episodes (ppo.batch_mode=complete_episodes)."""
    step_advantage_weight: float = Field(1.0, ge=0)
    """gigpo: the weight of the step (anchor-state) advantage beside the episode advantage."""
    scale_by_std: bool = True
    """grpo / gigpo: divide the episode advantage by its group's std."""
    bootstrap_step_limit: bool = False
    """state_table: the return of an episode the step limit cut goes on from the table's value
    of its last observation (the step limit is not in the observation; gae bootstraps there from
    its value head already). false: such a return stops at the limit."""
    normalise_advantages: bool = True
    """Standardise the advantages over the rows that carry loss (bootstrap rows get 0)."""
    success_replay: SuccessReplayConfig = Field(default_factory=SuccessReplayConfig)
    """Success replay: recent successful episodes imitated at every update."""
    group_size: int = Field(1, ge=1)
    """Group resets: the envs of a worker in groups of this many, each group's episodes sharing
    their start (G to a start), for the group-relative estimators. 1: every env on its own."""

    @property
    def critic(self) -> bool:
        """Whether the estimator needs a value head."""
        return self.advantage not in CRITIC_FREE


class EvalConfig(Strict):
    """Held-out evaluation (`reflectrl eval`, and during RL every `every` iterations)."""

    enabled: bool = True
    """the pipeline's final eval stage"""

    split: str | None = None
    """None: the env's held-out split (Taxi/AutoExplore test, ALFWorld valid_unseen)"""
    extra_splits: list[str] = Field(default_factory=list)
    """More held-out splits the pipeline's final eval plays too, each into eval_<split>.json
    (AutoExplore: `unseen`, the source trees training never saw)."""
    episodes: int = Field(30, ge=1)
    """per stage and per decoding (greedy, sampled)"""
    stages: list[str] = Field(default_factory=list)
    """empty: every curriculum stage"""
    every: int = Field(0, ge=0)
    """during RL, every this many iterations; 0: never"""
    seed: int | None = None
    """None: run.seed"""
