"""Sampling from the transformer with a KV cache: `sample_tokens` and its batch records.

The local backend's sampler (`shell.local`) pads requests into a `SampleBatch`, calls
`sample_tokens` and reads the `SampleOutput`; the model itself is `rlpure.model._transformer`.

Axes (STYLE's table; `M`, `K`, `Q`, `W` and `Y` are new here):
    B rows (one per sample), P distinct prompts, Y rows per prompt, T prompt positions,
    S positions in a KV cache (`T + M` in one buffer; `T` and `M` when kept in two parts),
    L layers, H query heads, N key/value heads, C head width, E model width, V vocabulary,
    M the static bucket of new tokens, K words of per-row key material, Q stop-sequence slots,
    W the stop-sequence window (the longest stop sequence, in tokens).

Conventions:
- `sample_tokens` prefills the padded prompts once into a KV cache, then decodes one
  token per row per step inside a `jax.lax.while_loop` over a fixed (bucketed) number of new
  tokens, leaving early when every row has stopped. A row stops on a stop token, on a stop
  sequence completed by its generated tokens (the stop token/sequence is *included* in the
  output, as on Tinker), or at its own `max_new_tokens` (`"length"`). Returned logprobs are
  the log-softmax of the chosen token under the tempered distribution it was drawn from, as
  Tinker reports them; at temperature 1 (or 0, greedy) that is the quantity `target_logprobs`
  computes, so on-policy importance ratios are 1 (to float32 rounding).
- Prompts are right-padded (each row at least one real token); stop sequences are
  right-aligned in their `W` window and left-padded with -1. The KV cache holds keys and
  values as `L` arrays each, keys `[·, N, C, ·]` and values `[·, N, ·, C]` (`prefill` /
  `decode_layers`, the same for every model family); the weights are split per layer once
  per call, before the loop. The `P` distinct prompts are prefilled once: with
  `SampleBatch.rows_per_prompt = Y > 1` their cache `[P, …, T]` is read once per step by
  their `Y` rows each and the loop carries only the generated tokens' `[B, …, M]`
  (`decode_layers_shared_prompts`); otherwise each row holds its own `[B, …, T + M]`, its
  prompt's copied in (`prompt_index_B`). Prompts that begin with the same
  `SampleBatch.shared_prefix_length` tokens have that prefix computed once
  (`prefill_shared_prefix`; the same cache up to rounding).
- Top-k/top-p filtering masks logits to `NEG_INF` and only shapes the draw; the reported
  logprob is unfiltered. Each row's randomness depends on its own key material and the step
  index only, never on the rest of the batch.
- Shapes are bucketed by the caller (`rlpure.buckets.bucket_size`, powers of two); `config`
  and the number of new tokens are static under `jit`, everything else is traced.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import msgspec
import numpy as np

from rlpure.model._config import ModelConfig
from rlpure.model._grouped_forward import prefill_shared_prefix
from rlpure.model._layers import NEG_INF
from rlpure.model._lora import LoraConfig
from rlpure.model._transformer import (
    DecodeOutput,
    KVCache,
    Params,
    _logits,
    decode_layers,
    decode_layers_shared_prompts,
    prefill,
    split_layers,
)

__all__ = [
    "SampleBatch",
    "SampleOutput",
    "prompt_alt_tokens",
    "sample_tokens",
    "stop_string_end",
    "tempered_token_logprobs",
    "topk_tempered_logprobs",
]


class SampleBatch(msgspec.Struct, frozen=True, kw_only=True, eq=False):
    """A padded batch of sampling requests, one row per sample (travels through `jit`).

    Attributes:
        prompt_tokens_B_T: int32 `[B, T]` right-padded prompts (each row at least 1 token).
        prompt_length_B: int32 `[B]` real prompt length of each row (≥ 1).
        max_new_tokens_B: int32 `[B]` tokens each row may generate (0 for padding rows).
        temperature_B: float32 `[B]`; 0 means greedy (argmax).
        top_k_B: int32 `[B]`; keep the `k` most likely tokens, `≤ 0` keeps all.
        top_p_B: float32 `[B]`; nucleus mass kept, `≥ 1` keeps all.
        key_material_B_K: uint32 `[B, K]` per-row key material `(m_0, …, m_{K−1})`, `K ≥ 1`:
            the row's key is `key(m_0)` folded (`jax.random.fold_in`) with `m_1`, …, `m_{K−1}`,
            then with the step index at each step, so a row's draws depend on its material
            only, never on the rest of the batch.
        stop_token_mask_B_V: bool `[B, V]`, True for ids that end the row.
        stop_seqs_B_Q_W: int32 `[B, Q, W]` stop sequences, **right-aligned**, left-padded with
            -1 (a wildcard); all -1 for an unused slot.
        stop_seq_valid_B_Q: bool `[B, Q]`, True for used slots.
        prompt_index_B: optional int32 `[B]`: when set, `prompt_tokens_B_T` and
            `prompt_length_B` hold `P` distinct prompts (`[P, T]` and `[P]`, `P ≤ B`) and row
            `b` continues prompt `prompt_index_B[b]`: each prompt is prefilled once and its
            cache copied to its rows (Tinker's `num_samples`). `None`: row `b` is prompt `b`
            (or see `rows_per_prompt`).
        rows_per_prompt: static (a pytree meta field, part of the `jit` cache key) `Y ≥ 1`:
            when above 1, `prompt_tokens_B_T` and `prompt_length_B` hold `P = B / Y` prompts
            and rows `[p·Y, (p+1)·Y)` continue prompt `p` (`prompt_index_B` must be `None`):
            each prompt is prefilled once and its cache read once per decode step for all
            its rows, not copied to each (the layout for GRPO's samples of one prompt).
        shared_prefix_length: optional int32 scalar `shared ≥ 1`: the real prompts agree on
            their first `shared` tokens, which are then prefilled once
            (`rlpure.model.prefill_shared_prefix`; every real prompt at least `shared + 1`
            and at most `shared + U` tokens long, `shared ≤ S`, `shared + U ≤ T`); requires
            `prefix_widths`. `None`: each prompt prefilled whole.
        prefix_widths: static `(S, U)`, the prefix row's and the suffix rows' widths of that
            prefill (part of the `jit` cache key; `(0, 0)` without `shared_prefix_length`).
    """

    prompt_tokens_B_T: jax.Array | np.ndarray
    prompt_length_B: jax.Array | np.ndarray
    max_new_tokens_B: jax.Array | np.ndarray
    temperature_B: jax.Array | np.ndarray
    top_k_B: jax.Array | np.ndarray
    top_p_B: jax.Array | np.ndarray
    key_material_B_K: jax.Array | np.ndarray
    stop_token_mask_B_V: jax.Array | np.ndarray
    stop_seqs_B_Q_W: jax.Array | np.ndarray
    stop_seq_valid_B_Q: jax.Array | np.ndarray
    prompt_index_B: jax.Array | np.ndarray | None = None
    rows_per_prompt: int = 1
    shared_prefix_length: jax.Array | np.ndarray | None = None
    prefix_widths: tuple[int, int] = (0, 0)


class SampleOutput(msgspec.Struct, frozen=True, kw_only=True, eq=False):
    """What `sample_tokens` returns.

    Attributes:
        tokens_B_M: int32 `[B, M]` generated tokens, valid on `[0, num_tokens_B[b])`, 0 after.
        logprobs_B_M: float32 `[B, M]` tempered logprob of each generated token (see above).
        num_tokens_B: int32 `[B]` tokens generated per row.
        stopped_B: bool `[B]` True when the row ended on a stop token/sequence (`"stop"`),
            False when it ran out of tokens (`"length"`).
    """

    tokens_B_M: jax.Array
    logprobs_B_M: jax.Array
    num_tokens_B: jax.Array
    stopped_B: jax.Array


_SAMPLE_BATCH_META = ("rows_per_prompt", "prefix_widths")
jax.tree_util.register_dataclass(
    SampleBatch,
    data_fields=[name for name in SampleBatch.__struct_fields__ if name not in _SAMPLE_BATCH_META],
    meta_fields=list(_SAMPLE_BATCH_META),
)
jax.tree_util.register_dataclass(
    SampleOutput, data_fields=list(SampleOutput.__struct_fields__), meta_fields=[]
)


def _filter_logits(
    logits_B_V: jax.Array, top_k_B: jax.Array, top_p_B: jax.Array, temperature_B: jax.Array
) -> jax.Array:
    """Masks logits outside each row's top-k set and top-p nucleus to `NEG_INF`.

    In the order vLLM, SGLang and `transformers` sample: the nucleus is taken over the
    distribution the row draws from, `softmax(logits / temperature)` renormalised over its
    top-k tokens (it used to be taken over the untempered logits of the whole vocabulary, so a
    low temperature with `top_p` kept far more tokens than asked for). `temperature_B` is the
    row's, 0 already replaced by 1.
    """
    v = logits_B_V.shape[-1]
    sorted_B_V = -jnp.sort(-logits_B_V, axis=-1)
    k_B = jnp.where(top_k_B > 0, jnp.minimum(top_k_B, v), v)
    kth_B_1 = jnp.take_along_axis(sorted_B_V, (k_B - 1)[:, None], axis=-1)
    in_top_k_B_V = jnp.arange(v)[None, :] < k_B[:, None]
    tempered_B_V = jnp.where(in_top_k_B_V, sorted_B_V / temperature_B[:, None], -jnp.inf)
    probs_B_V = jax.nn.softmax(tempered_B_V, axis=-1)
    mass_before_B_V = jnp.cumsum(probs_B_V, axis=-1) - probs_B_V
    keep_sorted_B_V = mass_before_B_V < top_p_B[:, None]
    n_keep_B = jnp.maximum(jnp.sum(keep_sorted_B_V, axis=-1), 1)
    pth_B_1 = jnp.take_along_axis(sorted_B_V, (n_keep_B - 1)[:, None], axis=-1)
    pth_B_1 = jnp.where(top_p_B[:, None] >= 1.0, -jnp.inf, pth_B_1)
    threshold_B_1 = jnp.maximum(kth_B_1, pth_B_1)
    return jnp.where(logits_B_V >= threshold_B_1, logits_B_V, NEG_INF)


def _row_keys(key_material_B_K: jax.Array) -> jax.Array:
    """One PRNG key per row: `key(m_0)` folded with `m_1`, …, `m_{K−1}` (see `SampleBatch`)."""

    def one(material_K: jax.Array) -> jax.Array:
        # threefry (JAX's default) named: `_gumbel_noise` reimplements its bits
        key = jax.random.key(material_K[0], impl="threefry2x32")
        for i in range(1, material_K.shape[0]):
            key = jax.random.fold_in(key, material_K[i])
        return key

    return jax.vmap(one)(key_material_B_K)


def _tempered_terms(logits_X_V: jax.Array, temperature_X: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The two terms of `log_softmax(logits / T)` over the last axis, each `T` broadcast over
    it: (`(logits − max) / T`, `log Σ_v exp` of those). Their difference is `≤ 0` whatever the
    rounding (`tempered_token_logprobs`); every tempered logprob here is taken from them."""
    shifted_X_V = logits_X_V - jnp.max(logits_X_V, axis=-1, keepdims=True)
    scaled_X_V = shifted_X_V / temperature_X[..., None]
    return scaled_X_V, jnp.log(jnp.sum(jnp.exp(scaled_X_V), axis=-1))


def tempered_token_logprobs(
    logits_B_V: jax.Array, temperature_B: jax.Array, token_B: jax.Array
) -> jax.Array:
    """`log_softmax(logits / T)[token]` per row: the logprob Tinker reports for a sampled token.

    Computed as `(l_tok - l_max) / T - log(sum_v exp((l_v - l_max) / T))`: the first term is
    <= 0 and the second >= 0 (the max term is exp(0) = 1) whatever the rounding, so the result
    is never positive (a naive `log_softmax(logits / T)` comes out a few ulps above 0 for a
    near-certain token when `T` is not a power of two) and stays finite for tiny `T`. Not
    renormalised over a top-k/top-p set.

    Args:
        logits_B_V: float32 `[B, V]` next-token logits.
        temperature_B: float32 `[B]`, > 0 (pass 1 for greedy rows).
        token_B: int32 `[B]` the sampled tokens.

    Returns:
        float32 `[B]`, each <= 0.

    Examples:
        >>> import numpy as np
        >>> lp = tempered_token_logprobs(np.array([[0.0, np.log(3.0)]], np.float32),
        ...                              np.array([1.0], np.float32), np.array([1]))
        >>> round(float(np.exp(lp[0])), 6)
        0.75
    """
    scaled_B_V, log_norm_B = _tempered_terms(logits_B_V, temperature_B)
    token_term_B = jnp.take_along_axis(scaled_B_V, token_B[:, None], axis=-1)[:, 0]
    # The clamp only guards against exp/log approximations that could put exp(0) or log(1) an
    # ulp off; the algebra above already gives <= 0.
    return jnp.minimum(token_term_B - log_norm_B, 0.0)


def _topk_tempered_logprobs(
    params: Params, tokens_B_T: jax.Array, temperature_B: jax.Array, k: int, config: ModelConfig
) -> tuple[jax.Array, jax.Array]:
    logits_B_T_V = _logits(params, tokens_B_T, config)
    scaled_B_T_V, log_norm_B_T = _tempered_terms(logits_B_T_V, temperature_B[:, None])
    values_B_T_K, ids_B_T_K = jax.lax.top_k(scaled_B_T_V, k)
    return ids_B_T_K.astype(jnp.int32), jnp.minimum(values_B_T_K - log_norm_B_T[..., None], 0.0)


topk_tempered_logprobs = jax.jit(_topk_tempered_logprobs, static_argnames=("k", "config"))
topk_tempered_logprobs.__doc__ = """The `k` most likely next tokens after each position and
their logprobs under each row's tempered distribution `log_softmax(logits / T)` (Tinker's
top-k *sampled* logprobs, the distribution a sampled token's logprob is reported under):
(int32 ids `[B, T, k]`, float32 logprobs `[B, T, k]`), most likely first, a tie going to the
lower id (jitted).

`topk_tempered_logprobs(params, tokens_B_T, temperature_B, k=, config=)`: `temperature_B`
float32 `[B]`, > 0 (1 for greedy rows, whose logprobs are untempered); `k` (1 to `V`) and
`config` static. The arithmetic is `tempered_token_logprobs`' (unfiltered by top-k/top-p,
never above 0), so a sampled token among the `k` gets the logprob the sampler reported, to
the rounding of a forward pass against the KV-cache decode.
"""


def _prompt_alt_tokens(
    params: Params,
    tokens_B_T: jax.Array,
    temperature_B: jax.Array,
    key_material_B_K: jax.Array,
    k: int,
    config: ModelConfig,
) -> tuple[jax.Array, jax.Array]:
    logits_B_T_V = _logits(params, tokens_B_T, config)
    greedy_B = temperature_B <= 0
    scaled_B_T_V, log_norm_B_T = _tempered_terms(
        logits_B_T_V, jnp.where(greedy_B, 1.0, temperature_B)[:, None]
    )
    cdf_B_T_V = jnp.cumsum(jnp.exp(scaled_B_T_V), axis=-1)
    keys_B = _row_keys(jnp.asarray(key_material_B_K, jnp.uint32))
    n_t = tokens_B_T.shape[1]
    u_B_T_K = jax.vmap(lambda key: jax.random.uniform(key, (n_t, k)))(keys_B)
    # the first token whose cumulative mass exceeds u · total: inverse-CDF sampling
    search = jax.vmap(jax.vmap(partial(jnp.searchsorted, side="right")))
    drawn_B_T_K = search(cdf_B_T_V, u_B_T_K * cdf_B_T_V[..., -1:])
    drawn_B_T_K = jnp.minimum(drawn_B_T_K, cdf_B_T_V.shape[-1] - 1)
    argmax_B_T = jnp.argmax(scaled_B_T_V, axis=-1)
    ids_B_T_K = jnp.where(greedy_B[:, None, None], argmax_B_T[..., None], drawn_B_T_K)
    ids_B_T_K = ids_B_T_K.astype(jnp.int32)
    picked_B_T_K = jnp.take_along_axis(scaled_B_T_V, ids_B_T_K, axis=-1)
    return ids_B_T_K, jnp.minimum(picked_B_T_K - log_norm_B_T[..., None], 0.0)


prompt_alt_tokens = jax.jit(_prompt_alt_tokens, static_argnames=("k", "config"))
prompt_alt_tokens.__doc__ = """`k` independent draws, with replacement, from the next-token
distribution after each position at each row's temperature, and their tempered logprobs
(Tinker's `prompt_alt_tokens_k`: alternatives to each prompt token): (int32 ids `[B, T, k]`,
float32 logprobs `[B, T, k]`) (jitted).

`prompt_alt_tokens(params, tokens_B_T, temperature_B, key_material_B_K, k=, config=)`:
`temperature_B` float32 `[B]` (0: greedy, every draw the most likely token, logprobs
untempered); `key_material_B_K` uint32 `[B, K]` each row's key material (its key as
`SampleBatch`'s, `_row_keys`). Draws are inverse-CDF: draw `j` at position `t` is the first
token whose cumulative tempered mass (float32, in id order) exceeds `u · total` for
`u = jax.random.uniform(key, (T, k))[t, j]`, so the cost is one pass over the logits plus a
binary search a draw, not a pass over the vocabulary a draw (each token's chance is exact
to the float32 sum's rounding: off by at most ~1e-7 of the total mass, which only an
ultra-rare token notices); with JAX's partitionable
threefry an element's bits depend on its flat index alone, so padding `T` changes no draw.
Unfiltered by top-k/top-p; the logprobs are `tempered_token_logprobs`' (never above 0).
`k` and `config` are static.
"""


class _DecodeState(NamedTuple):
    """The `while_loop` carry of `sample_tokens`."""

    step: jax.Array  # int32 scalar: tokens decoded so far (the next column of `tokens_B_M`)
    logits_B_V: jax.Array  # float32 next-token logits of every row
    cache: KVCache  # RoPE'd keys [B, N, C, S], values [B, N, S, C] per layer: S = T + M, or
    # S = M (the generated tokens' only) with `rows_per_prompt > 1` (`_decoder`)
    done_B: jax.Array  # bool: the row generates no more tokens
    stopped_B: jax.Array  # bool: the row ended on a stop token or sequence
    num_B: jax.Array  # int32 tokens generated per row
    tokens_B_M: jax.Array  # int32 generated tokens, 0 after each row's end
    logprobs_B_M: jax.Array  # float32 their tempered logprobs, 0 after each row's end
    tail_B_W: jax.Array  # int32 the row's last `W` generated tokens (-2 before any)


class _SamplingRules(NamedTuple):
    """Each row's sampling and stopping inputs from a `SampleBatch`, as traced arrays."""

    max_new_B: jax.Array  # int32
    temperature_B: jax.Array  # float32, 0 for greedy
    safe_temp_B: jax.Array  # float32, the temperature with 0 replaced by 1 (no division by 0)
    top_k_B: jax.Array  # int32
    top_p_B: jax.Array  # float32
    needs_filter: jax.Array  # bool scalar: some row filters by top-k or top-p
    needs_draw: jax.Array  # bool scalar: some row that generates samples (temperature > 0)
    needs_greedy: jax.Array  # bool scalar: some row that generates is greedy (temperature 0)
    keys_B: jax.Array  # each row's PRNG key before the step index is folded in
    stop_mask_B_V: jax.Array  # bool
    stop_seqs_B_Q_W: jax.Array  # int32, right-aligned, -1 a wildcard
    stop_valid_B_Q: jax.Array  # bool


def _sampling_rules(batch: SampleBatch) -> _SamplingRules:
    """`batch`'s per-row sampling and stopping fields with their dtypes, and the row keys."""
    max_new_B = jnp.asarray(batch.max_new_tokens_B, jnp.int32)
    temperature_B = jnp.asarray(batch.temperature_B, jnp.float32)
    stop_mask_B_V = jnp.asarray(batch.stop_token_mask_B_V, bool)
    stop_seqs_B_Q_W = jnp.asarray(batch.stop_seqs_B_Q_W, jnp.int32)
    stop_valid_B_Q = jnp.asarray(batch.stop_seq_valid_B_Q, bool)
    top_k_B = jnp.asarray(batch.top_k_B, jnp.int32)
    top_p_B = jnp.asarray(batch.top_p_B, jnp.float32)
    return _SamplingRules(
        max_new_B=max_new_B,
        temperature_B=temperature_B,
        safe_temp_B=jnp.where(temperature_B > 0, temperature_B, 1.0),
        top_k_B=top_k_B,
        top_p_B=top_p_B,
        needs_filter=jnp.any(top_k_B > 0) | jnp.any(top_p_B < 1.0),
        needs_draw=jnp.any((temperature_B > 0) & (max_new_B > 0)),
        needs_greedy=jnp.any((temperature_B <= 0) & (max_new_B > 0)),
        keys_B=_row_keys(jnp.asarray(batch.key_material_B_K, jnp.uint32)),
        stop_mask_B_V=stop_mask_B_V,
        stop_seqs_B_Q_W=stop_seqs_B_Q_W,
        stop_valid_B_Q=stop_valid_B_Q,
    )


class _Decoder(NamedTuple):
    """The prefilled prompts and the step that decodes after them (`_decoder`)."""

    logits_B_V: jax.Array  # float32 each row's next-token logits after its prompt
    cache: KVCache  # the cache the loop carries and `step` updates
    step: Callable[[KVCache, jax.Array, jax.Array], DecodeOutput]  # (cache, token_B, step)


def _decoder(
    params: Params,
    batch: SampleBatch,
    *,
    config: ModelConfig,
    max_new_tokens: int,
    adapters: Params | None,
    lora: LoraConfig | None,
) -> _Decoder:
    """Prefills `batch`'s prompts once (one causal pass; with `shared_prefix_length`, their
    common prefix once and each prompt's rest after it) and returns the decode step on them.

    With `rows_per_prompt = Y > 1` the prompts' cache stays one row per prompt, read once per
    step for its `Y` rows, and the loop carries only the generated tokens' cache
    (`decode_layers_shared_prompts`; faster when rows share prompts, `benchmarks/README.md`).
    Otherwise each row gets its own cache of `T + M` positions, its prompt's copied in
    (`prompt_index_B`), and `decode_layers` writes each row at its own position: with one row per prompt that is the faster layout
    (the two-part one runs twice the small attention dots for nothing to share).
    """
    tokens_P_T = jnp.asarray(batch.prompt_tokens_B_T, jnp.int32)
    length_P = jnp.asarray(batch.prompt_length_B, jnp.int32)
    y = batch.rows_per_prompt
    t = tokens_P_T.shape[1]
    cache_len = t if y > 1 else t + max_new_tokens
    if batch.shared_prefix_length is None:
        prefilled = prefill(
            params, tokens_P_T, length_P, config=config, cache_len=cache_len, adapters=adapters,
            lora=lora,
        )  # fmt: skip
    else:
        prefilled = prefill_shared_prefix(
            params, tokens_P_T, length_P, batch.shared_prefix_length,
            config=config, cache_len=cache_len, prefix_width=batch.prefix_widths[0],
            suffix_width=batch.prefix_widths[1], adapters=adapters, lora=lora,
        )  # fmt: skip
    layers_L = split_layers(params["layers"], config.n_layers)  # once, not every step
    layer_adapters = (adapters or {}).get("layers")
    layer_adapters_L = split_layers(layer_adapters, config.n_layers) if layer_adapters else None
    if y > 1:
        length_B = jnp.repeat(length_P, y)
        b, m, n, c = tokens_P_T.shape[0] * y, max_new_tokens, config.kv_heads, config.head_dim
        dtype = prefilled.cache.k_L_B_N_C_S[0].dtype
        empty = KVCache(
            k_L_B_N_C_S=tuple(jnp.zeros((b, n, c, m), dtype) for _ in layers_L),
            v_L_B_N_S_C=tuple(jnp.zeros((b, n, m, c), dtype) for _ in layers_L),
        )

        def shared(cache: KVCache, token_B: jax.Array, step: jax.Array) -> DecodeOutput:
            return decode_layers_shared_prompts(
                params, layers_L, prefilled.cache, length_P, cache, token_B, length_B + step, step,
                config=config, layer_adapters_L=layer_adapters_L, adapters=adapters, lora=lora,
            )  # fmt: skip

        return _Decoder(jnp.repeat(prefilled.logits_B_V, y, axis=0), empty, shared)
    logits_B_V, cache = prefilled.logits_B_V, prefilled.cache
    if batch.prompt_index_B is not None:  # rows copy their prompt's prefill
        index_B = jnp.asarray(batch.prompt_index_B, jnp.int32)
        logits_B_V, length_P = logits_B_V[index_B], length_P[index_B]
        cache = KVCache(
            k_L_B_N_C_S=tuple(k[index_B] for k in cache.k_L_B_N_C_S),
            v_L_B_N_S_C=tuple(v[index_B] for v in cache.v_L_B_N_S_C),
        )

    def own(cache: KVCache, token_B: jax.Array, step: jax.Array) -> DecodeOutput:
        return decode_layers(
            params, layers_L, cache, token_B, length_P + step,
            config=config, layer_adapters_L=layer_adapters_L, adapters=adapters, lora=lora,
        )  # fmt: skip

    return _Decoder(logits_B_V, cache, own)


def _initial_state(
    decoder: _Decoder, rules: _SamplingRules, *, max_new_tokens: int, window: int
) -> _DecodeState:
    """The loop's carry before the first token: nothing generated, the prefilled cache."""
    b, m = rules.max_new_B.shape[0], max_new_tokens
    return _DecodeState(
        step=jnp.zeros((), jnp.int32),
        logits_B_V=decoder.logits_B_V,
        cache=decoder.cache,
        done_B=rules.max_new_B <= 0,
        stopped_B=jnp.zeros((b,), bool),
        num_B=jnp.zeros((b,), jnp.int32),
        tokens_B_M=jnp.zeros((b, m), jnp.int32),
        logprobs_B_M=jnp.zeros((b, m), jnp.float32),
        tail_B_W=jnp.full((b, window), -2, jnp.int32),
    )


_THREEFRY_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def _threefry2x32(
    key0: jax.Array, key1: jax.Array, count0: jax.Array, count1: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """The Threefry-2x32 block cipher (20 rounds; Salmon et al. 2011) on uint32 words, unrolled.

    The same function as JAX's `threefry2x32` primitive, bit for bit; JAX lowers that as a
    rolled 5-iteration loop on CPU, each iteration a pass over memory, which made drawing the
    Gumbel noise of a `[128, 49152]` step cost ~40% of a SmolLM2 decode step. Unrolled, XLA
    fuses the 20 rounds into one vectorised loop.
    """
    schedule = (key0, key1, key0 ^ key1 ^ np.uint32(0x1BD11BDA))
    x0, x1 = count0 + schedule[0], count1 + schedule[1]
    for i in range(5):
        for rotation in _THREEFRY_ROTATIONS[i % 2]:
            x0 = x0 + x1
            x1 = (x1 << np.uint32(rotation)) | (x1 >> np.uint32(32 - rotation))
            x1 = x0 ^ x1
        x0 = x0 + schedule[(i + 1) % 3]
        x1 = x1 + schedule[(i + 2) % 3] + np.uint32(i + 1)
    return x0, x1


def _gumbel_noise(keys_B: jax.Array, v: int) -> jax.Array:
    """float32 `[B, V]`: row `b` is `jax.random.gumbel(keys_B[b], (V,))`, bit for bit.

    JAX's recipe for a threefry key (`jax_threefry_partitionable`, the default): 32 random
    bits per element are `x0 ^ x1` of `threefry2x32(key, (0, i))`, the top 23 become a float
    `u` in `[tiny, 1)` (`jax.random.uniform`) and the noise is `-log(-log(u))`. Pinned against
    `jax.random.gumbel` by `tests/core/test_sampling_tokens.py`.
    """
    words_B_2 = jax.random.key_data(keys_B)
    count_1_V = jnp.arange(v, dtype=jnp.uint32)[None, :]
    x0_B_V, x1_B_V = _threefry2x32(
        words_B_2[:, :1], words_B_2[:, 1:], jnp.zeros_like(count_1_V), count_1_V
    )
    bits_B_V = x0_B_V ^ x1_B_V
    mantissa_B_V = (bits_B_V >> np.uint32(9)) | np.uint32(0x3F800000)  # 1.m in [1, 2)
    floats_B_V = jax.lax.bitcast_convert_type(mantissa_B_V, jnp.float32) - np.float32(1.0)
    tiny = np.float32(np.finfo(np.float32).tiny)
    uniform_B_V = jnp.maximum(tiny, floats_B_V * (np.float32(1.0) - tiny) + tiny)
    return -jnp.log(-jnp.log(uniform_B_V))


def _first_argmax(x_B_V: jax.Array) -> jax.Array:
    """`jnp.argmax(x_B_V, axis=-1)` (the first maximum; the first NaN if any), int32 `[B]`,
    as two plain reductions that XLA's CPU backend vectorises (its fused value-and-index
    reduction ran element by element)."""
    v = x_B_V.shape[-1]
    max_B_1 = jnp.max(x_B_V, axis=-1, keepdims=True)
    hit_B_V = (x_B_V == max_B_1) | jnp.isnan(x_B_V)
    index_B_V = jax.lax.broadcasted_iota(jnp.int32, x_B_V.shape, 1)
    return jnp.min(jnp.where(hit_B_V, index_B_V, v), axis=-1)


def _draw_tokens(
    logits_B_V: jax.Array, step: jax.Array, rules: _SamplingRules
) -> tuple[jax.Array, jax.Array]:
    """Each row's next token int32 `[B]` (drawn from `softmax(filter(logits) / temperature)`,
    argmax at temperature 0) and its tempered logprob float32 `[B]`.

    The draw is `jax.random.categorical(key, scaled)` (the Gumbel-max trick, `argmax(g +
    scaled)` with `g = gumbel(key)`), computed with the same noise bit for bit
    (`_gumbel_noise`); the perturbed logits are materialised (an optimisation barrier) so
    the two reductions of `_first_argmax` read them instead of each recomputing the noise.
    """
    step_keys_B = jax.vmap(lambda key: jax.random.fold_in(key, step))(rules.keys_B)
    b, v = logits_B_V.shape

    def gumbel_max(filtered: bool) -> Callable[[jax.Array], jax.Array]:
        def draw(x_B_V: jax.Array) -> jax.Array:
            if filtered:
                x_B_V = _filter_logits(x_B_V, rules.top_k_B, rules.top_p_B, rules.safe_temp_B)
            noise_B_V = _gumbel_noise(step_keys_B, v)
            perturbed_B_V = jax.lax.optimization_barrier(  # type: ignore[no-untyped-call]
                noise_B_V + x_B_V / rules.safe_temp_B[:, None]
            )
            return _first_argmax(perturbed_B_V)

        return draw

    def none(x_B_V: jax.Array) -> jax.Array:
        return jnp.zeros((b,), jnp.int32)

    # Each pass over [B, V] costs: the sort only when some row filters (it costs as much as a
    # decoder step), the draw only when some live row samples, the argmax when one is greedy.
    drawn_B = jax.lax.cond(
        rules.needs_draw,
        lambda x: jax.lax.cond(rules.needs_filter, gumbel_max(True), gumbel_max(False), x),
        none,
        logits_B_V,
    )
    greedy_B = jax.lax.cond(rules.needs_greedy, _first_argmax, none, logits_B_V)
    token_B = jnp.where(rules.temperature_B > 0, drawn_B, greedy_B)
    logprob_B = tempered_token_logprobs(logits_B_V, rules.safe_temp_B, token_B)
    return token_B, logprob_B


def _record_tokens(
    state: _DecodeState, token_B: jax.Array, logprob_B: jax.Array, rules: _SamplingRules
) -> _DecodeState:
    """Writes the live rows' tokens and logprobs at column `state.step` and updates their stop
    flags (stop token, completed stop sequence, or `max_new_B`); step, logits and cache are
    left for the decoder step."""
    step = state.step
    live_B = ~state.done_B
    rows_B = jnp.arange(token_B.shape[0])
    tokens_B_M = state.tokens_B_M.at[:, step].set(jnp.where(live_B, token_B, 0))
    logprobs_B_M = state.logprobs_B_M.at[:, step].set(jnp.where(live_B, logprob_B, 0.0))
    num_B = state.num_B + live_B.astype(jnp.int32)
    tail_B_W = jnp.concatenate([state.tail_B_W[:, 1:], token_B[:, None]], axis=1)
    seq_hit_B_Q = jnp.all(
        (rules.stop_seqs_B_Q_W == -1) | (rules.stop_seqs_B_Q_W == tail_B_W[:, None, :]), axis=-1
    )
    hit_B = rules.stop_mask_B_V[rows_B, token_B] | jnp.any(
        seq_hit_B_Q & rules.stop_valid_B_Q, axis=-1
    )
    return state._replace(
        done_B=state.done_B | (live_B & (hit_B | (num_B >= rules.max_new_B))),
        stopped_B=state.stopped_B | (live_B & hit_B),
        num_B=num_B,
        tokens_B_M=tokens_B_M,
        logprobs_B_M=logprobs_B_M,
        tail_B_W=jnp.where(live_B[:, None], tail_B_W, state.tail_B_W),
    )


def _check_layout(batch: SampleBatch) -> None:
    """Refuses a `rows_per_prompt` that does not describe `batch`'s rows, and prefix widths
    without a shared length or the reverse (static shapes)."""
    widths = batch.prefix_widths
    if not (
        isinstance(widths, tuple)
        and len(widths) == 2
        and all(isinstance(w, int | np.integer) for w in widths)
    ):
        raise ValueError(f"SampleBatch.prefix_widths: expected a tuple of 2 ints, got {widths!r}")
    if (batch.shared_prefix_length is None) != (widths == (0, 0)):
        raise ValueError(
            "SampleBatch: shared_prefix_length and prefix_widths go together, got "
            f"prefix_widths {batch.prefix_widths} and shared_prefix_length "
            f"{'None' if batch.shared_prefix_length is None else 'set'}"
        )
    y = batch.rows_per_prompt
    if y < 1:
        raise ValueError(f"SampleBatch.rows_per_prompt must be at least 1, got {y}")
    if y == 1:
        return
    if batch.prompt_index_B is not None:
        raise ValueError("SampleBatch: rows_per_prompt > 1 takes no prompt_index_B")
    p, b = jnp.shape(batch.prompt_tokens_B_T)[0], jnp.shape(batch.max_new_tokens_B)[0]
    if b != p * y:
        raise ValueError(
            f"SampleBatch: {b} rows (max_new_tokens_B) are not rows_per_prompt = {y} for each "
            f"of the {p} prompts (prompt_tokens_B_T)"
        )


@partial(jax.jit, static_argnames=("config", "max_new_tokens", "lora"))
def sample_tokens(
    params: Params,
    batch: SampleBatch,
    *,
    config: ModelConfig,
    max_new_tokens: int,
    adapters: Params | None = None,
    lora: LoraConfig | None = None,
) -> SampleOutput:
    """Samples up to `max_new_tokens` tokens for every row of `batch` (jitted).

    Prefills each distinct prompt once into a KV cache (`_decoder`: with
    `batch.rows_per_prompt > 1` the prompts' cache is read by their rows and the generated
    tokens' kept apart, `M` positions per row; otherwise each row holds `T + max_new_tokens`
    positions, its prompt's copied in), then, per step: draw the next token of every
    live row from `softmax(filter(logits) / temperature)` (argmax when the temperature is 0),
    record its logprob `log_softmax(logits / temperature)` (as Tinker's sampler reports it:
    tempered, not renormalised over the top-k/top-p set; at temperature 0 the untempered one),
    stop the row if the token is a stop token, if its generated tail now ends with one of its
    stop sequences, or if it reached its `max_new_tokens_B`; feed the token back through one
    cached decoder step (`decode_layers` or `decode_layers_shared_prompts`). Exits early when
    every row has stopped.

    Args:
        params: model params.
        batch: the padded requests (see `SampleBatch`); `B`, `P` and `T` should be bucketed.
        config: model shape (static).
        max_new_tokens: `M`, the static bucket ≥ every `max_new_tokens_B` (static).
        adapters: optional LoRA adapters applied unmerged (`rlpure.model.init_lora`); a
            sampler that decodes many batches is faster on `merge_lora`'d params.
        lora: their config (static), required with `adapters`.

    Returns:
        `SampleOutput` with `[B, M]` tokens/logprobs, `[B]` counts and stop flags.

    Raises:
        ValueError: `rows_per_prompt` below 1, or above 1 with `prompt_index_B` set or with
            `B` rows not `rows_per_prompt` per prompt.
    """
    _check_layout(batch)
    rules = _sampling_rules(batch)
    window = jnp.shape(batch.stop_seqs_B_Q_W)[-1]
    decoder = _decoder(
        params, batch, config=config, max_new_tokens=max_new_tokens, adapters=adapters, lora=lora
    )
    initial = _initial_state(decoder, rules, max_new_tokens=max_new_tokens, window=window)

    def cond(state: _DecodeState) -> jax.Array:
        return (state.step < max_new_tokens) & ~jnp.all(state.done_B)

    def body(state: _DecodeState) -> _DecodeState:
        token_B, logprob_B = _draw_tokens(state.logits_B_V, state.step, rules)
        recorded = _record_tokens(state, token_B, logprob_B, rules)
        # One cached decoder step on the new token (at position prompt length + step).
        decoded = decoder.step(state.cache, token_B, state.step)
        return recorded._replace(
            step=state.step + 1, logits_B_V=decoded.logits_B_V, cache=decoded.cache
        )

    final = jax.lax.while_loop(cond, body, initial)
    return SampleOutput(
        tokens_B_M=final.tokens_B_M,
        logprobs_B_M=final.logprobs_B_M,
        num_tokens_B=final.num_B,
        stopped_B=final.stopped_B,
    )


# --- stop strings, on decoded text (host side) ------------------------------------------------


def stop_string_end(
    tokens_M: Sequence[int], stop_strings: Sequence[str], decode: Callable[[list[int]], str]
) -> int | None:
    """The length of the shortest prefix of a completion whose decoded text contains one of
    `stop_strings`, or `None` when its whole text contains none.

    This is how a stop *string* ends a sample on Tinker (and vLLM): on the generated text,
    however the model spelled it in tokens. `sample_tokens` only matches a stop string's own
    encoding, inside the loop, so the sampler cuts each completion with this afterwards; the
    token that completes the string is kept (as `sample_tokens` keeps a stop sequence).

    Binary search over prefix lengths (`O(log M)` decodes), exact when the text of a prefix is
    a prefix of the text (up to a trailing incomplete character): `decode` must not rewrite
    earlier text when a token is appended (e.g. Hugging Face's `clean_up_tokenization_spaces`).

    Args:
        tokens_M: the completion's token ids (`M` of them), prompt excluded.
        stop_strings: non-empty strings.
        decode: token ids to text (special tokens written out, so a stop string may name one).

    Returns:
        `n` in `[1, M]` with a stop string in `decode(tokens_M[:n])` and in no shorter prefix's
        text, or `None`.

    Examples:
        >>> pieces = ("x", "ab", "c", "d")  # token id -> its text
        >>> decode = lambda ids: "".join(pieces[i] for i in ids)
        >>> stop_string_end([1, 2, 3], ["bc"], decode)  # "ab" + "c" spells "bc"
        2
        >>> stop_string_end([1, 2, 3], ["z"], decode) is None
        True
    """
    if any(not s for s in stop_strings):
        raise ValueError("stop_string_end: empty stop string")
    tokens = list(tokens_M)

    def contains_stop(n: int) -> bool:
        text = decode(tokens[:n])
        return any(s in text for s in stop_strings)

    if not stop_strings or not contains_stop(len(tokens)):
        return None
    lo, hi = 1, len(tokens)  # the answer is in [lo, hi]; contains_stop(hi) holds
    while lo < hi:
        mid = (lo + hi) // 2
        if contains_stop(mid):
            hi = mid
        else:
            lo = mid + 1
    return hi
