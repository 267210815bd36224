"""Checkpoints of the local backend: a directory holding `arrays.npz` and `manifest.json`.

Conventions:
- Arrays are named by their pytree path under a prefix: `params/...` for the weights and
  `optimizer/...` for the Adam state (present only in `"state"` checkpoints, absent in
  `"sampler"` ones). They are loaded with `allow_pickle=False` and checked, name by name,
  against the shapes and dtypes of a freshly initialised model of the manifest's config.
- `manifest.json` records the format tag, the kind, the base model name, the `ModelConfig`,
  whether optimizer state is present, the optimizer step count (it keys the sampling streams, so
  a resumed run continues exactly) and the user's metadata.
- A checkpoint is staged in a hidden sibling directory and renamed into place, so a crash
  never leaves a half-written checkpoint under the real name (overwriting removes the old
  one first).
- Unreadable files, an unknown format tag, a bad config, bad step count and missing or
  misshapen arrays raise `CheckpointError` naming the checkpoint path.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import msgspec
import numpy as np

from rlpure import model as model_lib
from shell.errors import CheckpointError

__all__ = ["Checkpoint", "checkpoint_name", "read_checkpoint", "write_checkpoint"]

_CHECKPOINT_FORMAT = "rlpure-local-checkpoint-v1"


def _tree_to_named_arrays(tree: Any, prefix: str) -> dict[str, np.ndarray]:
    """Flattens a pytree to `{"prefix/a/0/b": array}` (names from the pytree paths)."""
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        parts = []
        for entry in path:
            for attr in ("key", "idx", "name"):
                if hasattr(entry, attr):
                    parts.append(str(getattr(entry, attr)))
                    break
        out["/".join([prefix, *parts])] = np.asarray(leaf)
    return out


def _named_arrays_to_tree(
    template: Any, prefix: str, arrays: Mapping[str, np.ndarray], where: str
) -> Any:
    """Inverse of `_tree_to_named_arrays`, checking names, shapes and dtypes against `template`."""
    expected = _tree_to_named_arrays(template, prefix)
    leaves = []
    for name, like in expected.items():
        if name not in arrays:
            raise CheckpointError(f"{where}: array {name!r} is missing")
        got = arrays[name]
        if got.shape != like.shape or got.dtype != like.dtype:
            raise CheckpointError(
                f"{where}: array {name!r} has shape {got.shape} dtype {got.dtype}, expected "
                f"{like.shape} {like.dtype}"
            )
        leaves.append(jnp.asarray(got))
    treedef = jax.tree_util.tree_structure(template)
    return jax.tree_util.tree_unflatten(treedef, leaves)


def write_checkpoint(
    directory: Path,
    *,
    base_model: str,
    config: model_lib.ModelConfig,
    params: model_lib.Params,
    opt_state: Any | None,
    optim_steps: int,
    kind: str,
    user_metadata: Mapping[str, str] | None,
) -> None:
    """Writes a checkpoint directory at `directory` (replacing one that exists).

    `opt_state=None` writes weights only (a sampler checkpoint); `kind` is recorded in the
    manifest (`"state"` or `"sampler"`).
    """
    # Written into a temporary sibling, then renamed into place: a crash never leaves a
    # half-written checkpoint under the real name.
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = directory.parent / f".{directory.name}.tmp-{os.getpid()}"
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir()
    arrays = _tree_to_named_arrays(params, "params")
    if opt_state is not None:
        arrays.update(_tree_to_named_arrays(opt_state, "optimizer"))
    np.savez(staging / "arrays.npz", **arrays)  # type: ignore[arg-type]
    manifest = {
        "format": _CHECKPOINT_FORMAT,
        "kind": kind,
        "base_model": base_model,
        "config": msgspec.to_builtins(config),
        "has_optimizer": opt_state is not None,
        "optim_steps": optim_steps,
        "arrays": sorted(arrays),
        "user_metadata": dict(user_metadata or {}),
    }
    (staging / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
    if directory.exists():  # overwrite=True was checked by the caller
        shutil.rmtree(directory)
    os.replace(staging, directory)


class Checkpoint(msgspec.Struct, frozen=True, kw_only=True):
    """A checkpoint read back: weights, Adam state (`None` unless asked for) and step count."""

    base_model: str
    config: model_lib.ModelConfig
    params: Any
    opt_state: Any | None
    optim_steps: int


def read_checkpoint(path: str, *, with_optimizer: bool) -> Checkpoint:
    """Reads and validates the checkpoint directory `path`.

    Raises:
        CheckpointError: unreadable files, unknown format, bad config, missing or misshapen
            arrays, or no optimizer state when `with_optimizer` is True.
    """
    directory = Path(path)
    where = f"checkpoint {path!r}"
    try:
        manifest = json.loads((directory / "manifest.json").read_text())
        with np.load(directory / "arrays.npz", allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{where}: cannot read: {err}") from err
    if manifest.get("format") != _CHECKPOINT_FORMAT:
        raise CheckpointError(f"{where}: unknown format {manifest.get('format')!r}")
    try:
        config = msgspec.convert(manifest["config"], model_lib.ModelConfig)
    except (KeyError, msgspec.ValidationError) as err:
        raise CheckpointError(f"{where}: bad model config: {err}") from err
    template = jax.eval_shape(lambda: model_lib.init_params(jax.random.key(0), config))
    template = jax.tree_util.tree_map(lambda s: np.zeros(s.shape, s.dtype), template)
    params = _named_arrays_to_tree(template, "params", arrays, where)
    opt_state = None
    if with_optimizer:
        if not manifest.get("has_optimizer"):
            raise CheckpointError(f"{where}: holds no optimizer state (a sampler checkpoint?)")
        opt_template = jax.tree_util.tree_map(np.asarray, model_lib.init_optimizer_state(template))
        opt_state = _named_arrays_to_tree(opt_template, "optimizer", arrays, where)
    optim_steps = manifest.get("optim_steps", 0)
    if isinstance(optim_steps, bool) or not isinstance(optim_steps, int) or optim_steps < 0:
        raise CheckpointError(f"{where}: bad optim_steps {optim_steps!r}")
    return Checkpoint(
        base_model=str(manifest.get("base_model")),
        config=config,
        params=params,
        opt_state=opt_state,
        optim_steps=optim_steps,
    )


def checkpoint_name(name: Any) -> str:
    """`name` if it is a plain file name (no separators, not `.` or `..`), else `ValueError`."""
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name:
        raise ValueError(f"checkpoint name must be a non-empty file name, got {name!r}")
    return name
