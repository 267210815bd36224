"""`rlpure.model.prefill_shared_prefix`: prompts that begin alike prefilled with their common
prefix computed once give `prefill`'s logits and cache (float32 reassociation), whatever the
shared length, the widths and the prompts' lengths; a suffix that does not read the prefix
(the mutation below) is caught."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlpure import model as M
from rlpure.model import _grouped_forward, _sampling

CONFIG = M.get_model_config("rlpure/tiny")
PARAMS = M.init_params(jax.random.key(0), CONFIG)
T = 32


def _prompts(rng: np.random.Generator, p: int, shared: int, suffix_max: int) -> tuple[Any, Any]:
    """`p` prompts `[p, T]` that agree on their first `shared` tokens, each `1..suffix_max`
    tokens longer than that."""
    common = rng.integers(0, 256, shared)
    lengths = shared + rng.integers(1, suffix_max + 1, p)
    tokens = np.zeros((p, T), np.int32)
    for i, n in enumerate(lengths):
        tokens[i, :shared] = common
        tokens[i, shared:n] = rng.integers(0, 256, n - shared)
    return tokens, lengths.astype(np.int32)


def _shared(tokens: Any, lengths: Any, shared: int, s: int, u: int, cache_len: int) -> Any:
    return jax.jit(
        M.prefill_shared_prefix,
        static_argnames=("config", "cache_len", "prefix_width", "suffix_width"),
    )(
        PARAMS, tokens, lengths, np.int32(shared), config=CONFIG, cache_len=cache_len,
        prefix_width=s, suffix_width=u,
    )  # fmt: skip


def _assert_same(got: Any, want: Any, lengths: Any) -> None:
    np.testing.assert_allclose(got.logits_B_V, want.logits_B_V, atol=2e-5, rtol=1e-5)
    for k_got, k_want, v_got, v_want in zip(
        got.cache.k_L_B_N_C_S, want.cache.k_L_B_N_C_S,
        got.cache.v_L_B_N_S_C, want.cache.v_L_B_N_S_C, strict=True,
    ):  # fmt: skip
        for i, n in enumerate(lengths):  # real positions only (padding is never read)
            np.testing.assert_allclose(k_got[i, :, :, :n], k_want[i, :, :, :n], atol=2e-5)
            np.testing.assert_allclose(v_got[i, :, :n], v_want[i, :, :n], atol=2e-5)


@settings(max_examples=12, deadline=None)
@given(
    p=st.integers(1, 5),
    shared=st.integers(1, 16),
    suffix_max=st.integers(1, 16),
    seed=st.integers(0, 2**16),
)
def test_the_prefix_computed_once_gives_prefills_logits_and_cache(
    p: int, shared: int, suffix_max: int, seed: int
) -> None:
    tokens, lengths = _prompts(np.random.default_rng(seed), p, shared, suffix_max)
    s, u = 16, 16  # shared <= 16 = s, shared + u <= T
    want = M.prefill(PARAMS, tokens, lengths, config=CONFIG, cache_len=T + 8)
    _assert_same(_shared(tokens, lengths, shared, s, u, T + 8), want, lengths)


@pytest.mark.parametrize(
    ("shared", "s", "u"),
    [(1, 1, 31), (31, 32, 1), (16, 16, 16), (5, 8, 27), (20, 32, 16)],
    ids=["one shared token", "one own token", "widths exact", "widths loose", "U past T"],
)
def test_edges_of_the_widths(shared: int, s: int, u: int) -> None:
    rng = np.random.default_rng(shared)
    tokens, lengths = _prompts(rng, 3, shared, min(u, T - shared))
    want = M.prefill(PARAMS, tokens, lengths, config=CONFIG, cache_len=T)
    _assert_same(_shared(tokens, lengths, shared, s, u, T), want, lengths)


def test_a_suffix_that_does_not_read_the_prefix_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tokens, lengths = _prompts(np.random.default_rng(7), 3, 12, 6)
    want = M.prefill(PARAMS, tokens, lengths, config=CONFIG, cache_len=T)
    real = _grouped_forward.suffix_attention_mask

    def own_keys_only(prefix_length_D: jax.Array, s: int, u: int) -> jax.Array:
        return real(jnp.zeros_like(prefix_length_D), s, u)  # drops every prefix key

    monkeypatch.setattr(_grouped_forward, "suffix_attention_mask", own_keys_only)
    jax.clear_caches()  # retrace with the mutation (an earlier test compiled these shapes)
    try:
        with pytest.raises(AssertionError):
            _assert_same(_shared(tokens, lengths, 12, 16, 16, T), want, lengths)
    finally:
        jax.clear_caches()


def test_widths_out_of_range_are_refused() -> None:
    tokens, lengths = _prompts(np.random.default_rng(0), 2, 4, 4)
    with pytest.raises(ValueError, match="prefix_width 33"):
        M.prefill_shared_prefix(
            PARAMS, tokens, lengths, 4, config=CONFIG, cache_len=T,
            prefix_width=33, suffix_width=4,
        )  # fmt: skip
    with pytest.raises(ValueError, match=r"shared 9 is not in \[1, 8\]"):
        M.prefill_shared_prefix(
            PARAMS, tokens, lengths, 9, config=CONFIG, cache_len=T,
            prefix_width=8, suffix_width=8,
        )  # fmt: skip


@pytest.mark.parametrize("y", [1, 4], ids=["flat", "grid of 4 samples"])
def test_sample_tokens_with_the_prefix_computed_once_draws_the_same_tokens(
    y: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    p, shared, new = 4, 14, 8
    tokens, lengths = _prompts(np.random.default_rng(3), p, shared, 10)
    b = p * y
    batch = M.SampleBatch(
        prompt_tokens_B_T=tokens,
        prompt_length_B=lengths,
        max_new_tokens_B=np.full(b, new, np.int32),
        temperature_B=np.full(b, 1.0, np.float32),
        top_k_B=np.zeros(b, np.int32),
        top_p_B=np.ones(b, np.float32),
        key_material_B_K=np.stack([np.full(b, 5), np.arange(b)], 1).astype(np.uint32),
        stop_token_mask_B_V=np.zeros((b, CONFIG.vocab_size), bool),
        stop_seqs_B_Q_W=np.full((b, 4, 8), -1, np.int32),
        stop_seq_valid_B_Q=np.zeros((b, 4), bool),
        prompt_index_B=None if y > 1 else np.arange(b, dtype=np.int32),
        rows_per_prompt=y,
    )
    whole = M.sample_tokens(PARAMS, batch, config=CONFIG, max_new_tokens=new)
    shared_batch = msgspec.structs.replace(
        batch, shared_prefix_length=np.int32(shared), prefix_widths=(16, 16)
    )
    calls = []
    real = M.prefill_shared_prefix  # the function `_sampling` imported

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs["prefix_width"])
        return real(*args, **kwargs)

    monkeypatch.setattr(_sampling, "prefill_shared_prefix", counted)
    jax.clear_caches()  # traced afresh, so a sampler that ignored the prefix would show here
    try:
        once = M.sample_tokens(PARAMS, shared_batch, config=CONFIG, max_new_tokens=new)
    finally:
        jax.clear_caches()
    assert calls == [16]
    np.testing.assert_array_equal(once.tokens_B_M, whole.tokens_B_M)
    np.testing.assert_allclose(once.logprobs_B_M, whole.logprobs_B_M, atol=5e-5)
    with pytest.raises(ValueError, match="go together"):
        M.sample_tokens(
            PARAMS, msgspec.structs.replace(batch, prefix_widths=(16, 16)), config=CONFIG,
            max_new_tokens=new,
        )  # fmt: skip
