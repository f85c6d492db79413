"""Model resolution and loading: tiny and SmolLM2 builds, caching, dropout, offline errors."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from reflectrl.data.scratch import resolve_or_build
from reflectrl.errors import ModelLoadError
from reflectrl.models import model_dirs
from reflectrl.models.loading import load_causal_lm, load_tokenizer, zero_dropout_config
from reflectrl.models.model_dirs import default_cache_dir, resolve_model

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return resolve_model("tiny", tmp_path_factory.mktemp("cache"))


def _no_build(*args: object) -> None:
    raise AssertionError("a cache hit must not rebuild")


def test_default_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("REFLECTRL_CACHE", str(tmp_path / "c"))
    assert default_cache_dir() == tmp_path / "c"
    monkeypatch.delenv("REFLECTRL_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / ".cache" / "reflectrl"


def test_tiny_is_cached_and_vllm_shaped(tiny_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert tiny_dir.name == "tiny-llama" and tiny_dir.parent.name == "models"
    monkeypatch.setattr(model_dirs, "_build_tiny", _no_build)
    assert resolve_model("tiny", tiny_dir.parent.parent) == tiny_dir
    config = json.loads((tiny_dir / "config.json").read_text())
    assert config["model_type"] == "llama"
    # vLLM's CPU attention supports only some head sizes; 64 is one of them.
    assert config["hidden_size"] // config["num_attention_heads"] == 64
    assert "quantization_config" not in config
    assert (tiny_dir / "model.safetensors").is_file()
    assert not list(tiny_dir.parent.glob(".tmp-*"))


def test_tiny_is_deterministic(tiny_dir: Path, tmp_path: Path) -> None:
    torch.manual_seed(1234)  # the build must not depend on (or disturb) the global RNG
    before = torch.rand(1)
    torch.manual_seed(1234)
    other = resolve_model("tiny", tmp_path)
    assert torch.equal(torch.rand(1), before)
    first = load_file(tiny_dir / "model.safetensors")
    second = load_file(other / "model.safetensors")
    assert first.keys() == second.keys() and len(first) > 5
    for key in first:
        assert torch.equal(first[key], second[key]), key
    for name in ("config.json", "tokenizer.json"):
        assert (tiny_dir / name).read_text() == (other / name).read_text()


def test_tiny_loads_with_tokenizer_and_generates(tiny_dir: Path) -> None:
    tokenizer = load_tokenizer(tiny_dir)
    model = load_causal_lm(tiny_dir)
    assert not model.training
    assert tokenizer.pad_token is not None
    ids = tokenizer("The taxi is at", return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=4, do_sample=False)
    assert out.shape[1] == ids["input_ids"].shape[1] + 4
    assert model.config.vocab_size == len(tokenizer)


def test_crashed_build_leaves_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def crash(out: Path, cache: Path) -> None:
        (out / "config.json").write_text("{}")  # half-written
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(model_dirs, "_build_tiny", crash)
    with pytest.raises(ModelLoadError, match="disk on fire"):
        resolve_model("tiny", tmp_path)
    models = tmp_path / "models"
    assert not (models / "tiny-llama").exists()
    assert list(models.iterdir()) == []


def test_older_recipe_is_rebuilt(tiny_dir: Path, tmp_path: Path) -> None:
    stale = tmp_path / "models" / "tiny-llama"
    stale.mkdir(parents=True)
    (stale / "config.json").write_text("{}")
    (stale / model_dirs.BUILD_MARKER).write_text(json.dumps({"recipe": "tiny-llama-v0"}))
    rebuilt = resolve_model("tiny", tmp_path)
    assert rebuilt == stale
    assert json.loads((rebuilt / "config.json").read_text())["model_type"] == "llama"
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["tiny-llama"]


def _write_dropout_model(path: Path) -> Path:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2,
        resid_pdrop=0.5, embd_pdrop=0.5, attn_pdrop=0.5, summary_first_dropout=0.5,
    )  # fmt: skip
    torch.manual_seed(0)
    GPT2LMHeadModel(config).save_pretrained(str(path))
    return path


def test_dropout_is_zero_even_in_train_mode(tmp_path: Path) -> None:
    model = load_causal_lm(_write_dropout_model(tmp_path / "gpt2"))
    assert not model.training
    for key in ("resid_pdrop", "embd_pdrop", "attn_pdrop", "summary_first_dropout"):
        assert getattr(model.config, key) == 0.0, key
    assert all(m.p == 0.0 for m in model.modules() if isinstance(m, torch.nn.Dropout))
    # RLlib calls train() for the update: the logits must still match the rollout's.
    model.train()
    ids = torch.arange(16).unsqueeze(0)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, model(ids).logits)


def test_zero_dropout_config_reaches_sub_configs() -> None:
    from transformers import LlamaConfig, PretrainedConfig

    outer = PretrainedConfig(hidden_dropout_prob=0.1, layerdrop=0.2, use_dropout=True)
    outer.text_config = LlamaConfig(attention_dropout=0.3)
    changed = zero_dropout_config(outer)
    assert sorted(changed) == ["hidden_dropout_prob", "layerdrop", "text_config.attention_dropout"]
    assert outer.hidden_dropout_prob == 0.0 and outer.layerdrop == 0.0
    assert outer.text_config.attention_dropout == 0.0
    assert outer.use_dropout is True  # a switch, not a probability


def test_local_dir_is_returned(tiny_dir: Path) -> None:
    assert resolve_model(str(tiny_dir)) == tiny_dir.resolve()


@pytest.mark.parametrize("kind", ["missing", "no_config", "file"])
def test_bad_paths_raise_one_line(kind: str, tmp_path: Path) -> None:
    target = tmp_path / "model"
    if kind == "no_config":
        target.mkdir()
    elif kind == "file":
        target.write_text("x")
    with pytest.raises(ModelLoadError) as info:
        resolve_model(str(target), tmp_path / "cache")
    message = str(info.value)
    assert str(target) in message and "\n" not in message
    assert not (tmp_path / "cache").exists()


def test_uncached_hub_name_raises(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ModelLoadError, match="no-such-org/no-such-model") as info:
        resolve_model("no-such-org/no-such-model", tmp_path)
    assert "\n" not in str(info.value)


def test_broken_model_dir_raises_model_load_error(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')  # no weights
    with pytest.raises(ModelLoadError, match=str(tmp_path)):
        load_causal_lm(tmp_path)


@pytest.mark.integration
def test_smollm2_conversion(tmp_path_factory: pytest.TempPathFactory) -> None:
    cache = tmp_path_factory.mktemp("smollm2")
    model_dir = resolve_model("smollm2", cache)
    assert model_dir == cache / "models" / "smollm2-135m-instruct"
    config = json.loads((model_dir / "config.json").read_text())
    assert "quantization_config" not in config
    assert list(model_dir.glob("*.safetensors")) and not list(model_dir.glob("*.gguf"))

    tokenizer = load_tokenizer(model_dir)
    model = load_causal_lm(model_dir)
    ids = tokenizer("The capital of France is", return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=8, do_sample=False)
    text = tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in text  # a real pretrained model, not noise

    original = model_dirs._build_smollm2
    try:
        model_dirs._build_smollm2 = _no_build  # type: ignore[assignment]
        assert resolve_model("smollm2", cache) == model_dir
    finally:
        model_dirs._build_smollm2 = original


@pytest.fixture(scope="module")
def scratch_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return resolve_or_build("scratch:dangerous_taxi", tmp_path_factory.mktemp("cache"))


def test_a_scratch_model_is_built_only_by_the_builder_handed_in(tmp_path: Path) -> None:
    """models/ cannot render env episodes: without a builder an unbuilt scratch model is one
    clear error; with one, it is built once into the cache and found there afterwards."""
    with pytest.raises(ModelLoadError) as err:
        resolve_model("scratch:dangerous_taxi", tmp_path)
    assert "is not built" in str(err.value) and "resolve_or_build" in str(err.value)
    assert "\n" not in str(err.value)
    calls: list[tuple[str, str]] = []

    def build(out: Path, env_name: str, arch: str) -> None:
        calls.append((env_name, arch))
        (out / "config.json").write_text("{}")

    built = resolve_model("scratch:dangerous_taxi:gpt2", tmp_path, build_scratch=build)
    assert calls == [("dangerous_taxi", "gpt2")]
    assert built == tmp_path / "models" / model_dirs.scratch_dirname("dangerous_taxi", "gpt2")
    assert resolve_model("scratch:dangerous_taxi:gpt2", tmp_path) == built
    assert resolve_model("scratch:dangerous_taxi:gpt2", tmp_path, build_scratch=build) == built
    assert len(calls) == 1
    with pytest.raises(ModelLoadError, match="unknown architecture"):
        resolve_model("scratch:dangerous_taxi:bert", tmp_path, build_scratch=build)


def test_scratch_model_speaks_taxi_in_few_ids(scratch_dir: Path) -> None:
    """`scratch:<env>`: a tokenizer trained on the env's text (few ids, Taxi words whole, every
    label one token) and a random Llama over it, loadable like any HF directory."""
    from reflectrl.envs.registry import make_text_env
    from reflectrl.text import prompts
    from reflectrl.text.tokens import label_token_ids

    tokenizer = load_tokenizer(scratch_dir)
    assert len(tokenizer) == 512
    labels = "123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    assert len(set(label_token_ids(tokenizer, labels, prompts.ACTION_MARKER))) == len(labels)
    obs, _ = make_text_env("dangerous_taxi", {"split": "test"}).reset(seed=3)
    text = prompts.policy_parts(obs, 'Next: "go north".', labels, range(len(obs.actions))).text
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text
    assert len(ids) < 0.4 * len(text)  # words, not bytes (the map is a token per cell)
    assert tokenizer.encode(" passenger", add_special_tokens=False) != []
    odd = "héllo ✓ {}"  # text the env never shows still encodes (byte-level alphabet)
    assert tokenizer.decode(tokenizer.encode(odd, add_special_tokens=False)) == odd
    model = load_causal_lm(scratch_dir)
    assert model.config.vocab_size == 512
    assert sum(p.numel() for p in model.parameters()) < 600_000
    out = model.generate(torch.tensor([ids]), max_new_tokens=3, do_sample=False)
    assert out.shape == (1, len(ids) + 3)


def test_scratch_gpt2_shares_the_tokenizer_and_lora_targets_are_checked(scratch_dir: Path) -> None:
    """`scratch:<env>:gpt2`: a same-size GPT-2 over the same tokenizer; LoRA targets that name
    no layer of the architecture fail in one line that lists the layers it has."""
    from reflectrl.errors import ModelLoadError
    from reflectrl.models.adapters import check_lora_targets

    gpt2_dir = resolve_or_build("scratch:dangerous_taxi:gpt2", scratch_dir.parent.parent)
    assert gpt2_dir.name == "scratch-gpt2-dangerous_taxi"
    assert (gpt2_dir / "tokenizer.json").read_text() == (scratch_dir / "tokenizer.json").read_text()
    model = load_causal_lm(gpt2_dir)
    assert model.config.model_type == "gpt2"
    llama = load_causal_lm(scratch_dir)
    sizes = [sum(p.numel() for p in m.parameters()) for m in (model, llama)]
    assert abs(sizes[0] - sizes[1]) < 0.4 * sizes[1]  # the same size, give or take positions
    check_lora_targets(gpt2_dir, ["c_attn", "c_proj", "c_fc"], "policy.lora.target_modules")
    check_lora_targets(scratch_dir, ["q_proj", "v_proj"], "policy.lora.target_modules")
    check_lora_targets(scratch_dir, ["self_attn.q_proj"], "policy.lora.target_modules")
    with pytest.raises(ModelLoadError, match=r"'q_proj' is no layer .*c_attn, c_fc, c_proj"):
        check_lora_targets(gpt2_dir, ["q_proj", "v_proj"], "policy.lora.target_modules")
    with pytest.raises(ModelLoadError, match=r"unknown architecture 'mamba'.*scratch:dangerous"):
        resolve_model("scratch:dangerous_taxi:mamba", scratch_dir.parent.parent)


def test_cells_tokenizer_keeps_every_grid_cell_one_token() -> None:
    """`scratch:<env>:gpt2_cells`: with merges, `.|.` or ` D` are single tokens and a cell's
    position shifts with its neighbours; the cells tokenizer gives each character of a grid row
    its own token (the same count whatever the cells hold) and still round-trips text."""
    from reflectrl.data.scratch import train_tokenizer

    rows = ["|T .|. . D|\n", "|. .|T . .|\n", "|X .|P . .|\n"]
    corpus = ['You drive a taxi. Next: "go west".', *rows] * 50
    merged = train_tokenizer(iter(corpus), vocab_size=300)
    cells = train_tokenizer(iter(corpus), vocab_size=300, cells=True)
    assert len({len(merged(row).input_ids) for row in rows}) > 1  # what the option is for
    for row in rows:
        ids = cells(row).input_ids
        assert [cells.decode([i]) for i in ids] == list(row)
    text = 'You drive a taxi. Next: "go west". 12'
    assert cells.decode(cells(text).input_ids) == text


def test_scratch_model_for_auto_explore_keeps_its_40_labels_whole(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """`scratch:auto_explore`: a tokenizer trained on AutoExplore's train-split text (tasks from
    the installed packages' trees) round-trips its prompts, in fewer ids than bytes, and
    keeps every one of the 40 menu labels a single token."""
    from reflectrl.envs.registry import get_env_spec, make_text_env
    from reflectrl.text import prompts
    from reflectrl.text.tokens import label_token_ids

    cache = tmp_path_factory.mktemp("cache")
    tokenizer = load_tokenizer(resolve_or_build("scratch:auto_explore", cache))
    labels = "123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcde"
    assert len(set(label_token_ids(tokenizer, labels, prompts.ACTION_MARKER))) == 40
    corpus = get_env_spec("auto_explore").corpus_config
    assert corpus is not None
    options = {**corpus(cache)["env"]["options"], "split": "test", "drop_prob": 0.0}
    env = make_text_env("auto_explore", options)
    obs, _ = env.reset(seed=0)
    for step in range(3):
        reflection = f'Step {step}: "{obs.actions[0]}" looks right.'
        text = prompts.policy_parts(obs, reflection, labels, range(len(obs.actions))).text
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert tokenizer.decode(ids) == text
        assert len(ids) < 0.6 * len(text)  # bytes: 1.0
        cat = next((i for i, a in enumerate(obs.actions) if a.startswith("cat ")), 0)
        obs, *_ = env.step(cat)  # a file's outline and text: code, not the env's own words


def test_scratch_model_for_alfworld_keeps_its_60_labels_whole(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch, tiny_dir: Path
) -> None:
    """`scratch:alfworld`'s build: a tokenizer trained on the text of ALFWorld's training games
    (made offline by the generator; 6 games and 12 episodes here, 24 and 48 in the real
    corpus) round-trips the prompts of a game on an unseen floor plan, in fewer ids than bytes,
    and keeps every one of the 60 menu labels a single token."""
    import dataclasses

    from reflectrl.data.scratch import build
    from reflectrl.envs import registry
    from reflectrl.envs.alfworld import env as alfworld_env
    from reflectrl.envs.alfworld.generator import generate_games
    from reflectrl.envs.registry import make_text_env
    from reflectrl.text import prompts
    from reflectrl.text.tokens import label_token_ids

    spec = registry.get_env_spec("alfworld")
    monkeypatch.setitem(
        registry._REGISTRY, "alfworld", dataclasses.replace(spec, corpus_episodes=12)
    )
    monkeypatch.setattr(alfworld_env, "CORPUS_GAMES", 6)
    cache = tmp_path_factory.mktemp("cache")
    build(cache / "scratch-alfworld", "alfworld", "llama", cache, load_tokenizer(tiny_dir))
    tokenizer = load_tokenizer(cache / "scratch-alfworld")
    labels = "123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxy"
    assert len(set(label_token_ids(tokenizer, labels, prompts.ACTION_MARKER))) == 60
    games = tmp_path_factory.mktemp("games") / "games"
    generate_games(games, 2, 7, valid_seen=0.0, valid_unseen=0.5)
    env = make_text_env("alfworld", {"data_dir": str(games), "split": "valid_unseen"})
    obs, _ = env.reset(seed=0)
    for step in range(3):
        reflection = f'Step {step}: "{obs.actions[0]}" looks right.'
        text = prompts.policy_parts(obs, reflection, labels, range(len(obs.actions))).text
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert tokenizer.decode(ids) == text
        assert len(ids) < 0.5 * len(text)  # bytes: 1.0
        obs, *_ = env.step(0)
    env.close()
