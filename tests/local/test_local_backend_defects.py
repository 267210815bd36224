"""Regression tests for defects found when `shell/local_backend.py` was split.

- Malformed checkpoints (a manifest that is not an object, missing or mistyped keys, arrays that
  differ from the manifest or the config, truncated or corrupt `arrays.npz`) raise
  `CheckpointError` naming the checkpoint path, the file and the fault, never `AttributeError`
  or a NumPy/zipfile error.
- Non-Adam optimizers are refused by every factory that takes `optimizer`, as
  `create_lora_training_client` refuses them; the factories' signatures mirror the SDK's.
- Overwriting a checkpoint never deletes the old one before the new one is in place: failures
  injected between the renames leave the old checkpoint readable.
- `QueuedFuture.result(timeout)` honours `timeout` with the builtin `TimeoutError`, as the SDK's
  futures do, and a batch `run` that answers too few requests fails them instead of hanging.

Checkpoints use a micro model config (a few thousand weights), so the file compiles little.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import json
import logging
import os
import shutil
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import msgspec
import numpy as np
import pytest
import tinker
from tinker import types

from rlpure import model as model_lib
from rlpure.model import VOCAB_SIZE, ByteTokenizer
from shell.errors import CheckpointError
from shell.local import LocalSamplingClient, LocalServiceClient, LocalTrainingClient
from shell.local import _checkpoints as local_checkpoints
from shell.local._checkpoints import read_checkpoint, write_checkpoint
from shell.local._futures import QueuedFuture, TickBatcher

MICRO = model_lib.ModelConfig(
    vocab_size=VOCAB_SIZE, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_seq_len=64
)
MICRO_NAME = "test/micro"
MICRO_BUILTINS = msgspec.to_builtins(MICRO)  # the config as a manifest holds it


def _service(tmp_path: Path | None = None, seed: int = 0) -> LocalServiceClient:
    return LocalServiceClient(seed=seed, checkpoint_dir=tmp_path, model_configs={MICRO_NAME: MICRO})


def _trainer(tmp_path: Path) -> LocalTrainingClient:
    return _service(tmp_path).create_lora_training_client(base_model=MICRO_NAME).result()


def _params_equal(a: Any, b: Any) -> bool:
    return all(
        np.array_equal(np.asarray(x), np.asarray(y))
        for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True)
    )


# -- 1. malformed checkpoints ------------------------------------------------------------------


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A valid `"state"` checkpoint of the micro model (copied, never modified, by tests)."""
    params = model_lib.init_params(jax.random.key(0), MICRO)
    directory = tmp_path_factory.mktemp("pristine") / "ckpt"
    write_checkpoint(
        directory,
        base_model=MICRO_NAME,
        config=MICRO,
        params=params,
        opt_state=model_lib.init_optimizer_state(params),
        optim_steps=3,
        kind="state",
        user_metadata={"note": "pristine"},
    )
    return directory


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
    assert _params_equal(checkpoint.params, model_lib.init_params(jax.random.key(0), MICRO))
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
    name = "params/embed_V_D"
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
        archive.writestr("params/embed_V_D.npy", b"\x93NUMPY garbage")
    _assert_refused(ckpt, "cannot read arrays.npz")
    (ckpt / "arrays.npz").unlink()
    _assert_refused(ckpt, "cannot read arrays.npz")
    (ckpt / "arrays.npz").mkdir()
    _assert_refused(ckpt, "cannot read arrays.npz")


def test_a_pickled_array_is_refused(ckpt: Path) -> None:
    arrays: dict[str, Any] = _arrays(ckpt)
    arrays["params/embed_V_D"] = np.array([{"evil": 1}], dtype=object)
    np.savez(ckpt / "arrays.npz", **arrays)
    _assert_refused(ckpt, "cannot read arrays.npz", "allow_pickle")


def test_every_entry_point_turns_a_non_object_manifest_into_checkpoint_error(
    ckpt: Path, tmp_path: Path
) -> None:
    (ckpt / "manifest.json").write_text("[1, 2]")
    service = _service(tmp_path)
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


# -- 2. optimizers -----------------------------------------------------------------------------

NON_ADAM = [
    "sgd",
    types.DimuonOptimizerConfig(),
    types.optimizer.OptimizerConfigBase(type="sgd"),
]


