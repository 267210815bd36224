"""Reading a local checkpoint refuses every malformed one with a `CheckpointError`.

A manifest that is not an object, missing or mistyped keys, an unknown format tag, arrays that
differ from the manifest or the config, truncated, corrupt or pickled `arrays.npz`: each raises
`CheckpointError` naming the checkpoint path, the file and the fault (never `AttributeError` or
a NumPy/zipfile error), through `read_checkpoint` and through every client entry point that
reads a checkpoint.

Every test corrupts a fresh copy of the `pristine` micro-model checkpoint (`conftest.py`).
"""

from __future__ import annotations

import json
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlpure.model import VOCAB_SIZE
from shell.errors import CheckpointError
from shell.local._checkpoints import read_checkpoint
from tests.local.micro import (
    MICRO,
    MICRO_BUILTINS,
    MICRO_NAME,
    micro_params,
    micro_service,
    params_equal,
)


@pytest.fixture
def ckpt(pristine: Path, tmp_path: Path) -> Path:
    """A fresh copy of `pristine` that a test may corrupt."""
    return Path(shutil.copytree(pristine, tmp_path / "ckpt"))


def _manifest(path: Path) -> dict[str, Any]:
    return json.loads((path / "manifest.json").read_text())


def _edit_manifest(path: Path, edit: Callable[[dict[str, Any]], Any]) -> None:
    """Applies `edit` to the manifest dict in place (its return value is ignored)."""
    manifest = _manifest(path)
    edit(manifest)
    (path / "manifest.json").write_text(json.dumps(manifest))


def _arrays(path: Path) -> dict[str, np.ndarray]:
    with np.load(path / "arrays.npz", allow_pickle=False) as npz:
        return {name: npz[name] for name in npz.files}


def _write_arrays(path: Path, arrays: dict[str, np.ndarray], *, relist: bool) -> None:
    """Rewrites `arrays.npz`; `relist=True` also makes the manifest list exactly these names."""
    np.savez(path / "arrays.npz", **arrays)  # type: ignore[arg-type]
    if relist:
        _edit_manifest(path, lambda m: m.update(arrays=sorted(arrays)))


def _assert_refused(path: Path, *fragments: str, with_optimizer: bool = True) -> None:
    with pytest.raises(CheckpointError) as info:
        read_checkpoint(str(path), with_optimizer=with_optimizer)
    message = str(info.value)
    for fragment in (str(path), *fragments):
        assert fragment in message, f"{fragment!r} not in {message!r}"


def test_the_pristine_checkpoint_reads_back(pristine: Path) -> None:
    checkpoint = read_checkpoint(str(pristine), with_optimizer=True)
    assert checkpoint.config == MICRO and checkpoint.optim_steps == 3
    assert checkpoint.base_model == MICRO_NAME and checkpoint.opt_state is not None
    assert params_equal(checkpoint.params, micro_params())
    assert _manifest(pristine)["arrays"] == sorted(_arrays(pristine))


@pytest.mark.parametrize(
    "text",
    ["[1, 2]", '"a string"', "null", "3", "true", "[]"],
    ids=["array", "string", "null", "number", "bool", "empty-array"],
)
def test_a_manifest_that_is_not_a_json_object_is_refused(ckpt: Path, text: str) -> None:
    (ckpt / "manifest.json").write_text(text)
    _assert_refused(ckpt, "manifest.json must hold a JSON object")


@pytest.mark.parametrize(
    "data", [b"", b'{"format": ', b"\xff\xfe{}", b"{'single': 'quotes'}"], ids=str
)
def test_a_manifest_that_is_not_json_is_refused(ckpt: Path, data: bytes) -> None:
    (ckpt / "manifest.json").write_bytes(data)
    _assert_refused(ckpt, "manifest.json", with_optimizer=False)


