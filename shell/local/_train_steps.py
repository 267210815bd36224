"""The jitted stages of the local backend's `forward` and `forward_backward`.

A toy model's `forward_backward` (full fine-tuning) runs in three jitted stages so that the
model graph compiles once per `(D, T)` bucket and is shared by every loss:

1. `model_forward_vjp`: the model forward, returning the targets' logprobs and the VJP closure
   with respect to the weights (residual activations);
2. `loss_and_logprob_grad`: the loss and its gradient with respect to those logprobs
   (elementwise maths; one cheap compile per loss and config);
3. `model_backward`: the VJP of the model applied to that gradient, added to the accumulated
   gradient.

The chain rule makes this exactly `value_and_grad` of `loss(target_logprobs(params))`.

A LoRA model's `forward_backward` (adapters on frozen pretrained weights) is that
`value_and_grad` in one jitted stage, `lora_loss_and_grad`: on SmolLM2 (32 datums × 128
tokens, alternating A/B in one process) it ran 4–7% faster than the three stages, with a
bit-identical gradient (XLA neither writes the residuals out as results nor reads them back),
at the price of one model compile per loss and loss config instead of one shared by all. One
call loops over up to `CHUNKS_PER_CALL` chunks of one shape (see its docstring for why). Its
`forward` (no gradient) runs `lora_logprobs`, which keeps no residuals and loops over
chunks alike, then the loss of each chunk.

Timing note: every stage is dispatched asynchronously (JAX). A toy model's `forward_backward`
waits only for the logprobs and metrics, so stage 3 is still running when it returns and the
next call that needs the gradient (`optim_step`) waits for it; a LoRA `forward_backward`
returns when its one stage, backward included, is done.

Conventions: arrays are padded `[D, T]` batches from `shell.local._inputs.pack_rows`
(position `i` predicts target `i`; `valid_D_T` masks padding). The model input is either those
datums' tokens `input_D_T` or, on the prefix-shared route (`pack_prefix_chunk`,
`pack_grouped_chunk`), their trie rows `rlpure.model.PrefixRows` or prefix and suffix rows
`rlpure.model.GroupedRows`, whose logprobs come back `[D, T]` the same: the losses never see
which (`target_logprobs_of`). A batch too large for memory is
split into row chunks whose gradients add up and whose metrics `merge_metrics` combines by
their `name:reduction` suffix. The LoRA stages take chunks of one shape stacked `[X, D, T]`
(`X`: the chunks one call loops over, `CHUNKS_PER_CALL`).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rlpure import model as model_lib
from rlpure.losses import compute_loss
from shell.local._inputs import PackedData

__all__ = [
    "CHUNKS_PER_CALL",
    "ModelInput",
    "lora_logprobs",
    "lora_loss_and_grad",
    "loss_and_logprob_grad",
    "merge_metrics",
    "model_backward",
    "model_forward_vjp",
    "stacked",
    "stacked_model_inputs",
    "target_logprobs_of",
    "zeros_like_tree",
]

# A chunk's model input: right-padded tokens `[D, T]`, the datums' packed prefix tries, or
# the datums grouped by shared prefixes.
ModelInput = jax.Array | model_lib.PrefixRows | model_lib.GroupedRows


def target_logprobs_of(
    params: model_lib.Params,
    model_input: ModelInput,
    target_D_T: jax.Array,
    config: model_lib.ModelConfig,
    adapters: model_lib.Params | None = None,
    lora: model_lib.LoraConfig | None = None,
) -> jax.Array:
    """float32 `lp_D_T` of `target_D_T` after each datum position, whichever the model input
    (`rlpure.model.target_logprobs_fn`, `prefix_target_logprobs_fn` or
    `grouped_target_logprobs_fn`; un-jitted)."""
    if isinstance(model_input, model_lib.GroupedRows):
        return model_lib.grouped_target_logprobs_fn(
            params, model_input, target_D_T, config, adapters, lora
        )
    if isinstance(model_input, model_lib.PrefixRows):
        return model_lib.prefix_target_logprobs_fn(
            params, model_input, target_D_T, config, adapters, lora
        )
    return model_lib.target_logprobs_fn(params, model_input, target_D_T, config, adapters, lora)


def stacked(arrays: list[np.ndarray]) -> np.ndarray:
    """Chunk arrays of one shape stacked `[CHUNKS_PER_CALL, ...]`, zeros after the last: the
    inputs one looped call (`lora_loss_and_grad`, `lora_logprobs`) runs over."""
    out_X = np.zeros((CHUNKS_PER_CALL, *arrays[0].shape), arrays[0].dtype)
    out_X[: len(arrays)] = arrays
    return out_X


def stacked_model_inputs(packs: list[PackedData]) -> ModelInput | np.ndarray:
    """The chunks' model inputs (tokens, prefix rows or grouped rows) stacked as `stacked`
    does."""
    first = packs[0].prefix
    if first is None:
        return stacked([packed.input_D_T for packed in packs])
    fields = [[getattr(packed.prefix, name) for packed in packs] for name in first._fields]
    return type(first)(*(stacked(arrays) for arrays in fields))


def _chunk_of(tree_X: Any, x: jax.Array) -> Any:
    """Chunk `x` of a pytree of arrays stacked `[X, ...]`."""
    return jax.tree_util.tree_map(lambda value: value[x], tree_X)


@partial(jax.jit, static_argnames="config")
def model_forward_vjp(
    params: model_lib.Params,
    input_D_T: ModelInput,
    target_D_T: jax.Array,
    *,
    config: model_lib.ModelConfig,
) -> tuple[jax.Array, Any]:
    """Stage 1: float32 `lp_D_T` (log-probability of `target_D_T`) and the VJP closure.

    `input_D_T` is the chunk's `ModelInput`; `config` is static under `jit`.
    """
    return jax.vjp(lambda p: target_logprobs_of(p, input_D_T, target_D_T, config), params)


def _summed_loss(
    lp_D_T: jax.Array,
    inputs: dict[str, jax.Array],
    valid_D_T: jax.Array,
    loss_fn: str,
    loss_config: tuple[tuple[str, float], ...],
) -> tuple[jax.Array, Any]:
    """(the summed loss, its `rlpure.losses` output) of logprobs `lp_D_T`: what both training
    routes differentiate (with `has_aux`)."""
    out = compute_loss(loss_fn, lp_D_T, inputs, dict(loss_config), valid_mask_D_T=valid_D_T)
    return out.loss, out


# Most chunks one `lora_loss_and_grad` or `lora_logprobs` call loops over (their inputs are
# padded to this many).
CHUNKS_PER_CALL = 16


@partial(jax.jit, static_argnames=("config", "lora", "loss_fn", "loss_config"))
def lora_loss_and_grad(
    adapters: model_lib.Params,
    base: model_lib.Params,
    input_X_D_T: ModelInput,
    inputs_X: dict[str, jax.Array],
    valid_X_D_T: jax.Array,
    n_chunks: jax.Array,
    grads_acc: model_lib.Params,
    *,
    config: model_lib.ModelConfig,
    lora: model_lib.LoraConfig,
    loss_fn: str,
    loss_config: tuple[tuple[str, float], ...],
) -> tuple[Any, model_lib.Params]:
    """LoRA's whole `forward_backward` on the first `n_chunks` of `X` stacked chunks of one
    shape, in one call: each chunk's loss output (`rlpure.losses`, with the targets' logprobs
    `lp_D_T` of the frozen `base` plus `adapters`), stacked `[X, ...]` (zeros after
    `n_chunks`), and `grads_acc` plus the sum of the chunks' gradients with respect to the
    adapters only (the base weights get none), added chunk by chunk in order.

    The chunks run one after another in a `while` loop with a traced trip count, so one
    compile per chunk shape serves any `n_chunks ≤ X`, and XLA's scratch memory (2.1 GB for
    8 × 128 SmolLM2 tokens) is allocated, and its pages faulted in, once per call instead of
    once per chunk: on SmolLM2 4 chunks in one call ran 12–17% faster than 4 calls (alternating,
    one process), with 4× fewer page faults and the same gradient bit for bit.

    `input_X_D_T` is the chunks' `ModelInput`, every array stacked `[X, ...]`;
    `inputs_X` holds `target_tokens` and the loss's other inputs, `[X, D, T]` each;
    `valid_X_D_T` is 1.0 on real positions, 0.0 on padding. `config`, `lora`, `loss_fn` and
    `loss_config` are static under `jit`.
    """

    def one_chunk(x: jax.Array, grads: model_lib.Params) -> tuple[Any, model_lib.Params]:
        inputs = {key: value[x] for key, value in inputs_X.items()}
        input_D_T, valid_D_T = _chunk_of(input_X_D_T, x), valid_X_D_T[x]

        def loss(a: model_lib.Params) -> tuple[jax.Array, Any]:
            lp_D_T = target_logprobs_of(base, input_D_T, inputs["target_tokens"], config, a, lora)
            return _summed_loss(lp_D_T, inputs, valid_D_T, loss_fn, loss_config)

        (_, out), chunk_grads = jax.value_and_grad(loss, has_aux=True)(adapters)
        return out, jax.tree_util.tree_map(jnp.add, grads, chunk_grads)

    def body(x: jax.Array, carry: tuple[Any, model_lib.Params]) -> tuple[Any, model_lib.Params]:
        outs_X, grads = carry
        out, grads = one_chunk(x, grads)
        outs_X = jax.tree_util.tree_map(lambda all_X, one: all_X.at[x].set(one), outs_X, out)
        return outs_X, grads

    n_slots = valid_X_D_T.shape[0]
    shapes = jax.eval_shape(one_chunk, jnp.int32(0), grads_acc)[0]
    zeros_X = jax.tree_util.tree_map(lambda s: jnp.zeros((n_slots, *s.shape), s.dtype), shapes)
    outs_X, total = jax.lax.fori_loop(0, n_chunks, body, (zeros_X, grads_acc))
    return outs_X, total


@partial(jax.jit, static_argnames=("config", "lora"))
def lora_logprobs(
    adapters: model_lib.Params | None,
    base: model_lib.Params,
    input_X_D_T: ModelInput | np.ndarray,
    target_X_D_T: jax.Array | np.ndarray,
    n_chunks: jax.Array | np.ndarray,
    *,
    config: model_lib.ModelConfig,
    lora: model_lib.LoraConfig | None,
) -> jax.Array:
    """float32 `lp_X_D_T` of the frozen `base` plus `adapters` (None, with `lora` None: `base`
    alone, as a sampler scores prompts) on the first `n_chunks` of `X` stacked chunks (zeros
    after), without any VJP residuals (for `forward`): one call loops over them as
    `lora_loss_and_grad` does. `config` and `lora` are static under `jit`."""

    def body(x: jax.Array, lp_X_D_T: jax.Array) -> jax.Array:
        lp_D_T = target_logprobs_of(
            base, _chunk_of(input_X_D_T, x), target_X_D_T[x], config, adapters, lora
        )
        return lp_X_D_T.at[x].set(lp_D_T)

    zeros_X_D_T = jnp.zeros(target_X_D_T.shape, jnp.float32)
    lp_X_D_T: jax.Array = jax.lax.fori_loop(0, n_chunks, body, zeros_X_D_T)
    return lp_X_D_T


@partial(jax.jit, static_argnames=("loss_fn", "loss_config", "with_grad"))
def loss_and_logprob_grad(
    lp_D_T: jax.Array,
    inputs: dict[str, jax.Array],
    valid_D_T: jax.Array,
    *,
    loss_fn: str,
    loss_config: tuple[tuple[str, float], ...],
    with_grad: bool,
) -> tuple[Any, jax.Array | None]:
    """Stage 2: the loss output and, if `with_grad`, its gradient with respect to `lp_D_T`.

    `loss_fn`, `loss_config` and `with_grad` are static under `jit`; `valid_D_T` is 1.0 on
    real positions, 0.0 on padding.
    """

    def loss(lp_D_T: jax.Array) -> tuple[jax.Array, Any]:
        return _summed_loss(lp_D_T, inputs, valid_D_T, loss_fn, loss_config)

    if not with_grad:
        return loss(lp_D_T)[1], None
    (_, out), dlp_D_T = jax.value_and_grad(loss, has_aux=True)(lp_D_T)
    return out, dlp_D_T


@jax.jit
def model_backward(vjp: Any, dlp_D_T: jax.Array, grads_acc: model_lib.Params) -> model_lib.Params:
    """Stage 3: `grads_acc` plus the parameter gradient the VJP gives for `dlp_D_T`."""
    (grads,) = vjp(dlp_D_T)
    total: model_lib.Params = jax.tree_util.tree_map(jnp.add, grads_acc, grads)
    return total


@jax.jit
def zeros_like_tree(params: model_lib.Params) -> model_lib.Params:
    """A zero gradient shaped like `params`."""
    zeros: model_lib.Params = jax.tree_util.tree_map(jnp.zeros_like, params)
    return zeros


def merge_metrics(chunks: list[dict[str, float]]) -> dict[str, float]:
    """Merges per-chunk loss metrics by their `name:reduction` suffix.

    `:sum` adds, `:min`/`:max` take the extreme, `:mean` is weighted by the chunk's
    `action_tokens:sum` (the positions the losses' means run over) when it is positive, else
    by chunk. The extremes skip chunks without action tokens when some chunk has them: those
    report the on-policy placeholder 1.0 (`rlpure.losses`), which is no ratio of the call's. A
    single chunk is returned unchanged.
    """
    if len(chunks) == 1:
        return chunks[0]
    weights = [c.get("action_tokens:sum", 0.0) for c in chunks]
    if sum(weights) <= 0:
        weights = [1.0] * len(chunks)
    measured = [c for c, w in zip(chunks, weights, strict=True) if w > 0]
    out = {}
    for key in chunks[0]:
        values = [c[key] for c in chunks]
        reduction = key.rsplit(":", 1)[-1]
        if reduction == "min":
            out[key] = min(c[key] for c in measured)
        elif reduction == "max":
            out[key] = max(c[key] for c in measured)
        elif reduction == "mean":
            out[key] = sum(w * v for w, v in zip(weights, values, strict=True)) / sum(weights)
        else:
            out[key] = sum(values)
    return out
