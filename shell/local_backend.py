"""A local, offline stand-in for the Tinker service: the SDK's clients over `rlpure.model`.

Swap `tinker.ServiceClient()` for `LocalServiceClient(seed=...)` and Tinker code runs on the CPU
with a small JAX transformer, deterministically, with no API key. The clients accept and return
the real `tinker` types (`ModelInput`, `Datum`, `TensorData`, `SamplingParams`, `AdamParams`,
`SampleResponse`, `ForwardBackwardOutput`, `OptimStepResponse`, ...), with the SDK 0.38.0
method names, signatures and return conventions:

- `forward_backward`, `optim_step`, `sample`, `save_state`, ... return an `APIFuture`
  (a `tinker.APIFuture`: `await f`, `await f.result_async()`, `f.result()`, `f.future()`).
  The deprecated `*_async` variants are `async def`s that return what the SDK's do:
  `await forward_backward_async(...)` gives the `APIFuture`; `await sample_async(...)` gives
  the `SampleResponse`; `await create_lora_training_client_async(...)` gives the client.
- `create_lora_training_client`, `create_sampling_client` and
  `save_weights_and_get_sampling_client` return a future of the client that can be awaited,
  `.result()`-ed, or (deprecated, as in the SDK) used as the client directly.

Semantics and decisions:
- **Full fine-tuning, not LoRA.** `rank`, `train_mlp`, `train_attn`, `train_unembed` are
  accepted for compatibility and ignored; every weight trains. `base_model` names a config of
  `rlpure.model.MODEL_CONFIGS` (`"rlpure/tiny"`, `"rlpure/small"`) or of the service's
  `model_configs`; checkpoints carry their own config. There are no pretrained
  local weights: a service's *base model* is `init_params(key(service seed))`, and, as LoRA
  clients on Tinker all start from the same base function, every training client and
  `create_sampling_client(base_model=...)` of the service starts from those weights, unless
  `seed` is passed to `create_lora_training_client` (then `init_params(key(seed))`).
- **Training ops run eagerly, in call order**, when called (the SDK orders them by request id
  on the server; here the order of calls is the order of execution). Gradients of the summed
  loss accumulate across `forward_backward` calls until `optim_step` applies them (AdamW,
  `torch.optim.AdamW` semantics, global-norm clipping first; see `rlpure.model`).
- **Losses** are `rlpure.losses.compute_loss`: `cross_entropy`, `importance_sampling`, `ppo`,
  `cispo`, `dro`, `gspo`. `loss_fn_config` values are static under `jit` (a new value
  recompiles). Unknown `loss_fn_inputs` keys are refused with an error naming the datum and key:
  the cookbook's `mask` key is not a Tinker input (its RL loop strips it, `_remove_mask`,
  before `forward_backward`), so sending it is a bug we surface rather than ignore.
- **Sampling** returns the model's untempered logprob of each sampled token (what training
  computes; on-policy ratios are 1 to ~1e-6). `temperature=0` is greedy; `top_k`/`top_p` are
  honoured. `stop`: `None` stops at EOS; `[]` disables every stop, EOS included (Tinker's
  documented rule); a non-empty list of token ids or strings stops at those *and* at EOS. Stop
  strings match the UTF-8 bytes of the generated tokens (the tokenizer is byte-level), never
  across the prompt boundary. The stop token or string is included in the returned tokens, as
  on Tinker. `max_tokens=None` means "until the context (`max_seq_len`) is full".
- **Batching**: inside a running event loop, `sample` requests are queued and served together:
  the queue is flushed once an event-loop tick passes with no new request, so the
  `asyncio.gather` of 32 prompts × 8 samples becomes one jitted call (or a few, at most
  `max_batch_rows` rows each). The flush runs on the event loop thread, so batch composition
  depends only on the order coroutines run, never on wall time: runs are reproducible. Outside a
  running loop, `sample` computes at once. `future.result()` on a queued request flushes the
  queue immediately instead of deadlocking.
- **Determinism**: same service seed and same sequence of calls ⇒ identical tokens, logprobs
  and weights, and a run resumed from `save_state` (same seed) continues exactly as the
  uninterrupted run would have. A sample's randomness depends only on its key material, never
  on its batch: `SamplingParams.seed=s` keys sample `i` with `(s, 0, 0, 0, 0, i)`; otherwise
  request `r` of a sampling client uses `(service seed, *stream, r, i)` where the client's
  `stream` is `(1, optimizer steps so far, index of the sampling client since that step)` for
  `save_weights_and_get_sampling_client` (the step count is checkpointed) and
  `(2, index among the service's create_sampling_client calls, 0)` otherwise. Sampling
  clients of different training clients at the same step share streams (their weights
  differ).
- **Shapes are bucketed** (powers of two on batch rows, prompt length, new tokens, datums and
  datum length), so a run compiles a handful of times. Large calls are split to bound memory
  (`max_batch_tokens` for sampling, `max_train_tokens` for `forward_backward`, whose chunks'
  gradients add up and whose metrics merge by their `:sum`/`:mean`/`:min`/`:max` suffix).
- **Checkpoints** (`save_state`, `save_weights_for_sampler`) are directories holding
  `arrays.npz` (loaded with `allow_pickle=False`) and `manifest.json`; the returned path is the
  directory's absolute filesystem path, accepted by `load_state`,
  `create_training_client_from_state[_with_optimizer]` and `create_sampling_client`. As in the
  SDK, `load_state` restores weights only and `load_state_with_optimizer` weights and Adam
  state. They live under `checkpoint_dir` (default: a fresh temporary directory per service).
- Clients are not thread-safe: use them from one thread (typically the event loop's).
- Not supported (raise `NotImplementedError`): custom losses, `topk_*` logprobs,
  `target_prompt_logprobs`, `prompt_alt_tokens_k`, non-Adam optimizers, multimodal chunks.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from types import MappingProxyType
from typing import Any, Generic, TypeVar

import jax
import jax.numpy as jnp
import msgspec
import numpy as np
import tinker
from tinker import types

from rlpure import model as model_lib
from rlpure.losses import KNOWN_LOSS_INPUTS, LOSSES, compute_loss
from rlpure.tokenizer import EOS_ID, ByteTokenizer
from shell.errors import CheckpointError, ConfigError

__all__ = [
    "LocalSamplingClient",
    "LocalServiceClient",
    "LocalTrainingClient",
]

T = TypeVar("T")
C = TypeVar("C")

_CHECKPOINT_FORMAT = "rlpure-local-checkpoint-v1"
_UINT32 = 1 << 32
_ATTENTION_ELEMENTS = 1 << 25  # float32 attention scores per layer per call (128 MiB)


# --- futures ---------------------------------------------------------------------------------


class ReadyFuture(tinker.APIFuture[T]):
    """An `APIFuture` whose outcome is already known (local ops complete when called).

    Public so other shell code that must hand a ready value to SDK-style callers reuses it.
    """

    def __init__(self, value: T) -> None:
        self._value = value

    def result(self, timeout: float | None = None) -> T:
        return self._value

    async def result_async(self, timeout: float | None = None) -> T:
        return self._value

    def future(self) -> concurrent.futures.Future[T]:
        out: concurrent.futures.Future[T] = concurrent.futures.Future()
        out.set_result(self._value)
        return out


class _ClientFuture(ReadyFuture[C], Generic[C]):
    """A ready future of a client that also forwards attribute access to the client.

    Mirrors the SDK's `BackcompatTrainingClientFuture` / `BackcompatSamplingClientFuture`:
    `await f` or `f.result()` is the supported way; using `f` as the client still works.
    """

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._value, name)


class _QueuedFuture(tinker.APIFuture[T]):
    """A sample request waiting in a `_SampleBatcher` queue."""

    def __init__(self, batcher: _SampleBatcher, inner: asyncio.Future[T]) -> None:
        self._batcher = batcher
        self._inner = inner

    def result(self, timeout: float | None = None) -> T:
        if not self._inner.done():
            self._batcher.flush()
        return self._inner.result()

    async def result_async(self, timeout: float | None = None) -> T:
        async with asyncio.timeout(timeout):
            return await asyncio.shield(self._inner)

    def future(self) -> concurrent.futures.Future[T]:
        out: concurrent.futures.Future[T] = concurrent.futures.Future()
        try:
            out.set_result(self.result())
        except Exception as err:
            out.set_exception(err)
        return out


# --- sampling requests and the micro-batcher -------------------------------------------------


class _SampleRequest(msgspec.Struct, frozen=True, kw_only=True, eq=False):
    """One validated `sample` call: its prompt and per-row settings, before batching."""

    prompt_T: np.ndarray
    num_samples: int
    max_new_tokens: int
    temperature: float
    top_k: int
    top_p: float
    key_material_N_K: np.ndarray
    stop_token_ids: tuple[int, ...]
    stop_sequences: tuple[tuple[int, ...], ...]
    include_prompt_logprobs: bool
    request_index: int


class _SampleBatcher:
    """Collects the `sample` requests of one event loop and serves them in one jitted call."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        run: Callable[[list[_SampleRequest]], list[types.SampleResponse]],
    ) -> None:
        self.loop = loop
        self._run = run
        self._pending: list[tuple[_SampleRequest, asyncio.Future[types.SampleResponse]]] = []
        self._flush_task: asyncio.Task[None] | None = None

    def submit(self, request: _SampleRequest) -> _QueuedFuture[types.SampleResponse]:
        inner: asyncio.Future[types.SampleResponse] = self.loop.create_future()
        self._pending.append((request, inner))
        if self._flush_task is None:
            self._flush_task = self.loop.create_task(self._flush_when_settled())
        return _QueuedFuture(self, inner)

    async def _flush_when_settled(self) -> None:
        seen = -1
        while seen != len(self._pending):
            seen = len(self._pending)
            await asyncio.sleep(0)
        self._flush_task = None
        self.flush()

    def flush(self) -> None:
        """Serves every queued request now (on the calling thread)."""
        pending, self._pending = self._pending, []
        live = [(req, fut) for req, fut in pending if not fut.done()]
        if not live:
            return
        try:
            responses = self._run([req for req, _ in live])
        except Exception as err:
            for _, fut in live:
                if not fut.done():
                    fut.set_exception(err)
            return
        for (_, fut), response in zip(live, responses, strict=True):
            if not fut.done():
                fut.set_result(response)