@pytest.mark.parametrize(
    "key",
    ["kind", "base_model", "config", "has_optimizer", "optim_steps", "arrays", "user_metadata"],
)
def test_a_manifest_missing_a_key_names_the_key(ckpt: Path, key: str) -> None:
    _edit_manifest(ckpt, lambda m: m.pop(key))
    _assert_refused(ckpt, "manifest.json", f"missing required field `{key}`")


@pytest.mark.parametrize("value", [None, "rlpure-local-checkpoint-v2", 1])
def test_a_missing_or_unknown_format_tag_is_refused(ckpt: Path, value: Any) -> None:
    _edit_manifest(ckpt, lambda m: m.pop("format") if value is None else m.update(format=value))
    _assert_refused(ckpt, "manifest.json: unknown format", repr(value))


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("kind", "weights", "`$.kind`"),
        ("base_model", 3, "`$.base_model`"),
        ("config", "rlpure/tiny", "`$.config`"),
        ("config", {"vocab_size": VOCAB_SIZE}, "missing required field `d_model`"),
        ("config", {**MICRO_BUILTINS, "d_model": 0}, "ModelConfig.d_model"),
        ("config", {**MICRO_BUILTINS, "n_layers": 1.5}, "`$.config.n_layers`"),
        ("has_optimizer", "yes", "`$.has_optimizer`"),
        ("optim_steps", -1, "`$.optim_steps`"),
        ("optim_steps", 1.5, "`$.optim_steps`"),
        ("optim_steps", True, "`$.optim_steps`"),
        ("optim_steps", "3", "`$.optim_steps`"),
        ("arrays", "params", "`$.arrays`"),
        ("arrays", [1, 2], "`$.arrays[0]`"),
        ("user_metadata", {"note": 1}, "`$.user_metadata[...]`"),
        ("user_metadata", [], "`$.user_metadata`"),
    ],
    ids=lambda v: str(v)[:20],
)
def test_a_mistyped_manifest_key_names_the_key(
    ckpt: Path, key: str, value: Any, fragment: str
) -> None:
    _edit_manifest(ckpt, lambda m: m.update({key: value}))
    _assert_refused(ckpt, "manifest.json", fragment)


def test_arrays_the_manifest_does_not_list_are_refused(ckpt: Path) -> None:
    _edit_manifest(ckpt, lambda m: m.update(arrays=m["arrays"][1:]))
    _assert_refused(ckpt, "arrays.npz holds arrays manifest.json does not list")


def test_listed_arrays_the_npz_does_not_hold_are_refused(ckpt: Path) -> None:
    _edit_manifest(ckpt, lambda m: m.update(arrays=[*m["arrays"], "params/extra"]))
    _assert_refused(ckpt, "manifest.json lists arrays arrays.npz does not hold", "params/extra")


def test_arrays_the_config_does_not_have_are_refused(ckpt: Path) -> None:
    arrays = {**_arrays(ckpt), "params/extra": np.zeros(3, np.float32)}
    _write_arrays(ckpt, arrays, relist=True)
    _assert_refused(ckpt, "lists arrays its config does not have", "params/extra")
    # Refused even when only the weights are asked for.
    _assert_refused(ckpt, "params/extra", with_optimizer=False)


@pytest.mark.parametrize("prefix", ["params/", "optimizer/"])
def test_arrays_the_config_has_but_the_checkpoint_lacks_are_refused(
    ckpt: Path, prefix: str
) -> None:
    arrays = _arrays(ckpt)
    dropped = next(name for name in sorted(arrays) if name.startswith(prefix))
    del arrays[dropped]
    _write_arrays(ckpt, arrays, relist=True)
    _assert_refused(ckpt, "does not list arrays its config has", dropped, with_optimizer=False)