def _factory_calls(service: LocalServiceClient, path: str) -> dict[str, Callable[[Any], Any]]:
    """Every factory that takes `optimizer`, called with it (async ones run to completion)."""
    return {
        "create_lora_training_client": lambda opt: service.create_lora_training_client(
            MICRO_NAME, optimizer=opt
        ),
        "create_lora_training_client_async": lambda opt: asyncio.run(
            service.create_lora_training_client_async(MICRO_NAME, optimizer=opt)
        ),
        "create_training_client_from_state": lambda opt: service.create_training_client_from_state(
            path, optimizer=opt
        ),
        "create_training_client_from_state_async": lambda opt: asyncio.run(
            service.create_training_client_from_state_async(path, optimizer=opt)
        ),
    }


@pytest.mark.parametrize("optimizer", NON_ADAM, ids=["str", "dimuon", "base-sgd"])
def test_every_factory_refuses_a_non_adam_optimizer(
    pristine: Path, tmp_path: Path, optimizer: Any
) -> None:
    service = _service(tmp_path)
    messages = {}
    for name, call in _factory_calls(service, str(pristine)).items():
        with pytest.raises(NotImplementedError, match="Adam optimizer only") as info:
            call(optimizer)
        messages[name] = str(info.value)
    for name, message in messages.items():
        assert name.removesuffix("_async") in message and repr(optimizer) in message


@pytest.mark.parametrize("optimizer", [None, types.AdamOptimizerConfig()], ids=["none", "adam"])
def test_every_factory_accepts_adam(pristine: Path, tmp_path: Path, optimizer: Any) -> None:
    service = _service(tmp_path)
    for call in _factory_calls(service, str(pristine)).values():
        client = call(optimizer)
        client = client.result() if isinstance(client, tinker.APIFuture) else client
        assert isinstance(client, LocalTrainingClient) and client.config == MICRO


@pytest.mark.parametrize(
    "name",
    [
        "create_lora_training_client",
        "create_lora_training_client_async",
        "create_training_client_from_state",
        "create_training_client_from_state_async",
        "create_training_client_from_state_with_optimizer",
        "create_training_client_from_state_with_optimizer_async",
        "create_sampling_client",
        "create_sampling_client_async",
    ],
)
def test_factory_signatures_mirror_the_sdk(name: str) -> None:
    def shape(fn: Any) -> list[tuple[str, Any, Any]]:
        return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]

    assert shape(getattr(LocalServiceClient, name)) == shape(getattr(tinker.ServiceClient, name))