# --- helpers ---------------------------------------------------------------------------------


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _model_input_tokens(model_input: Any, where: str) -> np.ndarray:
    if not isinstance(model_input, types.ModelInput):
        raise TypeError(f"{where}: expected tinker.ModelInput, got {type(model_input).__name__}")
    for i, chunk in enumerate(model_input.chunks):
        if not isinstance(chunk, types.EncodedTextChunk):
            raise NotImplementedError(
                f"{where}.chunks[{i}]: {type(chunk).__name__} is not supported by the local "
                "backend (token chunks only)"
            )
    return np.asarray(model_input.to_ints(), np.int64).reshape(-1)


def _check_token_range(tokens: np.ndarray, vocab_size: int, where: str) -> None:
    if tokens.size and (tokens.min() < 0 or tokens.max() >= vocab_size):
        bad = int(np.argmax((tokens < 0) | (tokens >= vocab_size)))
        raise ValueError(
            f"{where}: token {int(tokens[bad])} at position {bad} is outside [0, {vocab_size})"
        )


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


def _to_float(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{where}: expected a number, got {type(value).__name__}")
    out = float(value)
    if not math.isfinite(out):
        raise ValueError(f"{where}: expected a finite number, got {out}")
    return out


# --- jitted training steps -------------------------------------------------------------------


# `forward_backward` runs in three jitted stages so that the expensive model graph compiles once
# per (D, T) bucket and is shared by every loss: (1) the model forward, returning the targets'
# logprobs and the VJP closure (residual activations); (2) the loss and its gradient with respect
# to those logprobs (elementwise maths; one cheap compile per loss and config); (3) the VJP of the
# model applied to that gradient, added to the accumulated gradient. The chain rule makes this
# exactly `value_and_grad` of `loss(target_logprobs(params))`.


@partial(jax.jit, static_argnames="config")
def _model_forward_vjp(
    params: model_lib.Params,
    input_D_T: jax.Array,
    target_D_T: jax.Array,
    *,
    config: model_lib.ModelConfig,
) -> tuple[jax.Array, Any]:
    return jax.vjp(lambda p: model_lib.target_logprobs_fn(p, input_D_T, target_D_T, config), params)


@partial(jax.jit, static_argnames=("loss_fn", "loss_config", "with_grad"))
def _loss_and_logprob_grad(
    lp_D_T: jax.Array,
    inputs: dict[str, jax.Array],
    valid_D_T: jax.Array,
    *,
    loss_fn: str,
    loss_config: tuple[tuple[str, float], ...],
    with_grad: bool,
) -> tuple[Any, jax.Array | None]:
    def loss(lp_D_T: jax.Array) -> tuple[jax.Array, Any]:
        out = compute_loss(loss_fn, lp_D_T, inputs, dict(loss_config), valid_mask_D_T=valid_D_T)
        return out.loss, out

    if not with_grad:
        return loss(lp_D_T)[1], None
    (_, out), dlp_D_T = jax.value_and_grad(loss, has_aux=True)(lp_D_T)
    return out, dlp_D_T


@jax.jit
def _model_backward(vjp: Any, dlp_D_T: jax.Array, grads_acc: model_lib.Params) -> model_lib.Params:
    (grads,) = vjp(dlp_D_T)
    return jax.tree_util.tree_map(jnp.add, grads_acc, grads)


@jax.jit
def _zeros_like_tree(params: model_lib.Params) -> model_lib.Params:
    return jax.tree_util.tree_map(jnp.zeros_like, params)


def _floor_power_of_two(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def _merge_metrics(chunks: list[dict[str, float]]) -> dict[str, float]:
    """Merges per-chunk loss metrics by their `name:reduction` suffix.

    `:sum` adds, `:min`/`:max` take the extreme, `:mean` is weighted by the chunk's
    `action_tokens:sum` (the positions the losses' means run over) when it is positive, else
    by chunk. A single chunk is returned unchanged.
    """
    if len(chunks) == 1:
        return chunks[0]
    weights = [c.get("action_tokens:sum", 0.0) for c in chunks]
    if sum(weights) <= 0:
        weights = [1.0] * len(chunks)
    out = {}
    for key in chunks[0]:
        values = [c[key] for c in chunks]
        reduction = key.rsplit(":", 1)[-1]
        if reduction == "min":
            out[key] = min(values)
        elif reduction == "max":
            out[key] = max(values)
        elif reduction == "mean":
            out[key] = sum(w * v for w, v in zip(weights, values, strict=True)) / sum(weights)
        else:
            out[key] = sum(values)
    return out


class _PackedData(msgspec.Struct, frozen=True, kw_only=True, eq=False):
    """`tinker.Datum`s packed to bucketed `[D, T]` arrays (host-side numpy)."""

    input_D_T: np.ndarray
    inputs: dict[str, np.ndarray]
    valid_D_T: np.ndarray
    length_D: np.ndarray


def _pack_data(
    data: Sequence[types.Datum], loss_fn: str, config: model_lib.ModelConfig
) -> _PackedData:
    """Validates `data` and packs it right-padded into bucketed arrays."""
    if isinstance(data, types.Datum) or not isinstance(data, Sequence):
        raise TypeError("forward_backward: data must be a list of tinker.Datum")
    if not data:
        raise ValueError("forward_backward: no data provided")
    if loss_fn not in LOSSES:
        if loss_fn == "custom":
            raise NotImplementedError("the local backend does not support custom losses")
        raise ValueError(f"unknown loss_fn {loss_fn!r}; known losses: {sorted(LOSSES)}")
    tokens_D: list[np.ndarray] = []
    inputs_D: list[dict[str, np.ndarray]] = []
    keys: frozenset[str] | None = None
    for d, datum in enumerate(data):
        where = f"Datum[{d}]"
        if not isinstance(datum, types.Datum):
            raise TypeError(f"{where}: expected tinker.Datum, got {type(datum).__name__}")
        tokens = _model_input_tokens(datum.model_input, f"{where}.model_input")
        if tokens.size == 0:
            raise ValueError(f"{where}.model_input: empty")
        if tokens.size > config.max_seq_len:
            raise ValueError(
                f"{where}.model_input: length {tokens.size} exceeds the model's max_seq_len "
                f"{config.max_seq_len}"
            )
        _check_token_range(tokens, config.vocab_size, f"{where}.model_input")
        arrays = {}
        for key, tensor in datum.loss_fn_inputs.items():
            if key not in KNOWN_LOSS_INPUTS:
                hint = (
                    " (the cookbook's 'mask' is not a Tinker input; strip it before "
                    "forward_backward as tinker_cookbook.rl.train._remove_mask does)"
                    if key == "mask"
                    else ""
                )
                raise ValueError(
                    f"{where}.loss_fn_inputs: unknown key {key!r}; Tinker inputs are "
                    f"{sorted(KNOWN_LOSS_INPUTS)}{hint}"
                )
            if tensor.sparse_crow_indices is not None:
                raise NotImplementedError(f"{where}.loss_fn_inputs[{key!r}]: sparse TensorData")
            arr = np.asarray(tensor.to_numpy())
            if arr.shape != tokens.shape:
                raise ValueError(
                    f"{where}.loss_fn_inputs[{key!r}]: shape {arr.shape} != model_input "
                    f"shape {tokens.shape}"
                )
            if key == "target_tokens":
                if arr.dtype.kind not in "iu":
                    raise TypeError(
                        f"{where}.loss_fn_inputs['target_tokens']: expected integer token ids, "
                        f"got dtype {arr.dtype}"
                    )
                _check_token_range(
                    arr, config.vocab_size, f"{where}.loss_fn_inputs['target_tokens']"
                )
            elif not np.all(np.isfinite(arr)):
                raise ValueError(f"{where}.loss_fn_inputs[{key!r}]: non-finite values")
            arrays[key] = arr
        if keys is None:
            keys = frozenset(arrays)
        elif frozenset(arrays) != keys:
            raise ValueError(
                f"{where}.loss_fn_inputs: keys {sorted(arrays)} differ from Datum[0]'s "
                f"{sorted(keys)}"
            )
        tokens_D.append(tokens)
        inputs_D.append(arrays)
    assert keys is not None
    missing = [k for k in LOSSES[loss_fn].required_inputs if k not in keys]
    if missing:
        raise ValueError(f"{loss_fn}: every datum needs loss_fn_inputs {missing}")
    n_d = model_lib.bucket_size(len(data))
    n_t = model_lib.bucket_size(max(t.size for t in tokens_D), minimum=16)
    input_D_T = np.zeros((n_d, n_t), np.int32)
    valid_D_T = np.zeros((n_d, n_t), np.float32)
    inputs = {
        key: np.zeros((n_d, n_t), np.int32 if key == "target_tokens" else np.float32)
        for key in sorted(keys)
    }
    length_D = np.zeros(len(data), np.int64)
    for d, (tokens, arrays) in enumerate(zip(tokens_D, inputs_D, strict=True)):
        n = tokens.size
        length_D[d] = n
        input_D_T[d, :n] = tokens
        valid_D_T[d, :n] = 1.0
        for key, arr in arrays.items():
            inputs[key][d, :n] = arr
    return _PackedData(input_D_T=input_D_T, inputs=inputs, valid_D_T=valid_D_T, length_D=length_D)


def _loss_config_key(loss_fn_config: Mapping[str, Any] | None) -> tuple[tuple[str, float], ...]:
    if loss_fn_config is None:
        return ()
    if not isinstance(loss_fn_config, Mapping):
        raise TypeError("loss_fn_config: expected a mapping of name to number")
    return tuple(
        sorted((str(k), _to_float(v, f"loss_fn_config[{k!r}]")) for k, v in loss_fn_config.items())
    )


# --- checkpoints -----------------------------------------------------------------------------


def _write_checkpoint(
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


class _Checkpoint(msgspec.Struct, frozen=True, kw_only=True):
    base_model: str
    config: model_lib.ModelConfig
    params: Any
    opt_state: Any | None
    optim_steps: int


def _read_checkpoint(path: str, *, with_optimizer: bool) -> _Checkpoint:
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
    return _Checkpoint(
        base_model=str(manifest.get("base_model")),
        config=config,
        params=params,
        opt_state=opt_state,
        optim_steps=optim_steps,
    )


def _checkpoint_name(name: Any) -> str:
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name:
        raise ValueError(f"checkpoint name must be a non-empty file name, got {name!r}")
    return name


# --- clients ---------------------------------------------------------------------------------


class LocalSamplingClient:
    """Samples from a fixed snapshot of weights (the SDK's `SamplingClient`).

    Create it with `LocalTrainingClient.save_weights_and_get_sampling_client()` or
    `LocalServiceClient.create_sampling_client(...)`.
    """

    def __init__(
        self,
        *,
        service: LocalServiceClient,
        base_model: str,
        config: model_lib.ModelConfig,
        params: model_lib.Params,
        stream: tuple[int, int, int] = (2, 0, 0),
    ) -> None:
        """Internal: use the factory methods. `stream` names this client's random stream
        (see the module docstring, "Determinism")."""
        self._service = service
        self._base_model = base_model
        self._config = config
        self._params = params
        self._stream = stream
        self._requests = 0
        self._tokenizer = ByteTokenizer()
        self._batcher: _SampleBatcher | None = None

    # -- SDK surface --

    def get_tokenizer(self) -> ByteTokenizer:
        return self._tokenizer

    def get_base_model(self) -> str:
        return self._base_model

    async def get_base_model_async(self) -> str:
        return self._base_model

    def sample(
        self,
        prompt: types.ModelInput,
        num_samples: int,
        sampling_params: types.SamplingParams,
        include_prompt_logprobs: bool = False,
        topk_prompt_logprobs: int = 0,
        topk_sample_logprobs: int = 0,
        target_prompt_logprobs: types.TensorData | None = None,
        prompt_alt_tokens_k: int = 0,
        prompt_logprobs_last_n: int | None = None,
    ) -> tinker.APIFuture[types.SampleResponse]:
        """Draws `num_samples` completions of `prompt` (see the module docstring for semantics).

        Returns:
            An `APIFuture[tinker.SampleResponse]`; each `SampledSequence` carries int tokens,
            float32 untempered logprobs and `stop_reason` `"stop"` or `"length"`.

        Raises:
            TypeError, ValueError: bad prompt, count or sampling parameters (raised here, at
                submission).
            NotImplementedError: for top-k logprobs, target prompt logprobs, alt tokens.
        """
        for name, value in (
            ("topk_prompt_logprobs", topk_prompt_logprobs),
            ("topk_sample_logprobs", topk_sample_logprobs),
            ("prompt_alt_tokens_k", prompt_alt_tokens_k),
        ):
            if value:
                raise NotImplementedError(f"sample: {name} is not supported by the local backend")
        if target_prompt_logprobs is not None:
            raise NotImplementedError("sample: target_prompt_logprobs is not supported locally")
        if prompt_logprobs_last_n is not None:
            raise NotImplementedError("sample: prompt_logprobs_last_n is not supported locally")
        request = self._make_request(
            prompt, num_samples, sampling_params, include_prompt_logprobs=include_prompt_logprobs
        )
        loop = _running_loop()
        if loop is None:
            return ReadyFuture(self._run_requests([request])[0])
        if self._batcher is None or self._batcher.loop is not loop:
            self._batcher = _SampleBatcher(loop, self._run_requests)
        return self._batcher.submit(request)

    async def sample_async(
        self,
        prompt: types.ModelInput,
        num_samples: int,
        sampling_params: types.SamplingParams,
        include_prompt_logprobs: bool = False,
        topk_prompt_logprobs: int = 0,
        topk_sample_logprobs: int = 0,
        target_prompt_logprobs: types.TensorData | None = None,
        prompt_alt_tokens_k: int = 0,
        prompt_logprobs_last_n: int | None = None,
    ) -> types.SampleResponse:
        """`await sample(...)` (the SDK's deprecated async form; returns the response)."""
        return await self.sample(
            prompt,
            num_samples,
            sampling_params,
            include_prompt_logprobs,
            topk_prompt_logprobs,
            topk_sample_logprobs,
            target_prompt_logprobs,
            prompt_alt_tokens_k,
            prompt_logprobs_last_n,
        )

    def compute_logprobs(
        self, prompt: types.ModelInput, prompt_logprobs_last_n: int | None = None
    ) -> tinker.APIFuture[list[float | None]]:
        """Logprob of every prompt token given the ones before it (`None` for the first)."""
        tokens = _model_input_tokens(prompt, "compute_logprobs.prompt")
        _check_token_range(tokens, self._config.vocab_size, "compute_logprobs.prompt")
        if tokens.size > self._config.max_seq_len:
            raise ValueError(
                f"compute_logprobs.prompt: length {tokens.size} exceeds max_seq_len "
                f"{self._config.max_seq_len}"
            )
        n = int(tokens.size)
        if prompt_logprobs_last_n is not None and not 1 <= prompt_logprobs_last_n <= n - 1:
            raise ValueError(
                f"compute_logprobs: prompt_logprobs_last_n must be in [1, {n - 1}], "
                f"got {prompt_logprobs_last_n}"
            )
        values = self._prompt_logprobs(tokens)
        out: list[float | None] = [None if math.isnan(x) else float(x) for x in values]
        if prompt_logprobs_last_n is not None:
            skipped: list[float | None] = [None] * (n - prompt_logprobs_last_n)
            out = skipped + out[n - prompt_logprobs_last_n :]
        return ReadyFuture(out)

    async def compute_logprobs_async(
        self, prompt: types.ModelInput, prompt_logprobs_last_n: int | None = None
    ) -> list[float | None]:
        return await self.compute_logprobs(prompt, prompt_logprobs_last_n)

    # -- internals --

    def _make_request(
        self,
        prompt: Any,
        num_samples: Any,
        params: Any,
        *,
        include_prompt_logprobs: bool,
    ) -> _SampleRequest:
        config = self._config
        tokens = _model_input_tokens(prompt, "sample.prompt")
        if tokens.size == 0:
            raise ValueError("sample.prompt: empty prompt")
        _check_token_range(tokens, config.vocab_size, "sample.prompt")
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
            raise ValueError(f"sample.num_samples: expected an int >= 1, got {num_samples!r}")
        if not isinstance(params, types.SamplingParams):
            raise TypeError(
                f"sample.sampling_params: expected tinker.SamplingParams, got "
                f"{type(params).__name__}"
            )
        room = config.max_seq_len - int(tokens.size)
        if params.max_tokens is None:
            max_new = room
        else:
            max_new = int(params.max_tokens)
            if max_new < 1:
                raise ValueError(f"SamplingParams.max_tokens: expected >= 1, got {max_new}")
        if max_new > room or room < 1:
            raise ValueError(
                f"sample: prompt length {tokens.size} + max_tokens {max_new} exceeds the "
                f"model's context length {config.max_seq_len}"
            )
        temperature = _to_float(params.temperature, "SamplingParams.temperature")
        if temperature < 0:
            raise ValueError(f"SamplingParams.temperature: expected >= 0, got {temperature}")
        top_p = _to_float(params.top_p, "SamplingParams.top_p")
        if not 0 < top_p <= 1:
            raise ValueError(f"SamplingParams.top_p: expected in (0, 1], got {top_p}")
        top_k = int(params.top_k)
        stop_ids, stop_seqs = self._stop_conditions(params.stop)
        request_index = self._service._next_sample_request_index()
        if params.seed is not None:
            material = (int(params.seed), 0, 0, 0, 0)
        else:
            material = (self._service.seed, *self._stream, self._requests)
        self._requests += 1
        key_material = np.array(
            [[m % _UINT32 for m in material] + [i] for i in range(num_samples)], np.uint32
        )
        return _SampleRequest(
            prompt_T=tokens.astype(np.int32),
            num_samples=num_samples,
            max_new_tokens=max_new,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            key_material_N_K=key_material,
            stop_token_ids=stop_ids,
            stop_sequences=stop_seqs,
            include_prompt_logprobs=bool(include_prompt_logprobs),
            request_index=request_index,
        )

    def _stop_conditions(self, stop: Any) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
        if stop is None:
            return (EOS_ID,), ()
        if isinstance(stop, str):
            stop = [stop]
        stop = list(stop)
        if not stop:
            return (), ()
        if all(isinstance(s, str) for s in stop):
            seqs = []
            for s in stop:
                encoded = tuple(self._tokenizer.encode(s, add_special_tokens=False))
                if not encoded:
                    raise ValueError("SamplingParams.stop: empty stop string")
                seqs.append(encoded)
            return (EOS_ID,), tuple(seqs)
        if all(isinstance(s, int) and not isinstance(s, bool) for s in stop):
            ids = np.asarray(stop, np.int64)
            _check_token_range(ids, self._config.vocab_size, "SamplingParams.stop")
            return tuple(sorted({EOS_ID, *map(int, stop)})), ()
        raise TypeError("SamplingParams.stop: expected strings or token ids, not a mix")

    def _prompt_logprobs(self, tokens: np.ndarray) -> np.ndarray:
        """float32 `[N]`: NaN at 0, then `log p(tokens[i] | tokens[:i])`."""
        n = int(tokens.size)
        out = np.full(n, np.nan, np.float32)
        if n < 2:
            return out
        # The training forward's buckets, so scoring shares its compiled executable.
        width = model_lib.bucket_size(n - 1, minimum=16)
        inputs = np.zeros((model_lib.bucket_size(1), width), np.int32)
        targets = np.zeros_like(inputs)
        inputs[0, : n - 1] = tokens[:-1]
        targets[0, : n - 1] = tokens[1:]
        lp, _ = _model_forward_vjp(self._params, inputs, targets, config=self._config)
        out[1:] = np.asarray(lp)[0, : n - 1]
        return out

    def _run_requests(self, requests: list[_SampleRequest]) -> list[types.SampleResponse]:
        """Serves `requests` with as few jitted calls as the memory limits allow.

        Rows (one per sample) are served in order, in chunks of at most `_sampling_rows` rows;
        a request's samples may span chunks.
        """
        rows = [(r, i) for r in requests for i in range(r.num_samples)]
        prompt_width = model_lib.bucket_size(max(r.prompt_T.size for r in requests), minimum=16)
        new_width = model_lib.bucket_size(max(r.max_new_tokens for r in requests), minimum=16)
        per_chunk = self._service._sampling_rows(self._config, prompt_width, new_width)
        sequences: list[types.SampledSequence] = []
        for start in range(0, len(rows), per_chunk):
            sequences.extend(self._run_rows(rows[start : start + per_chunk]))
        responses = []
        start = 0
        for r in requests:
            prompt_lp = self._prompt_logprobs(r.prompt_T) if r.include_prompt_logprobs else None
            responses.append(
                types.SampleResponse(
                    sequences=sequences[start : start + r.num_samples],
                    prompt_logprobs_np=prompt_lp,
                )
            )
            start += r.num_samples
        return responses

    def _run_rows(self, rows: list[tuple[_SampleRequest, int]]) -> list[types.SampledSequence]:
        """One jitted `sample_tokens` call for `rows` (request, sample index), padded to buckets."""
        config = self._config
        requests = [r for r, _ in rows]
        b = model_lib.bucket_size(len(rows))
        t = model_lib.bucket_size(max(r.prompt_T.size for r in requests), minimum=16)
        m = model_lib.bucket_size(max(r.max_new_tokens for r in requests), minimum=16)
        n_seqs = model_lib.bucket_size(max(len(r.stop_sequences) for r in requests), minimum=4)
        window = model_lib.bucket_size(
            max([1, *(len(s) for r in requests for s in r.stop_sequences)]), minimum=8
        )
        prompt_B_T = np.zeros((b, t), np.int32)
        length_B = np.ones(b, np.int32)
        max_new_B = np.zeros(b, np.int32)
        temperature_B = np.zeros(b, np.float32)
        top_k_B = np.zeros(b, np.int32)
        top_p_B = np.ones(b, np.float32)
        key_material_B_K = np.zeros((b, requests[0].key_material_N_K.shape[1]), np.uint32)
        stop_mask_B_V = np.zeros((b, config.vocab_size), bool)
        stop_seqs_B_S_L = np.full((b, n_seqs, window), -1, np.int32)
        stop_valid_B_S = np.zeros((b, n_seqs), bool)
        for row, (r, i) in enumerate(rows):
            prompt_B_T[row, : r.prompt_T.size] = r.prompt_T
            length_B[row] = r.prompt_T.size
            max_new_B[row] = r.max_new_tokens
            temperature_B[row] = r.temperature
            top_k_B[row] = r.top_k
            top_p_B[row] = r.top_p
            key_material_B_K[row] = r.key_material_N_K[i]
            stop_mask_B_V[row, list(r.stop_token_ids)] = True
            for s, seq in enumerate(r.stop_sequences):
                stop_seqs_B_S_L[row, s, window - len(seq) :] = seq
                stop_valid_B_S[row, s] = True
        batch = model_lib.SampleBatch(
            prompt_tokens_B_T=prompt_B_T,
            prompt_length_B=length_B,
            max_new_tokens_B=max_new_B,
            temperature_B=temperature_B,
            top_k_B=top_k_B,
            top_p_B=top_p_B,
            key_material_B_K=key_material_B_K,
            stop_token_mask_B_V=stop_mask_B_V,
            stop_seqs_B_S_L=stop_seqs_B_S_L,
            stop_seq_valid_B_S=stop_valid_B_S,
        )
        out = model_lib.sample_tokens(self._params, batch, config=config, max_new_tokens=m)
        tokens_B_M = np.asarray(out.tokens_B_M)
        logprobs_B_M = np.asarray(out.logprobs_B_M)
        num_B = np.asarray(out.num_tokens_B)
        stopped_B = np.asarray(out.stopped_B)
        return [
            types.SampledSequence(
                stop_reason="stop" if stopped_B[row] else "length",
                sequence_id=f"local-{r.request_index}-{i}",
                tokens_np=tokens_B_M[row, : num_B[row]].copy(),
                logprobs_np=logprobs_B_M[row, : num_B[row]].copy(),
            )
            for row, (r, i) in enumerate(rows)
        ]


class LocalTrainingClient:
    """Trains a local model (the SDK's `TrainingClient`; full fine-tuning, see module doc)."""

    def __init__(
        self,
        *,
        service: LocalServiceClient,
        base_model: str,
        config: model_lib.ModelConfig,
        params: model_lib.Params,
        opt_state: Any,
        model_id: str,
        lora_rank: int,
        optim_steps: int = 0,
    ) -> None:
        self._service = service
        self._base_model = base_model
        self._config = config
        self._params = params
        self._opt_state = opt_state
        self._grads: model_lib.Params | None = None
        self._tokenizer = ByteTokenizer()
        self.model_id = model_id
        self._lora_rank = lora_rank
        self._optim_steps = optim_steps  # checkpointed: keys the sampling streams
        self._samplers_this_step = 0

    @property
    def params(self) -> model_lib.Params:
        """The current weights (an immutable pytree; replaced, never mutated, by `optim_step`)."""
        return self._params

    @property
    def config(self) -> model_lib.ModelConfig:
        return self._config

    def get_tokenizer(self) -> ByteTokenizer:
        return self._tokenizer

    def get_info(self) -> types.GetInfoResponse:
        return types.GetInfoResponse(
            model_data=types.ModelData(
                arch="rlpure-transformer", model_name=self._base_model, tokenizer_id="rlpure/byte"
            ),
            model_id=self.model_id,
            is_lora=False,
            lora_rank=self._lora_rank,
            model_name=self._base_model,
        )

    async def get_info_async(self) -> types.GetInfoResponse:
        return self.get_info()

    # -- forward / backward --

    def forward(
        self,
        data: list[types.Datum],
        loss_fn: types.LossFnType,
        loss_fn_config: Mapping[str, float | str] | None = None,
    ) -> tinker.APIFuture[types.ForwardBackwardOutput]:
        """Loss, logprobs and metrics without gradients."""
        return ReadyFuture(self._run(data, loss_fn, loss_fn_config, backward=False))

    async def forward_async(
        self,
        data: list[types.Datum],
        loss_fn: types.LossFnType,
        loss_fn_config: Mapping[str, float | str] | None = None,
    ) -> tinker.APIFuture[types.ForwardBackwardOutput]:
        return self.forward(data, loss_fn, loss_fn_config)

    def forward_backward(
        self,
        data: list[types.Datum],
        loss_fn: types.LossFnType,
        loss_fn_config: Mapping[str, float | str] | None = None,
    ) -> tinker.APIFuture[types.ForwardBackwardOutput]:
        """Computes the summed loss and adds its gradient to the accumulated gradient.

        Args:
            data: datums; `model_input` of length `N_d` and every `loss_fn_inputs` tensor 1-D of
                length `N_d` (Tinker's shifted alignment: input position `i` predicts
                `target_tokens[i]`).
            loss_fn: a loss of `rlpure.losses.LOSSES`.
            loss_fn_config: loss hyper-parameters (e.g. `clip_low_threshold`).

        Returns:
            `APIFuture[ForwardBackwardOutput]`: `loss_fn_outputs[d]["logprobs"]` is a float32
            `TensorData` of length `N_d`; `metrics` holds `loss:sum` and the loss's metrics.

        Raises:
            TypeError, ValueError: malformed data (naming the datum and key) or config.
        """
        return ReadyFuture(self._run(data, loss_fn, loss_fn_config, backward=True))

    async def forward_backward_async(
        self,
        data: list[types.Datum],
        loss_fn: types.LossFnType,
        loss_fn_config: Mapping[str, float | str] | None = None,
    ) -> tinker.APIFuture[types.ForwardBackwardOutput]:
        return self.forward_backward(data, loss_fn, loss_fn_config)

    def forward_backward_custom(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("the local backend does not support custom losses")

    async def forward_backward_custom_async(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("the local backend does not support custom losses")

    def _run(
        self,
        data: list[types.Datum],
        loss_fn: str,
        loss_fn_config: Mapping[str, Any] | None,
        *,
        backward: bool,
    ) -> types.ForwardBackwardOutput:
        packed = _pack_data(data, loss_fn, self._config)
        loss_config = _loss_config_key(loss_fn_config)
        n_d, n_t = packed.input_D_T.shape
        rows = self._service._training_rows(self._config, n_d, n_t)
        grads = self._grads
        lp_chunks, metric_chunks = [], []
        for start in range(0, n_d, rows):
            part = slice(start, start + rows)
            inputs = {key: value[part] for key, value in packed.inputs.items()}
            lp_D_T, vjp = _model_forward_vjp(
                self._params,
                packed.input_D_T[part],
                inputs["target_tokens"],
                config=self._config,
            )
            out, dlp_D_T = _loss_and_logprob_grad(
                lp_D_T,
                inputs,
                packed.valid_D_T[part],
                loss_fn=loss_fn,
                loss_config=loss_config,
                with_grad=backward,
            )
            if backward:
                if grads is None:
                    grads = _zeros_like_tree(self._params)
                grads = _model_backward(vjp, dlp_D_T, grads)
            lp_chunks.append(np.asarray(out.target_logprobs_D_T))
            metric_chunks.append({key: float(value) for key, value in out.metrics.items()})
        if backward:
            self._grads = grads
        lp_D_T = np.concatenate(lp_chunks)
        metrics = _merge_metrics(metric_chunks)
        outputs = [
            {"logprobs": types.TensorData.from_numpy(lp_D_T[d, :n].astype(np.float32))}
            for d, n in enumerate(packed.length_D)
        ]
        return types.ForwardBackwardOutput(
            loss_fn_output_type="ArrayRecord", loss_fn_outputs=outputs, metrics=metrics
        )

    # -- optimiser --

    def optim_step(
        self,
        optim_params: types.AdamParams | None = None,
        *,
        adam_params: types.AdamParams | None = None,
    ) -> tinker.APIFuture[types.OptimStepResponse]:
        """Applies one AdamW step with the gradients accumulated since the last step.

        Honours `learning_rate`, `beta1`, `beta2`, `eps`, `weight_decay` (decoupled) and
        `grad_clip_norm` (0 = off); changing them never recompiles. With no accumulated
        gradient the step uses zeros (Adam's momentum still moves the weights).

        Returns:
            `APIFuture[OptimStepResponse]` with metric `grad_norm` (before clipping).
        """
        if optim_params is not None and adam_params is not None:
            raise ValueError("Specify optim_params or legacy adam_params, not both")
        params = optim_params if optim_params is not None else adam_params
        if not isinstance(params, types.AdamParams):
            raise NotImplementedError(
                f"optim_step: the local backend supports tinker.AdamParams only, got "
                f"{type(params).__name__}"
            )
        hyper = model_lib.AdamHyperparams(
            learning_rate=_to_float(params.learning_rate, "AdamParams.learning_rate"),
            beta1=_to_float(params.beta1, "AdamParams.beta1"),
            beta2=_to_float(params.beta2, "AdamParams.beta2"),
            eps=_to_float(params.eps, "AdamParams.eps"),
            weight_decay=_to_float(params.weight_decay, "AdamParams.weight_decay"),
            grad_clip_norm=_to_float(params.grad_clip_norm, "AdamParams.grad_clip_norm"),
        )
        grads = self._grads if self._grads is not None else _zeros_like_tree(self._params)
        self._params, self._opt_state, grad_norm = model_lib.apply_adam_update(
            self._params, self._opt_state, grads, hyper
        )
        self._grads = None
        self._optim_steps += 1
        self._samplers_this_step = 0
        return ReadyFuture(types.OptimStepResponse(metrics={"grad_norm": float(grad_norm)}))

    async def optim_step_async(
        self,
        optim_params: types.AdamParams | None = None,
        *,
        adam_params: types.AdamParams | None = None,
    ) -> tinker.APIFuture[types.OptimStepResponse]:
        return self.optim_step(optim_params, adam_params=adam_params)

    # -- weights and checkpoints --

    def _sampling_client(self) -> LocalSamplingClient:
        stream = (1, self._optim_steps, self._samplers_this_step)
        self._samplers_this_step += 1
        return LocalSamplingClient(
            service=self._service,
            base_model=self._base_model,
            config=self._config,
            params=self._params,
            stream=stream,
        )

    def save_weights_and_get_sampling_client(
        self,
        name: str | None = None,
        retry_config: Any = None,
        record_stability_info: bool = False,
        kind: str = "snapshot",
    ) -> _ClientFuture[LocalSamplingClient]:
        """A sampling client on a snapshot of the current weights (nothing written to disk).

        `kind="inflight"` is accepted and also gives a snapshot (which satisfies the SDK's
        "these weights or newer" contract).
        """
        if kind not in ("snapshot", "inflight"):
            raise ValueError(f"kind: expected 'snapshot' or 'inflight', got {kind!r}")
        return _ClientFuture(self._sampling_client())

    async def save_weights_and_get_sampling_client_async(
        self,
        name: str | None = None,
        retry_config: Any = None,
        record_stability_info: bool = False,
        kind: str = "snapshot",
    ) -> LocalSamplingClient:
        return await self.save_weights_and_get_sampling_client(
            name, retry_config, record_stability_info, kind
        )

    def save_state(
        self,
        name: str,
        ttl_seconds: int | None = None,
        overwrite: bool = False,
        user_metadata: dict[str, str] | None = None,
    ) -> tinker.APIFuture[types.SaveWeightsResponse]:
        """Saves weights and Adam state; `.path` is the checkpoint directory's absolute path.

        Raises:
            FileExistsError: if the checkpoint exists and `overwrite` is False.
        """
        directory = self._service._checkpoint_path(self.model_id, "state", name, overwrite)
        _write_checkpoint(
            directory,
            base_model=self._base_model,
            config=self._config,
            params=self._params,
            opt_state=self._opt_state,
            optim_steps=self._optim_steps,
            kind="state",
            user_metadata=user_metadata,
        )
        return ReadyFuture(types.SaveWeightsResponse(path=str(directory)))

    async def save_state_async(
        self,
        name: str,
        ttl_seconds: int | None = None,
        overwrite: bool = False,
        user_metadata: dict[str, str] | None = None,
    ) -> tinker.APIFuture[types.SaveWeightsResponse]:
        return self.save_state(name, ttl_seconds, overwrite, user_metadata)

    def save_weights_for_sampler(
        self,
        name: str,
        ttl_seconds: int | None = None,
        user_metadata: dict[str, str] | None = None,
    ) -> tinker.APIFuture[types.SaveWeightsForSamplerResponse]:
        """Saves the weights (no optimizer state) for `create_sampling_client(model_path=...)`."""
        directory = self._service._checkpoint_path(self.model_id, "sampler", name, True)
        _write_checkpoint(
            directory,
            base_model=self._base_model,
            config=self._config,
            params=self._params,
            opt_state=None,
            optim_steps=self._optim_steps,
            kind="sampler",
            user_metadata=user_metadata,
        )
        return ReadyFuture(types.SaveWeightsForSamplerResponse(path=str(directory)))

    async def save_weights_for_sampler_async(
        self,
        name: str,
        ttl_seconds: int | None = None,
        user_metadata: dict[str, str] | None = None,
    ) -> tinker.APIFuture[types.SaveWeightsForSamplerResponse]:
        return self.save_weights_for_sampler(name, ttl_seconds, user_metadata)

    def create_sampling_client(
        self, model_path: str, retry_config: Any = None, record_stability_info: bool = False
    ) -> _ClientFuture[LocalSamplingClient]:
        return self._service.create_sampling_client(model_path=model_path)

    async def create_sampling_client_async(
        self, model_path: str, retry_config: Any = None, record_stability_info: bool = False
    ) -> LocalSamplingClient:
        return await self.create_sampling_client(model_path)

    def _load(self, path: str, *, with_optimizer: bool) -> types.LoadWeightsResponse:
        checkpoint = _read_checkpoint(path, with_optimizer=with_optimizer)
        if checkpoint.config != self._config:
            raise CheckpointError(
                f"checkpoint {path!r}: model config {checkpoint.config} does not match this "
                f"client's {self._config}"
            )
        self._params = checkpoint.params
        self._opt_state = (
            checkpoint.opt_state
            if with_optimizer
            else model_lib.init_optimizer_state(checkpoint.params)
        )
        self._grads = None
        self._optim_steps = checkpoint.optim_steps
        self._samplers_this_step = 0
        return types.LoadWeightsResponse(path=path, model_id=self.model_id)

    def load_state(
        self, path: str, weights_access_token: str | None = None
    ) -> tinker.APIFuture[types.LoadWeightsResponse]:
        """Loads weights only (the optimizer restarts), as the SDK's `load_state` does."""
        return ReadyFuture(self._load(path, with_optimizer=False))

    async def load_state_async(
        self, path: str, weights_access_token: str | None = None
    ) -> tinker.APIFuture[types.LoadWeightsResponse]:
        return self.load_state(path)

    def load_state_with_optimizer(
        self, path: str, weights_access_token: str | None = None
    ) -> tinker.APIFuture[types.LoadWeightsResponse]:
        """Loads weights and Adam state: training continues exactly as if never interrupted."""
        return ReadyFuture(self._load(path, with_optimizer=True))

    async def load_state_with_optimizer_async(
        self, path: str, weights_access_token: str | None = None
    ) -> tinker.APIFuture[types.LoadWeightsResponse]:
        return self.load_state_with_optimizer(path)


class LocalServiceClient:
    """Entry point, the SDK's `ServiceClient`, backed by local JAX models.

    Args:
        seed: the run's seed: model init and unseeded sampling derive from it.
        checkpoint_dir: where checkpoints are written (default: a new temporary directory).
        max_batch_rows: most sample rows served by one jitted sampling call.
        max_batch_tokens: most `rows × (prompt bucket + new-token bucket)` per sampling call
            (bounds the KV cache and prefill memory for long prompts).
        model_configs: extra named model configs (`base_model` name → `ModelConfig`), added to
            (or overriding) `rlpure.model.MODEL_CONFIGS` for this service.
        max_train_tokens: most `datums × length bucket` per jitted training call; larger
            `forward_backward` batches run in chunks (gradients add up, metrics merge by
            suffix), so long sequences do not exhaust memory.

    Examples:
        >>> service = LocalServiceClient(seed=0)
        >>> trainer = service.create_lora_training_client(base_model="rlpure/tiny").result()
        >>> trainer.get_tokenizer().decode([104, 105])
        'hi'
    """

    def __init__(
        self,
        seed: int = 0,
        *,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        max_batch_rows: int = 512,
        max_batch_tokens: int = 65_536,
        max_train_tokens: int = 16_384,
        model_configs: Mapping[str, model_lib.ModelConfig] | None = None,
    ) -> None:
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"LocalServiceClient.seed: expected an int >= 0, got {seed!r}")
        if max_batch_rows < 1:
            raise ValueError(
                f"LocalServiceClient.max_batch_rows: expected >= 1, got {max_batch_rows}"
            )
        self.seed = seed
        for name, value in (
            ("max_batch_tokens", max_batch_tokens),
            ("max_train_tokens", max_train_tokens),
        ):
            if value < 1:
                raise ValueError(f"LocalServiceClient.{name}: expected >= 1, got {value}")
        self.max_batch_rows = max_batch_rows
        self.max_batch_tokens = max_batch_tokens
        self.max_train_tokens = max_train_tokens
        self.model_configs: Mapping[str, model_lib.ModelConfig] = MappingProxyType(
            {**model_lib.MODEL_CONFIGS, **(model_configs or {})}
        )
        self._checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else None
        self._training_clients = 0
        self._sampling_clients = 0
        self._sample_requests = 0

    def __enter__(self) -> LocalServiceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Nothing to release (kept for the SDK's interface)."""

    # -- internals --

    def _sampling_rows(
        self, config: model_lib.ModelConfig, prompt_width: int, new_width: int
    ) -> int:
        """Rows per sampling call: within `max_batch_rows`, `max_batch_tokens` and the
        attention budget (prefill scores `rows × H × T × (T + M)` floats), a power of two."""
        width = prompt_width + new_width
        attention_per_row = config.n_heads * prompt_width * width
        return _floor_power_of_two(
            min(
                self.max_batch_rows,
                self.max_batch_tokens // width,
                _ATTENTION_ELEMENTS // attention_per_row,
            )
        )

    def _training_rows(self, config: model_lib.ModelConfig, n_rows: int, width: int) -> int:
        """Datums per training call: within `max_train_tokens` and the attention budget
        (`rows × H × T²` floats of attention weights per layer), a power of two."""
        attention_per_row = config.n_heads * width * width
        return min(
            n_rows,
            _floor_power_of_two(
                min(self.max_train_tokens // width, _ATTENTION_ELEMENTS // attention_per_row)
            ),
        )

    def _next_sample_request_index(self) -> int:
        index = self._sample_requests
        self._sample_requests += 1
        return index

    def _checkpoint_path(self, model_id: str, kind: str, name: str, overwrite: bool) -> Path:
        if self._checkpoint_dir is None:
            self._checkpoint_dir = Path(tempfile.mkdtemp(prefix="rlpure-local-"))
        directory = (self._checkpoint_dir / model_id / kind / _checkpoint_name(name)).resolve()
        if directory.exists() and not overwrite:
            raise FileExistsError(f"checkpoint {str(directory)!r} exists (pass overwrite=True)")
        return directory

    def _new_training_client(
        self,
        base_model: str,
        *,
        params: model_lib.Params | None,
        opt_state: Any | None,
        seed: int | None,
        rank: int,
        config: model_lib.ModelConfig | None = None,
        optim_steps: int = 0,
    ) -> LocalTrainingClient:
        if config is None:
            config = self.model_configs.get(base_model)
            if config is None:
                raise ConfigError(
                    f"unknown local model {base_model!r}; known models: "
                    f"{sorted(self.model_configs)}"
                )
        index = self._training_clients
        self._training_clients += 1
        if params is None:
            params = model_lib.init_params(
                jax.random.key(self.seed if seed is None else seed), config
            )
        if opt_state is None:
            opt_state = model_lib.init_optimizer_state(params)
        return LocalTrainingClient(
            service=self,
            base_model=base_model,
            config=config,
            params=params,
            opt_state=opt_state,
            model_id=f"local-{self.seed}-{index}",
            lora_rank=rank,
            optim_steps=optim_steps,
        )

    # -- SDK surface --

    def get_server_capabilities(self) -> types.GetServerCapabilitiesResponse:
        """The local model configs, all trainable and sampleable."""
        return types.GetServerCapabilitiesResponse(
            supported_models=[
                types.SupportedModel(
                    model_name=name,
                    max_context_length=config.max_seq_len,
                    trainable=True,
                    sampleable=True,
                )
                for name, config in sorted(self.model_configs.items())
            ]
        )

    async def get_server_capabilities_async(self) -> types.GetServerCapabilitiesResponse:
        return self.get_server_capabilities()

    def create_lora_training_client(
        self,
        base_model: str,
        rank: int = 32,
        seed: int | None = None,
        train_mlp: bool = True,
        train_attn: bool = True,
        train_unembed: bool = True,
        user_metadata: dict[str, str] | None = None,
        optimizer: Any = None,
    ) -> _ClientFuture[LocalTrainingClient]:
        """A training client on a freshly initialised local model (full fine-tuning: `rank`
        and the `train_*` flags are accepted and ignored).

        Raises:
            ConfigError: unknown `base_model` (the message lists the known names).
        """
        if optimizer is not None and not isinstance(optimizer, types.AdamOptimizerConfig):
            raise NotImplementedError("the local backend supports the Adam optimizer only")
        return _ClientFuture(
            self._new_training_client(base_model, params=None, opt_state=None, seed=seed, rank=rank)
        )

    async def create_lora_training_client_async(
        self,
        base_model: str,
        rank: int = 32,
        seed: int | None = None,
        train_mlp: bool = True,
        train_attn: bool = True,
        train_unembed: bool = True,
        user_metadata: dict[str, str] | None = None,
        optimizer: Any = None,
    ) -> LocalTrainingClient:
        return await self.create_lora_training_client(
            base_model, rank, seed, train_mlp, train_attn, train_unembed, user_metadata, optimizer
        )

    def _from_state(self, path: str, base_model: str | None, with_optimizer: bool) -> Any:
        checkpoint = _read_checkpoint(path, with_optimizer=with_optimizer)
        name = base_model if base_model is not None else checkpoint.base_model
        if base_model is not None and self.model_configs.get(base_model) != checkpoint.config:
            raise CheckpointError(
                f"checkpoint {path!r}: its model config does not match base model {name!r}"
            )
        client = self._new_training_client(
            name,
            params=checkpoint.params,
            opt_state=checkpoint.opt_state,
            seed=None,
            rank=0,
            config=checkpoint.config,
            optim_steps=checkpoint.optim_steps,
        )
        return _ClientFuture(client)

    def create_training_client_from_state(
        self,
        path: str,
        base_model: str | None = None,
        user_metadata: dict[str, str] | None = None,
        weights_access_token: str | None = None,
        optimizer: Any = None,
    ) -> _ClientFuture[LocalTrainingClient]:
        """A training client with the checkpoint's weights and a fresh optimizer."""
        return self._from_state(path, base_model, with_optimizer=False)

    async def create_training_client_from_state_async(
        self,
        path: str,
        base_model: str | None = None,
        user_metadata: dict[str, str] | None = None,
        weights_access_token: str | None = None,
        optimizer: Any = None,
    ) -> LocalTrainingClient:
        return await self.create_training_client_from_state(path, base_model)

    def create_training_client_from_state_with_optimizer(
        self,
        path: str,
        base_model: str | None = None,
        user_metadata: dict[str, str] | None = None,
        weights_access_token: str | None = None,
    ) -> _ClientFuture[LocalTrainingClient]:
        """A training client with the checkpoint's weights and Adam state."""
        return self._from_state(path, base_model, with_optimizer=True)

    async def create_training_client_from_state_with_optimizer_async(
        self,
        path: str,
        base_model: str | None = None,
        user_metadata: dict[str, str] | None = None,
        weights_access_token: str | None = None,
    ) -> LocalTrainingClient:
        return await self.create_training_client_from_state_with_optimizer(path, base_model)

    def create_sampling_client(
        self,
        model_path: str | None = None,
        base_model: str | None = None,
        retry_config: Any = None,
        record_stability_info: bool = False,
    ) -> _ClientFuture[LocalSamplingClient]:
        """A sampling client on saved weights (`model_path`) or on the service's base model
        (the weights every training client of this service starts from).
        """
        stream = (2, self._sampling_clients, 0)
        if model_path is not None:
            checkpoint = _read_checkpoint(model_path, with_optimizer=False)
            name, config, params = checkpoint.base_model, checkpoint.config, checkpoint.params
        elif base_model is not None:
            if base_model not in self.model_configs:
                raise ConfigError(
                    f"unknown local model {base_model!r}; known models: "
                    f"{sorted(self.model_configs)}"
                )
            config = self.model_configs[base_model]
            name, params = base_model, model_lib.init_params(jax.random.key(self.seed), config)
        else:
            raise ValueError("Either model_path or base_model must be provided")
        self._sampling_clients += 1
        return _ClientFuture(
            LocalSamplingClient(
                service=self, base_model=name, config=config, params=params, stream=stream
            )
        )

    async def create_sampling_client_async(
        self,
        model_path: str | None = None,
        base_model: str | None = None,
        retry_config: Any = None,
        record_stability_info: bool = False,
    ) -> LocalSamplingClient:
        return await self.create_sampling_client(model_path, base_model)