@pytest.mark.parametrize(
    "change",
    [
        lambda a: a.reshape(-1),
        lambda a: np.zeros((*a.shape, 2), a.dtype),
        lambda a: a.astype(np.float64),
        lambda a: a.astype(np.int32),
    ],
    ids=["flattened", "extra-axis", "float64", "int32"],
)
def test_a_misshapen_array_is_refused(ckpt: Path, change: Callable[[Any], Any]) -> None:
    arrays = _arrays(ckpt)
    name = "params/embed_V_E"
    arrays[name] = change(arrays[name])
    _write_arrays(ckpt, arrays, relist=False)
    _assert_refused(ckpt, "arrays.npz", name, "expected (259, 16) float32")


def test_has_optimizer_must_agree_with_the_arrays(ckpt: Path, tmp_path: Path) -> None:
    _edit_manifest(ckpt, lambda m: m.update(has_optimizer=False))
    _assert_refused(ckpt, "no optimizer state")
    _assert_refused(ckpt, "lists arrays its config does not have", with_optimizer=False)
    sampler = Path(shutil.copytree(ckpt, tmp_path / "sampler"))
    arrays = {k: v for k, v in _arrays(sampler).items() if k.startswith("params/")}
    _write_arrays(sampler, arrays, relist=True)
    read_checkpoint(str(sampler), with_optimizer=False)  # a consistent weights-only checkpoint
    _edit_manifest(sampler, lambda m: m.update(has_optimizer=True))
    _assert_refused(sampler, "does not list arrays its config has", "optimizer/")


@pytest.mark.parametrize("keep", [0.0, 0.1, 0.5, 0.9, 0.9999])
def test_a_truncated_npz_is_refused(ckpt: Path, keep: float) -> None:
    data = (ckpt / "arrays.npz").read_bytes()
    (ckpt / "arrays.npz").write_bytes(data[: int(len(data) * keep)])
    _assert_refused(ckpt, "cannot read arrays.npz")


def test_a_corrupt_npz_is_refused(ckpt: Path, tmp_path: Path) -> None:
    data = bytearray((ckpt / "arrays.npz").read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside an array's bytes: the zip CRC no longer matches
    (ckpt / "arrays.npz").write_bytes(bytes(data))
    _assert_refused(ckpt, "cannot read arrays.npz")
    (ckpt / "arrays.npz").write_bytes(b"not a zip file at all")
    _assert_refused(ckpt, "cannot read arrays.npz")
    with zipfile.ZipFile(ckpt / "arrays.npz", "w") as archive:
        archive.writestr("params/embed_V_E.npy", b"\x93NUMPY garbage")
    _assert_refused(ckpt, "cannot read arrays.npz")
    (ckpt / "arrays.npz").unlink()
    _assert_refused(ckpt, "cannot read arrays.npz")
    (ckpt / "arrays.npz").mkdir()
    _assert_refused(ckpt, "cannot read arrays.npz")


def test_a_pickled_array_is_refused(ckpt: Path) -> None:
    arrays: dict[str, Any] = _arrays(ckpt)
    arrays["params/embed_V_E"] = np.array([{"evil": 1}], dtype=object)
    np.savez(ckpt / "arrays.npz", **arrays)
    _assert_refused(ckpt, "cannot read arrays.npz", "allow_pickle")


def test_every_entry_point_turns_a_non_object_manifest_into_checkpoint_error(
    ckpt: Path, tmp_path: Path
) -> None:
    (ckpt / "manifest.json").write_text("[1, 2]")
    service = micro_service(tmp_path)
    trainer = service.create_lora_training_client(base_model=MICRO_NAME).result()
    calls: list[Callable[[], Any]] = [
        lambda: service.create_training_client_from_state(str(ckpt)),
        lambda: service.create_training_client_from_state_with_optimizer(str(ckpt)),
        lambda: service.create_sampling_client(model_path=str(ckpt)),
        lambda: trainer.load_state(str(ckpt)),
        lambda: trainer.load_state_with_optimizer(str(ckpt)),
        lambda: trainer.create_sampling_client(str(ckpt)),
    ]
    for call in calls:
        with pytest.raises(CheckpointError, match="must hold a JSON object"):
            call()