def test_the_async_from_state_factories_forward_every_argument(
    pristine: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = _service()
    seen: dict[str, dict[str, Any]] = {}
    for name in (
        "create_training_client_from_state",
        "create_training_client_from_state_with_optimizer",
    ):
        original = getattr(service, name)

        def spy(*args: Any, _name: str = name, _original: Any = original, **kwargs: Any) -> Any:
            seen[_name] = inspect.signature(_original).bind(*args, **kwargs).arguments
            return _original(*args, **kwargs)

        monkeypatch.setattr(service, name, spy)
    adam = types.AdamOptimizerConfig()
    common: dict[str, Any] = {
        "path": str(pristine),
        "base_model": MICRO_NAME,
        "user_metadata": {"k": "v"},
        "weights_access_token": "token",
    }
    asyncio.run(service.create_training_client_from_state_async(**common, optimizer=adam))
    asyncio.run(service.create_training_client_from_state_with_optimizer_async(**common))
    assert seen == {
        "create_training_client_from_state": {**common, "optimizer": adam},
        "create_training_client_from_state_with_optimizer": common,
    }


def test_no_client_method_is_annotated_any() -> None:
    for cls in (LocalServiceClient, LocalTrainingClient, LocalSamplingClient):
        for name, member in vars(cls).items():
            if inspect.isfunction(member):
                returned = inspect.signature(member).return_annotation
                assert returned != "Any", f"{cls.__name__}.{name} is annotated -> Any"


# -- 3. crash-safe overwrite -------------------------------------------------------------------


def _hidden_siblings(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.parent.iterdir() if p.name.startswith("."))


def _step(trainer: LocalTrainingClient) -> None:
    """One Adam step that changes the weights without a gradient (decoupled weight decay)."""
    trainer.optim_step(types.AdamParams(learning_rate=0.1, weight_decay=0.5)).result()


def _fail_replace(
    monkeypatch: pytest.MonkeyPatch, *, fail_when: Callable[[str], bool]
) -> list[tuple[str, str]]:
    """Makes `os.replace` (as the checkpoint module sees it) raise for chosen sources."""
    real_replace = os.replace
    calls: list[tuple[str, str]] = []

    def replace(src: Any, dst: Any) -> None:
        calls.append((Path(src).name, Path(dst).name))
        if fail_when(Path(src).name):
            raise OSError(f"injected failure moving {src}")
        real_replace(src, dst)

    monkeypatch.setattr(local_checkpoints.os, "replace", replace)
    return calls


def test_an_overwrite_leaves_only_the_new_checkpoint(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path)
    path = Path(trainer.save_state("ckpt").result().path)
    _step(trainer)
    assert trainer.save_state("ckpt", overwrite=True).result().path == str(path)
    checkpoint = read_checkpoint(str(path), with_optimizer=True)
    assert checkpoint.optim_steps == 1 and _params_equal(checkpoint.params, trainer.params)
    assert _hidden_siblings(path) == []


def _failed_overwrite(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, fail_when: Callable[[str], bool]
) -> tuple[LocalTrainingClient, Path, Any, list[tuple[str, str]]]:
    """Saves checkpoint "ckpt", takes a step, and overwrites it while `os.replace` fails for the
    sources `fail_when` picks. Returns the trainer, the path, the saved weights and the
    `os.replace` calls (source and destination names)."""
    trainer = _trainer(tmp_path)
    path = Path(trainer.save_state("ckpt").result().path)
    old_params = trainer.params
    _step(trainer)
    calls = _fail_replace(monkeypatch, fail_when=fail_when)
    with pytest.raises(OSError, match="injected failure"):
        trainer.save_state("ckpt", overwrite=True)
    monkeypatch.undo()
    return trainer, path, old_params, calls


def test_a_failed_move_into_place_keeps_the_old_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer, path, old_params, calls = _failed_overwrite(
        tmp_path, monkeypatch, fail_when=lambda src: ".tmp-" in src
    )
    assert calls[-1][1] == "ckpt"  # the old one was put back
    checkpoint = read_checkpoint(str(path), with_optimizer=True)
    assert checkpoint.optim_steps == 0 and _params_equal(checkpoint.params, old_params)
    assert _hidden_siblings(path) == []
    # Sampler checkpoints (always overwritten) follow the same path.
    sampler_path = Path(trainer.save_weights_for_sampler("s").result().path)
    _fail_replace(monkeypatch, fail_when=lambda src: ".tmp-" in src)
    _step(trainer)
    with pytest.raises(OSError, match="injected failure"):
        trainer.save_weights_for_sampler("s")
    monkeypatch.undo()
    assert read_checkpoint(str(sampler_path), with_optimizer=False).optim_steps == 1


def test_a_crash_between_the_renames_loses_no_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The move-in and the put-back both fail: the state a crash between the renames leaves.
    _, path, old_params, _ = _failed_overwrite(
        tmp_path, monkeypatch, fail_when=lambda src: ".tmp-" in src or ".old-" in src
    )
    (aside,) = [name for name in _hidden_siblings(path) if name.startswith(".ckpt.old-")]
    checkpoint = read_checkpoint(str(path.parent / aside), with_optimizer=True)
    assert checkpoint.optim_steps == 0 and _params_equal(checkpoint.params, old_params)
    with pytest.raises(CheckpointError, match="interrupted write") as info:
        read_checkpoint(str(path), with_optimizer=True)
    assert aside in str(info.value)


def test_a_failure_while_writing_keeps_the_old_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer = _trainer(tmp_path)
    path = Path(trainer.save_state("ckpt").result().path)
    _step(trainer)

    def savez(*args: Any, **kwargs: Any) -> None:
        raise OSError("injected: disk full")

    monkeypatch.setattr(local_checkpoints.np, "savez", savez)
    with pytest.raises(OSError, match="disk full"):
        trainer.save_state("ckpt", overwrite=True)
    monkeypatch.undo()
    assert read_checkpoint(str(path), with_optimizer=True).optim_steps == 0
    assert _hidden_siblings(path) == []


# -- 4. QueuedFuture timeouts ------------------------------------------------------------------


class _ScriptedRun:
    """A batch `run` that answers `f"done:{request}"` after `delay` seconds, counting calls."""

    def __init__(self, delay: float = 0.0, drop: int = 0) -> None:
        self.delay = delay
        self.drop = drop  # answers this many requests too few
        self.batches: list[list[str]] = []

    def __call__(self, requests: list[str]) -> list[str]:
        self.batches.append(list(requests))
        time.sleep(self.delay)
        return [f"done:{r}" for r in requests][: len(requests) - self.drop]


def test_a_zero_or_negative_timeout_on_a_queued_request_raises_without_serving() -> None:
    async def scenario() -> None:
        run = _ScriptedRun()
        batcher: TickBatcher[str, str] = TickBatcher(asyncio.get_running_loop(), run)
        future = batcher.submit("a")
        for timeout in (0, -1.0):
            with pytest.raises(TimeoutError, match="still queued"):
                future.result(timeout=timeout)
        assert run.batches == []
        assert await future == "done:a"  # served by the next tick as usual
        assert future.result(timeout=0) == "done:a"  # a served request ignores the timeout
        assert run.batches == [["a"]]

    asyncio.run(scenario())


def test_a_batch_slower_than_the_timeout_raises_and_keeps_the_response() -> None:
    async def scenario() -> None:
        run = _ScriptedRun(delay=0.05)
        batcher: TickBatcher[str, str] = TickBatcher(asyncio.get_running_loop(), run)
        first, second = batcher.submit("a"), batcher.submit("b")
        with pytest.raises(TimeoutError, match=r"over timeout=0\.01") as info:
            first.result(timeout=0.01)
        assert isinstance(info.value, concurrent.futures.TimeoutError)  # what the SDK raises
        assert first.result() == "done:a" and second.result(timeout=0.01) == "done:b"
        assert run.batches == [["a", "b"]]  # served once, together
        third = batcher.submit("c")
        assert third.result(timeout=60) == "done:c"

    asyncio.run(scenario())


def test_result_async_honours_its_timeout() -> None:
    async def scenario() -> None:
        run = _ScriptedRun()
        batcher: TickBatcher[str, str] = TickBatcher(asyncio.get_running_loop(), run)
        future = batcher.submit("a")
        with pytest.raises(TimeoutError):
            await future.result_async(timeout=0)
        assert await future.result_async(timeout=60) == "done:a"

    asyncio.run(scenario())


def test_a_queued_sample_honours_the_timeout(tmp_path: Path) -> None:
    sampler = _service(tmp_path).create_sampling_client(base_model=MICRO_NAME).result()
    prompt = types.ModelInput.from_ints(ByteTokenizer().encode("hi"))
    params = types.SamplingParams(max_tokens=4, seed=1, stop=[])

    async def scenario() -> types.SampleResponse:
        future = sampler.sample(prompt, 2, params)
        assert isinstance(future, QueuedFuture)
        with pytest.raises(TimeoutError):
            future.result(timeout=0)
        return await future

    response = asyncio.run(scenario())
    expected = sampler.sample(prompt, 2, params).result(timeout=0)  # ready: no loop running
    assert [s.tokens for s in response.sequences] == [s.tokens for s in expected.sequences]


def test_a_run_answering_too_few_requests_fails_them_instead_of_hanging() -> None:
    async def scenario() -> None:
        batcher: TickBatcher[str, str] = TickBatcher(
            asyncio.get_running_loop(), _ScriptedRun(drop=1)
        )
        futures = [batcher.submit("a"), batcher.submit("b")]
        for future in futures:
            with pytest.raises(ValueError, match="returned 1 responses for 2 requests"):
                await asyncio.wait_for(future.result_async(), timeout=5)

    asyncio.run(scenario())


def test_a_failed_cleanup_of_the_old_copy_does_not_fail_the_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    trainer = _trainer(tmp_path)
    path = Path(trainer.save_state("ckpt").result().path)
    _step(trainer)
    real_rmtree = shutil.rmtree

    def rmtree(target: Any, *args: Any, **kwargs: Any) -> None:
        if ".old-" in Path(target).name:
            raise OSError("injected failure deleting the old copy")
        real_rmtree(target, *args, **kwargs)

    monkeypatch.setattr(local_checkpoints.shutil, "rmtree", rmtree)
    with caplog.at_level(logging.WARNING):
        assert trainer.save_state("ckpt", overwrite=True).result().path == str(path)
    monkeypatch.undo()
    checkpoint = read_checkpoint(str(path), with_optimizer=True)
    assert checkpoint.optim_steps == 1 and _params_equal(checkpoint.params, trainer.params)
    (aside,) = [name for name in _hidden_siblings(path) if name.startswith(".ckpt.old-")]
    assert aside in caplog.text and "was not deleted" in caplog.text
