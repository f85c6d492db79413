"""A from-scratch model for one env: a byte-level BPE tokenizer trained on the env's own text,
and a small random-init Llama over that vocabulary (`policy.model: scratch:<env>`), or a
GPT-2 of the same size (`scratch:<env>:gpt2`, the paper's family; `scratch:<env>:gpt2_cells`
over a tokenizer that keeps every grid cell one token).

Why GPT-2 too: its learned absolute positions let two layers read a grid cell by where it sits
in the prompt. Told the answer, the Llama trunk (rotary positions) predicts 0.57 of Taxi's
held-out first moves and a GPT-2 trunk of this shape 0.75 (diagnostics/grid_reading.py).

Why: on a CPU the embedding and LM head over a 49k-id vocabulary dominate a tiny model's cost
(~10x the rest); a few hundred ids trained on the text the env really shows keep a 0.4M-param
model fast enough to learn Taxi in minutes. Both players stay ordinary HF model directories
(`tokenizer.json` + safetensors) that transformers, peft and vLLM load like any other.

The corpus is the env's expert episodes rendered by the same prompt code as the SFT data
(instruction, observation, template reflections, menus, markers, every label), so nothing the
env says is split into single bytes; text from elsewhere still encodes (byte-level alphabet).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from reflectrl.console import say
from reflectrl.models.model_dirs import default_cache_dir, resolve_model, smollm2_tokenizer

PRETRAIN_STEPS = 2000
READING_PRETRAIN_STEPS = 800  # the reading kinds are few and short; ~1 s a step on 2 cores
PRETRAIN_SEED = 0
VOCAB_SIZE = 512
CORPUS_SEED = 1234
SPECIALS = ("<|endoftext|>", "<|pad|>")


def resolve_or_build(spec: str, cache_dir: Path | None = None) -> Path:
    """`resolve_model(spec)`, building a scratch model first where this machine lacks it."""
    return resolve_model(spec, cache_dir, build_scratch=build_model)


def build_model(out: Path, env_name: str, arch: str) -> None:
    """The scratch builder `resolve_model` takes. The corpus and the tokenizer that measures
    it come from the user's cache, not the model's: a scratch model built anywhere is the
    same model."""
    shared = default_cache_dir()
    build(out, env_name, arch, shared, smollm2_tokenizer(shared))


def corpus(
    env_name: str, cache: Path, count_tokenizer: Any, episodes: int | None = None
) -> Iterator[str]:
    """Every prompt and reflection of `episodes` (default: the env's `corpus_episodes`) seeded
    expert episodes (with mistakes) of the env's train split, at every curriculum stage, plus
    the label alphabet."""
    from reflectrl.config import ReflectRLConfig
    from reflectrl.data.demos import demonstrator_for
    from reflectrl.data.episodes import episode_steps
    from reflectrl.data.writers import TemplateWriter
    from reflectrl.envs.registry import get_env_spec, make_text_env
    from reflectrl.seeding import hash_seed
    from reflectrl.text.rendering import PromptRenderer

    spec = get_env_spec(env_name)
    episodes = spec.corpus_episodes if episodes is None else episodes
    sections = spec.corpus_config(cache / "corpus") if spec.corpus_config else {}
    sections = {**sections, "env": {**sections.get("env", {}), "name": env_name}}
    config = ReflectRLConfig.model_validate(sections)
    config.env.shuffle_options = True  # labels in every menu position
    demo = demonstrator_for(env_name)
    env = make_text_env(env_name, {**config.env.options, "split": demo.train_split})
    renderer = PromptRenderer(config, count_tokenizer, env.max_actions)
    rng = np.random.default_rng(CORPUS_SEED)
    writer = TemplateWriter()
    stages = list(env.stages)
    yield "\n".join(config.policy.labels)
    for e in range(episodes):
        env.set_stage(stages[e % len(stages)])
        obs, _ = env.reset(seed=hash_seed(CORPUS_SEED, e))
        for step in episode_steps(config, env, obs, demo, renderer, writer, rng):
            yield step.plain_prompt + step.label
            yield step.policy_prompt + step.label
            yield step.reflection_prompt + step.reflection


def train_tokenizer(texts: Iterator[str], vocab_size: int = VOCAB_SIZE, cells: bool = False) -> Any:
    """A GPT-2-style byte-level BPE (digits split one by one, so labels stay single tokens).
    `cells`: spaces and punctuation marks are never merged with anything, so a grid row such as
    `|T .|. . D|` is one token per character whatever the cells hold (with merges, `.|.` and
    ` D` are single tokens, and a cell's position in the prompt shifts with its neighbours)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    split = [pre_tokenizers.Split(Regex(r"[^\w]"), behavior="isolated")] if cells else []
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            *split,
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    eos, pad = SPECIALS
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token=eos, eos_token=eos, pad_token=pad, unk_token=None
    )


def build(out: Path, env_name: str, arch: str, cache: Path, count_tokenizer: Any) -> None:
    """Write the env's tokenizer and a seeded random-init model over it into `out`.
    `count_tokenizer` only measures prompts while the corpus is rendered (any will do); the
    env's corpus config is cached under `cache`."""
    from reflectrl.models.loading import save_random_gpt2, save_random_llama

    save = save_random_gpt2 if arch.startswith("gpt2") else save_random_llama
    texts = corpus(env_name, cache, count_tokenizer)
    save(train_tokenizer(texts, cells=arch == "gpt2_cells"), out)
    if arch == "llama_copy":
        pretrain_copy(out)
    if arch == "gpt2_read":
        pretrain_copy(out, steps=READING_PRETRAIN_STEPS, reading=True)


def pretrain_copy(
    model_dir: Path,
    steps: int = PRETRAIN_STEPS,
    batch_rows: int = 16,
    scored_per_kind: int = 64,
    reading: bool = False,
) -> None:
    """Pretrain the model in `model_dir` in place, on synthetic copy and lookup text or (with
    `reading`) on reading Taxi's map; its figures go to `pretrain.json` beside the weights."""
    from dataclasses import asdict

    from reflectrl.atomic_files import write_json
    from reflectrl.data.pretrain import pretrain
    from reflectrl.data.pretrain_taxi import TaxiReadingText
    from reflectrl.models.loading import load_causal_lm, load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    model = load_causal_lm(model_dir)
    result = pretrain(
        model, tokenizer, steps, PRETRAIN_SEED, batch_rows,
        log=say, scored_per_kind=scored_per_kind,
        make_text=TaxiReadingText if reading else None,
    )  # fmt: skip
    model.save_pretrained(model_dir)
    write_json(model_dir / "pretrain.json", asdict(result))
