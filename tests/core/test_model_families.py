"""Tests for the open-weight families of `rlpure.model` (llama, qwen2, qwen3) and LoRA: param
names and shapes, causal invariance, the KV-cached `prefill`/`decode_step` against the full
forward pass, shared-prefill sampling, bf16 against f32, LoRA (B = 0 is the base, gradients
reach only the adapters, merged equals unmerged, Tinker's adapter counts), config validation
and the trace-count bound. Tiny configs: the file compiles a handful of small programs.
(Logits against `transformers` PyTorch: `tests/parity/test_model_parity.py`.)
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import msgspec
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from rlpure import model as M
from rlpure.buckets import bucket_size
from tests.compile_count import count_compiles

V, T = 32, 8


def _config(family: Any, **extra: Any) -> M.ModelConfig:
    fields: dict[str, Any] = {
        "vocab_size": V,
        "d_model": 16,
        "n_layers": 2,
        "n_heads": 4,
        "n_kv_heads": 2,
        "d_ff": 24,
        "max_seq_len": 64,
        "init_std": 0.3,
        "family": family,
    }
    return M.ModelConfig(**{**fields, **extra})


CONFIGS = {
    "qwen2": _config("qwen2"),
    "qwen3": _config("qwen3", head_width=8, n_kv_heads=1),
    "llama3": _config(  # tied, with Llama 3.1's RoPE scaling
        "llama",
        tie_embeddings=True,
        rope_scaling=M.RopeScaling(
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=4,
        ),
    ),
}


def _params(config: M.ModelConfig, seed: int = 0) -> M.Params:
    """Random params drawn on the host (no compile): matrices N(0, 0.3²), norm scales
    1 + N(0, 0.2²) and biases N(0, 0.2²) (so a mis-wired norm or bias shows)."""
    rng = np.random.default_rng(seed)
    shapes = jax.eval_shape(lambda k: M.init_params(k, config), jax.random.key(0))

    def draw(path: Any, shape: Any) -> jax.Array:
        name = str(path[-1].key)
        if "norm_scale" in name:
            value = 1.0 + 0.2 * rng.standard_normal(shape.shape)
        elif name.startswith("b"):
            value = 0.2 * rng.standard_normal(shape.shape)
        else:
            value = 0.3 * rng.standard_normal(shape.shape)
        return jnp.asarray(value, shape.dtype)

    params: M.Params = jax.tree_util.tree_map_with_path(draw, shapes)
    return params


def _tokens(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, V, shape).astype(np.int32)


def test_param_names_and_shapes_per_family() -> None:
    def shapes_of(config: M.ModelConfig) -> Any:
        return jax.eval_shape(lambda k: M.init_params(k, config), jax.random.key(0))

    qwen2 = shapes_of(CONFIGS["qwen2"])
    assert set(qwen2) == {"embed_V_E", "layers", "final_norm_scale_E", "unembed_E_V"}
    shapes = {name: x.shape for name, x in qwen2["layers"].items()}
    assert shapes == {
        "attn_norm_scale_E": (2, 16),
        "wq_E_H_C": (2, 16, 4, 4),
        "wk_E_N_C": (2, 16, 2, 4),
        "wv_E_N_C": (2, 16, 2, 4),
        "wo_H_C_E": (2, 4, 4, 16),
        "bq_H_C": (2, 4, 4),
        "bk_N_C": (2, 2, 4),
        "bv_N_C": (2, 2, 4),
        "mlp_norm_scale_E": (2, 16),
        "w_gate_E_F": (2, 16, 24),
        "w_up_E_F": (2, 16, 24),
        "w_down_F_E": (2, 24, 16),
    }
    qwen3 = shapes_of(CONFIGS["qwen3"])["layers"]
    assert qwen3["q_norm_scale_C"].shape == (2, 8) and qwen3["wq_E_H_C"].shape == (2, 16, 4, 8)
    assert "bq_H_C" not in qwen3 and qwen3["wk_E_N_C"].shape == (2, 16, 1, 8)
    assert "unembed_E_V" not in shapes_of(CONFIGS["llama3"])
    bf16 = shapes_of(_config("llama", dtype="bfloat16"))
    assert {x.dtype for x in jax.tree_util.tree_leaves(bf16)} == {jnp.dtype(jnp.bfloat16)}


def test_config_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match="n_kv_heads: 3 does not divide n_heads 4"):
        _config("llama", n_kv_heads=3)
    with pytest.raises(ValueError, match="head width 5 must be even"):
        _config("llama", head_width=5)
    with pytest.raises(ValueError, match=r"ModelConfig\.family"):
        _config("gpt2")
    with pytest.raises(ValueError, match=r"ModelConfig\.dtype"):
        _config("llama", dtype="float16")
    with pytest.raises(ValueError, match=r"LoraConfig\.rank"):
        M.LoraConfig(rank=0)
    with pytest.raises(ValueError, match="at least one of train_attn"):
        M.LoraConfig(rank=1, train_attn=False, train_mlp=False, train_unembed=False)
    # The new fields' defaults leave the toy configs as they were.
    tiny = M.get_model_config("rlpure/tiny")
    assert (tiny.family, tiny.kv_heads, tiny.head_dim, tiny.dtype) == ("rlpure", 4, 16, "float32")


def test_decode_steps_reproduce_the_forward_logits_and_padding_is_causal() -> None:
    config = CONFIGS["llama3"]  # (qwen3's decoding: the sampling test below)
    params = _params(config)
    tokens = _tokens(1, (2, T))
    full = np.asarray(M.logits(params, tokens, config=config))
    # Changing tokens after position 3 (as right padding does) leaves positions <= 3 alone.
    changed = tokens.copy()
    changed[:, 4:] = _tokens(2, (2, T - 4))
    np.testing.assert_allclose(
        np.asarray(M.logits(params, changed, config=config))[:, :4], full[:, :4], atol=1e-5
    )
    # Prefill rows of lengths 3 and 1, then feed the rest one token at a time.
    length = np.array([3, 1], np.int32)
    out = M.prefill(params, tokens, length, config=config, cache_len=T)
    np.testing.assert_allclose(np.asarray(out.logits_B_V), full[[0, 1], length - 1], atol=1e-5)
    cache = out.cache
    for step in range(T - 3):
        position = length + step
        decoded = M.decode_step(params, cache, tokens[[0, 1], position], position, config=config)
        cache = decoded.cache
        np.testing.assert_allclose(
            np.asarray(decoded.logits_B_V), full[[0, 1], position], atol=1e-5
        )


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["prompt_index", "rows_per_prompt"])
def test_shared_prefill_sampling_with_adapters_reports_the_merged_models_logprobs(
    layout: str,
) -> None:
    # Rows sharing their prompt's prefill and decoding through unmerged adapters report, at
    # temperature 1, the teacher-forced logprobs of their own prompt + completion under the
    # `merge_lora`'d weights: with each row's own copy of its prompt's cache
    # (`prompt_index_B`, rows interleaved) and with one cache per prompt read by its rows
    # (`rows_per_prompt`, rows in prompt order).
    config = CONFIGS["qwen3"]
    params = _params(config)
    lora = M.LoraConfig(rank=2)
    adapters = jax.jit(lambda a: jax.tree_util.tree_map(lambda x: x + 0.3, a))(
        M.init_lora(jax.random.key(1), config, lora)
    )
    b, m = 4, 4
    prompts = _tokens(3, (2, T))
    lengths = np.array([5, 2], np.int32)
    grouped = layout == "rows_per_prompt"
    index = np.array([0, 0, 1, 1] if grouped else [0, 1, 0, 1], np.int32)
    batch = M.SampleBatch(
        prompt_tokens_B_T=prompts,
        prompt_length_B=lengths,
        max_new_tokens_B=np.full(b, m, np.int32),
        temperature_B=np.ones(b, np.float32),
        top_k_B=np.zeros(b, np.int32),
        top_p_B=np.ones(b, np.float32),
        key_material_B_K=np.arange(b, dtype=np.uint32)[:, None],
        stop_token_mask_B_V=np.zeros((b, V), bool),
        stop_seqs_B_Q_W=np.full((b, 1, 1), -1, np.int32),
        stop_seq_valid_B_Q=np.zeros((b, 1), bool),
        prompt_index_B=None if grouped else index,
        rows_per_prompt=2 if grouped else 1,
    )
    out = M.sample_tokens(
        params, batch, config=config, max_new_tokens=m, adapters=adapters, lora=lora
    )
    tokens_B_M = np.asarray(out.tokens_B_M)
    assert np.asarray(out.num_tokens_B).tolist() == [m] * b
    siblings = [(0, 1), (2, 3)] if grouped else [(0, 2), (1, 3)]  # rows of one prompt
    assert any((tokens_B_M[i] != tokens_B_M[j]).any() for i, j in siblings)
    inputs = np.zeros((b, 2 * T), np.int32)
    targets = np.zeros((b, 2 * T), np.int32)
    for row, prompt in enumerate(index):
        seq = np.concatenate([prompts[prompt, : lengths[prompt]], tokens_B_M[row]])
        inputs[row, : len(seq) - 1] = seq[:-1]
        targets[row, : len(seq) - 1] = seq[1:]
    merged = M.merge_lora(params, adapters, config=config, lora=lora)
    lp_B_T = np.asarray(M.target_logprobs(merged, inputs, targets, config=config))
    for row, prompt in enumerate(index):
        start = lengths[prompt] - 1
        np.testing.assert_allclose(
            np.asarray(out.logprobs_B_M)[row], lp_B_T[row, start : start + m], atol=1e-4
        )


def test_varied_lengths_compile_once_per_bucket_and_bfloat16_is_close() -> None:
    config = CONFIGS["qwen2"]
    params = _params(config)
    lengths = [3, 5, 7, 9, 12, 16, 2, 6, 11, 15]
    with count_compiles() as compiled:
        for n in lengths:
            width = bucket_size(n, minimum=8, steps_per_octave=1)
            tokens = np.zeros((3, width), np.int32)  # 3 rows: shapes no other test traced
            tokens[:, :n] = _tokens(n, (3, n))
            M.target_logprobs(params, tokens, tokens, config=config)
    assert compiled.traces_of(M.target_logprobs) == 2  # buckets 8 and 16
    # bfloat16 params and matmuls (float32 norms, softmax, logprobs) stay close to float32.
    config_bf16 = M.ModelConfig(**{**_fields(config), "dtype": "bfloat16"})
    params_bf16 = jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16), params)
    lp32 = np.asarray(M.target_logprobs(params, tokens, tokens, config=config))
    lp16 = M.target_logprobs(params_bf16, tokens, tokens, config=config_bf16)
    assert lp16.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(lp16), lp32, atol=0.1)
    assert np.abs(np.asarray(lp16) - lp32).max() > 0  # really computed in bf16


def _fields(config: M.ModelConfig) -> dict[str, Any]:
    return {name: getattr(config, name) for name in config.__struct_fields__}


@pytest.mark.slow
def test_lora_starts_at_the_base_and_trains_only_adapters() -> None:
    config = CONFIGS["llama3"]  # tied: the unembedding adapter sits on embed^T
    params = _params(config)
    lora = M.LoraConfig(rank=2)
    adapters = M.init_lora(jax.random.key(5), config, lora)
    assert set(adapters["layers"]) == {
        "wq_a_E_R",
        "wq_b_R_H_C",
        "wk_a_E_R",
        "wk_b_R_N_C",
        "wv_a_E_R",
        "wv_b_R_N_C",
        "wo_a_H_C_R",
        "wo_b_R_E",
        "w_gate_a_E_R",
        "w_gate_b_R_F",
        "w_up_a_E_R",
        "w_up_b_R_F",
        "w_down_a_F_R",
        "w_down_b_R_E",
    }
    assert adapters["unembed_a_E_R"].shape == (16, 2) and adapters["unembed_b_R_V"].shape == (2, V)
    assert float(jnp.abs(adapters["layers"]["wq_a_E_R"]).max()) <= 1 / np.sqrt(16)
    tokens = _tokens(6, (2, T))
    base = np.asarray(M.target_logprobs(params, tokens, tokens, config=config))
    start = M.target_logprobs(params, tokens, tokens, config=config, adapters=adapters, lora=lora)
    np.testing.assert_array_equal(np.asarray(start), base)

    def loss(a: M.Params) -> jax.Array:
        tokens_B_T = jnp.asarray(tokens)
        return jnp.sum(M.target_logprobs_fn(params, tokens_B_T, tokens_B_T, config, a, lora))

    grads = jax.jit(jax.grad(loss))(adapters)
    assert str(jax.tree_util.tree_structure(grads)) == str(jax.tree_util.tree_structure(adapters))
    # At B = 0 only the B factors get a gradient (dL/dA = x^T (dL/dy) B^T = 0).
    assert float(jnp.abs(grads["layers"]["wq_b_R_H_C"]).max()) > 0
    assert float(jnp.abs(grads["unembed_b_R_V"]).max()) > 0
    assert float(jnp.abs(grads["layers"]["w_up_a_E_R"]).max()) == 0

    # With B != 0: the unmerged adapters equal merge_lora's weights, and move the model.
    trained = jax.jit(
        lambda g, a: jax.tree_util.tree_map(lambda g, a: a + 0.5 * jnp.sign(g), g, a)
    )(grads, adapters)
    unmerged = M.target_logprobs(params, tokens, tokens, config=config, adapters=trained, lora=lora)
    merged_params = M.merge_lora(params, trained, config=config, lora=lora)
    assert "unembed_E_V" in merged_params and "unembed_E_V" not in params
    merged = M.target_logprobs(merged_params, tokens, tokens, config=config)
    np.testing.assert_allclose(np.asarray(merged), np.asarray(unmerged), atol=1e-3)
    assert np.abs(np.asarray(unmerged) - base).max() > 0.1
    attn_only = M.LoraConfig(rank=2, train_mlp=False, train_unembed=False)
    names = jax.eval_shape(lambda k: M.init_lora(k, config, attn_only), jax.random.key(0))
    assert {name.split("_")[0] for name in names["layers"]} == {"wq", "wk", "wv", "wo"}
    assert set(names) == {"layers"}


def test_lora_term_hand_written_vjp_equals_autodiff() -> None:
    # `_lora_delta`'s VJP is written by hand (for XLA's CPU layouts); it must be the gradient
    # autodiff gives for `(x A) B`, for every input, at ragged shapes and a rank of 1.
    from rlpure.model._lora_kernels import _lora_delta

    rng = np.random.default_rng(7)
    for b, t, i, r, o in ((2, 3, 5, 4, 6), (1, 1, 3, 1, 2), (3, 8, 16, 2, 40)):
        x, a, w = (
            jnp.asarray(rng.standard_normal(s), jnp.float32) for s in ((b, t, i), (i, r), (r, o))
        )
        cotangent = jnp.asarray(rng.standard_normal((b, t, o)), jnp.float32)

        def hand(x: jax.Array, a: jax.Array, w: jax.Array, dy: jax.Array) -> jax.Array:
            return jnp.sum(_lora_delta(x, a, w) * dy)

        def plain(x: jax.Array, a: jax.Array, w: jax.Array, dy: jax.Array) -> jax.Array:
            return jnp.sum(jnp.einsum("bti,ir,ro->bto", x, a, w) * dy)

        got = jax.jit(jax.grad(hand, argnums=(0, 1, 2)))(x, a, w, cotangent)
        want = jax.grad(plain, argnums=(0, 1, 2))(x, a, w, cotangent)
        for g, e, name in zip(got, want, ("x", "A", "B"), strict=True):
            assert g.shape == e.shape, name
            np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(hand(x, a, w, cotangent), plain(x, a, w, cotangent), rtol=1e-5)


def test_merged_unembedding_hand_written_vjp_equals_autodiff() -> None:
    # `_adapted_unembed` merges the unembedding's adapter before the matmul and writes its VJP
    # by hand; values and gradients (h, the base matrix, A, B) must be those of the unmerged
    # `h W + scale (h A) B`, tied (`W = embed_V_Eᵀ`) and untied, at ragged shapes and rank 1.
    from rlpure.model._lora_kernels import _adapted_unembed

    rng = np.random.default_rng(9)
    for b, t, e, r, v in ((2, 3, 5, 4, 7), (1, 2, 3, 1, 2), (3, 4, 6, 2, 33)):
        h, a, bb = (
            jnp.asarray(rng.standard_normal(s), jnp.float32) for s in ((b, t, e), (e, r), (r, v))
        )
        dlogits = jnp.asarray(rng.standard_normal((b, t, v)), jnp.float32)
        for tied in (True, False):
            w = jnp.asarray(rng.standard_normal((v, e) if tied else (e, v)), jnp.float32)

            def hand(h: jax.Array, w: jax.Array, a: jax.Array, bb: jax.Array) -> jax.Array:
                return jnp.sum(_adapted_unembed(h, w, a, bb, 0.75, tied) * dlogits)  # noqa: B023

            def plain(h: jax.Array, w: jax.Array, a: jax.Array, bb: jax.Array) -> jax.Array:
                w_E_V = w.T if tied else w  # noqa: B023
                logits = h @ w_E_V + 0.75 * jnp.einsum("bte,er,rv->btv", h, a, bb)
                return jnp.sum(logits * dlogits)  # noqa: B023

            got = jax.jit(jax.grad(hand, argnums=(0, 1, 2, 3)))(h, w, a, bb)
            want = jax.grad(plain, argnums=(0, 1, 2, 3))(h, w, a, bb)
            for g, x, name in zip(got, want, ("h", "W", "A", "B"), strict=True):
                assert g.shape == x.shape, (name, tied)
                np.testing.assert_allclose(np.asarray(g), np.asarray(x), rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(hand(h, w, a, bb), plain(h, w, a, bb), rtol=1e-5)


def test_swiglu_hand_written_vjp_equals_autodiff() -> None:
    # `_swiglu`'s VJP is written by hand (to keep fewer residuals); it must equal autodiff's
    # gradient of `silu(g) · u`, at large |g| (saturated sigmoid) too.
    from rlpure.model._layers import _swiglu

    rng = np.random.default_rng(8)
    gate = jnp.asarray(np.concatenate([rng.standard_normal(60), [-30.0, -8.0, 0.0, 8.0, 30.0]]))
    gate = gate.astype(jnp.float32).reshape(5, 13)
    up, d_act = (jnp.asarray(rng.standard_normal((5, 13)), jnp.float32) for _ in range(2))

    def hand(g: jax.Array, u: jax.Array) -> jax.Array:
        return jnp.sum(_swiglu(g, u) * d_act)

    def plain(g: jax.Array, u: jax.Array) -> jax.Array:
        return jnp.sum(jax.nn.silu(g) * u * d_act)

    got = jax.jit(jax.grad(hand, argnums=(0, 1)))(gate, up)
    want = jax.grad(plain, argnums=(0, 1))(gate, up)
    for g, e in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(_swiglu(gate, up), jax.nn.silu(gate) * up)


def test_lora_param_counts_match_tinkers_table() -> None:
    # tinker_cookbook.hyperparam_utils: meta-llama/Llama-3.2-1B per rank: mlp 491,520,
    # attn 212,992, unembed 130,304 (shapes only: eval_shape allocates nothing).
    config = M.ModelConfig(
        vocab_size=128256,
        d_model=2048,
        n_layers=16,
        n_heads=32,
        n_kv_heads=8,
        d_ff=8192,
        max_seq_len=131072,
        family="llama",
        tie_embeddings=True,
    )
    for flags, per_rank in (
        ({"train_attn": True, "train_mlp": False, "train_unembed": False}, 212_992),
        ({"train_attn": False, "train_mlp": True, "train_unembed": False}, 491_520),
        ({"train_attn": False, "train_mlp": False, "train_unembed": True}, 130_304),
    ):
        lora = M.LoraConfig(rank=8, **flags)
        shapes = jax.eval_shape(
            lambda k, lora=lora: M.init_lora(k, config, lora), jax.random.key(0)
        )
        assert M.count_lora_params(shapes) == 8 * per_rank, flags
    assert M.LoraConfig(rank=8).scale == 4.0  # alpha 32 / rank 8


@settings(max_examples=200, deadline=None)
@given(
    factor=st.floats(2.0, 64.0),
    high=st.floats(1.5, 16.0),
    original=st.integers(64, 1 << 17),
    base=st.sampled_from([1e4, 5e5, 1e6]),
    head_dim=st.sampled_from([16, 64, 128]),
)
def test_llama3_rope_scaling_is_recovered_from_its_frequency_divisors(
    factor: float, high: float, original: int, base: float, head_dim: int
) -> None:
    """Round trip: divisors `r_j` made with Llama 3.1's formula (low_freq_factor 1, as every
    Llama 3.x) give back the scaling, whose frequencies are `inv_freq_j / r_j`, whenever it is
    determined: some frequency divided by the full `factor` and two strictly between."""
    scaling = M.RopeScaling(
        factor=factor,
        low_freq_factor=1.0,
        high_freq_factor=high,
        original_max_position_embeddings=original,
    )
    plain = _config("llama", rope_base=base, head_width=head_dim)
    inv_J = M.rope_inv_freq(plain).astype(np.float64)
    scaled_J = M.rope_inv_freq(msgspec.structs.replace(plain, rope_scaling=scaling))
    factors_J = inv_J / scaled_J.astype(np.float64)
    wavelen_J = 2 * np.pi / inv_J
    assume(np.any(wavelen_J > 1.001 * original))  # the plateau, at `factor`
    inside_J = (factors_J > 1 + 1e-3) & (factors_J < factor * (1 - 1e-3))
    assume(int(inside_J.sum()) >= 2)  # two points of the interpolating line
    got = M.llama3_rope_scaling_from_factors(factors_J, rope_base=base, head_dim=head_dim)
    assert got is not None
    np.testing.assert_allclose(got.factor, factor, rtol=1e-4)
    recovered_J = M.rope_inv_freq(msgspec.structs.replace(plain, rope_scaling=got))
    np.testing.assert_allclose(recovered_J, scaled_J, rtol=1e-4)


def test_llama3_rope_scaling_from_factors_refuses_what_it_cannot_determine() -> None:
    ones = np.ones(8)
    assert M.llama3_rope_scaling_from_factors(ones, rope_base=1e4, head_dim=16) is None
    with pytest.raises(ValueError, match="expected 8 values"):
        M.llama3_rope_scaling_from_factors(np.ones(7), rope_base=1e4, head_dim=16)
    with pytest.raises(ValueError, match=">= 1"):
        M.llama3_rope_scaling_from_factors(np.full(8, 0.5), rope_base=1e4, head_dim=16)
    step = np.array([1.0] * 4 + [8.0] * 4)  # no interpolated frequency: the line is unknown
    with pytest.raises(ValueError, match="0 interpolated frequencies, need 2"):
        M.llama3_rope_scaling_from_factors(step, rope_base=1e4, head_dim=16)
