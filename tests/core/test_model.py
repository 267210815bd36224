"""Tests for `rlpure.model`: the transformer against a float64 loop reference, causality and
padding invariance, the KV-cache sampler against the training forward, stop rules, determinism,
the AdamW step against a hand-written reference, and the trace-count bound.

Every jitted call here uses the same few bucketed shapes, so the file compiles a handful of
times.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlpure import model as M
from rlpure.buckets import bucket_size
from rlpure.model import EOS_ID, VOCAB_SIZE
from tests.compile_count import count_compiles

CONFIG = M.get_model_config("rlpure/tiny")
PARAMS = M.init_params(jax.random.key(0), CONFIG)
B, T, NEW = 8, 16, 16  # the buckets every sampling test uses


def _np_params(params: M.Params) -> dict:
    return jax.tree_util.tree_map(lambda x: np.asarray(x, np.float64), params)


def _reference_logits(params: M.Params, tokens: list[int], config: M.ModelConfig) -> np.ndarray:
    """Slow float64 forward of one sequence with explicit loops over positions and heads."""
    p = _np_params(params)
    n, e, h, c = len(tokens), config.d_model, config.n_heads, config.head_dim

    def layer_norm(x: np.ndarray, scale: np.ndarray, bias: np.ndarray) -> np.ndarray:
        mean = x.mean()
        var = ((x - mean) ** 2).mean()
        return (x - mean) / math.sqrt(var + config.norm_eps) * scale + bias

    def rope(v: np.ndarray, pos: int) -> np.ndarray:
        half = c // 2
        out = np.empty_like(v)
        for i in range(half):
            angle = pos * config.rope_base ** (-i / half)
            cos, sin = math.cos(angle), math.sin(angle)
            out[i] = v[i] * cos - v[i + half] * sin
            out[i + half] = v[i] * sin + v[i + half] * cos
        return out

    def gelu(x: np.ndarray) -> np.ndarray:
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))

    xs = [p["embed_V_E"][t].copy() for t in tokens]
    for index in range(config.n_layers):
        layer = {name: stacked[index] for name, stacked in p["layers"].items()}
        normed = [layer_norm(x, layer["attn_norm_scale_E"], layer["attn_norm_bias_E"]) for x in xs]
        q = [[rope(normed[i] @ layer["wq_E_H_C"][:, j], i) for j in range(h)] for i in range(n)]
        kk = [[rope(normed[i] @ layer["wk_E_N_C"][:, j], i) for j in range(h)] for i in range(n)]
        v = [[normed[i] @ layer["wv_E_N_C"][:, j] for j in range(h)] for i in range(n)]
        new_xs = []
        for i in range(n):
            attn = np.zeros(e)
            for j in range(h):
                scores = np.array([q[i][j] @ kk[s][j] / math.sqrt(c) for s in range(i + 1)])
                w = np.exp(scores - scores.max())
                w /= w.sum()
                head = sum(w[s] * v[s][j] for s in range(i + 1))
                attn += head @ layer["wo_H_C_E"][j]
            x = xs[i] + attn
            hidden = layer_norm(x, layer["mlp_norm_scale_E"], layer["mlp_norm_bias_E"])
            hidden = gelu(hidden @ layer["w_in_E_F"] + layer["b_in_F"])
            new_xs.append(x + hidden @ layer["w_out_F_E"] + layer["b_out_E"])
        xs = new_xs
    return np.stack(
        [
            layer_norm(x, p["final_norm_scale_E"], p["final_norm_bias_E"]) @ p["unembed_E_V"]
            for x in xs
        ]
    )


def _batch(
    prompts: list[list[int]],
    *,
    max_new: list[int] | None = None,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seeds: np.ndarray | None = None,
    stop_ids: tuple[int, ...] = (),
    stop_seqs: tuple[tuple[int, ...], ...] = (),
) -> M.SampleBatch:
    n = len(prompts)
    prompt_B_T = np.zeros((B, T), np.int32)
    length_B = np.ones(B, np.int32)
    for i, prompt in enumerate(prompts):
        prompt_B_T[i, : len(prompt)] = prompt
        length_B[i] = len(prompt)
    max_new_B = np.zeros(B, np.int32)
    max_new_B[:n] = max_new if max_new is not None else NEW
    if seeds is None:
        seeds = np.stack([np.zeros(B), np.ones(B), np.arange(B)], 1)
    stop_mask = np.zeros((B, VOCAB_SIZE), bool)
    stop_mask[:n, list(stop_ids)] = True
    stop_seqs_B_Q_W = np.full((B, 4, 8), -1, np.int32)
    stop_valid = np.zeros((B, 4), bool)
    for s, seq in enumerate(stop_seqs):
        stop_seqs_B_Q_W[:n, s, 8 - len(seq) :] = seq
        stop_valid[:n, s] = True
    return M.SampleBatch(
        prompt_tokens_B_T=prompt_B_T,
        prompt_length_B=length_B,
        max_new_tokens_B=max_new_B,
        temperature_B=np.full(B, temperature, np.float32),
        top_k_B=np.full(B, top_k, np.int32),
        top_p_B=np.full(B, top_p, np.float32),
        key_material_B_K=np.asarray(seeds, np.uint32),
        stop_token_mask_B_V=stop_mask,
        stop_seqs_B_Q_W=stop_seqs_B_Q_W,
        stop_seq_valid_B_Q=stop_valid,
    )


def _sample(batch: M.SampleBatch, params: M.Params = PARAMS) -> M.SampleOutput:
    out = M.sample_tokens(params, batch, config=CONFIG, max_new_tokens=NEW)
    return jax.tree_util.tree_map(np.asarray, out)


def _prompts(seed: int, n: int = B) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, int(rng.integers(1, T + 1))).tolist() for _ in range(n)]


# --- config and params -----------------------------------------------------------------------


def test_named_configs_and_param_count() -> None:
    assert set(M.MODEL_CONFIGS) >= {"rlpure/tiny", "rlpure/small"}
    assert 100_000 <= M.count_params(PARAMS) <= 150_000
    assert CONFIG.init_std == 0.1 and CONFIG.vocab_size == VOCAB_SIZE
    assert all(x.dtype == jnp.float32 for x in jax.tree_util.tree_leaves(PARAMS))
    assert float(jnp.std(PARAMS["embed_V_E"])) == pytest.approx(0.1, rel=0.05)
    with pytest.raises(ValueError, match="unknown local model 'nope'"):
        M.get_model_config("nope")
    with pytest.raises(ValueError, match="divisible"):
        M.ModelConfig(vocab_size=4, d_model=10, n_layers=1, n_heads=3, d_ff=4, max_seq_len=8)


@given(st.integers(0, 5000), st.sampled_from([1, 8, 16]))
def test_bucket_size_is_the_smallest_power_of_two_at_least_n(n: int, minimum: int) -> None:
    size = bucket_size(n, minimum=minimum, steps_per_octave=1)
    assert size >= max(n, minimum) and size & (size - 1) == 0
    assert size == minimum or size // 2 < n


# --- the forward pass ------------------------------------------------------------------------


@pytest.mark.parametrize("length", [1, 5])
def test_logits_match_float64_loop_reference(length: int) -> None:
    tokens = np.random.default_rng(length).integers(0, VOCAB_SIZE, length).tolist()
    padded = np.zeros((1, T), np.int32)
    padded[0, :length] = tokens
    got = np.asarray(M.logits(PARAMS, padded, config=CONFIG))[0, :length]
    np.testing.assert_allclose(got, _reference_logits(PARAMS, tokens, CONFIG), atol=2e-4)


@settings(max_examples=15, deadline=None)
@given(st.lists(st.integers(0, VOCAB_SIZE - 1), min_size=2, max_size=T), st.data())
def test_causal_and_right_padding_invariant(tokens: list[int], data: st.DataObject) -> None:
    cut = data.draw(st.integers(1, len(tokens) - 1))
    other = data.draw(st.lists(st.integers(0, VOCAB_SIZE - 1), min_size=T, max_size=T))
    a = np.array([tokens + [0] * (T - len(tokens))], np.int32)
    b = a.copy()
    b[0, cut:] = other[cut:]  # change everything after the cut, padding included
    la = np.asarray(M.logits(PARAMS, np.repeat(a, 2, 0), config=CONFIG))[0, :cut]
    lb = np.asarray(M.logits(PARAMS, np.concatenate([b, a]), config=CONFIG))[0, :cut]
    np.testing.assert_allclose(la, lb, atol=1e-5)


def test_target_logprobs_are_normalised_log_softmax() -> None:
    tokens = np.random.default_rng(1).integers(0, VOCAB_SIZE, (2, T)).astype(np.int32)
    logits = np.asarray(M.logits(PARAMS, tokens, config=CONFIG), np.float64)
    lse = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    targets = np.roll(tokens, -1, axis=1)
    expected = np.take_along_axis(logits, targets[..., None], -1)[..., 0] - lse
    got = np.asarray(M.target_logprobs(PARAMS, tokens, targets, config=CONFIG))
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_target_logprobs_of_k_targets_a_position_are_its_columns() -> None:
    rng = np.random.default_rng(4)
    tokens = rng.integers(0, VOCAB_SIZE, (2, T)).astype(np.int32)
    ids_B_T_K = rng.integers(0, VOCAB_SIZE, (2, T, 3)).astype(np.int32)
    got = np.asarray(M.target_logprobs(PARAMS, tokens, ids_B_T_K, config=CONFIG))
    assert got.shape == (2, T, 3)
    for k in range(3):
        column = M.target_logprobs(PARAMS, tokens, ids_B_T_K[..., k], config=CONFIG)
        np.testing.assert_array_equal(got[..., k], np.asarray(column))


@pytest.mark.parametrize("k", [1, 5, VOCAB_SIZE])
def test_topk_logprobs_are_the_sorted_head_of_the_log_softmax(k: int) -> None:
    tokens = np.random.default_rng(2).integers(0, VOCAB_SIZE, (2, T)).astype(np.int32)
    tokens[1, 3:] = tokens[1, 2]  # repeated inputs: a distribution, not one input per row
    ids, lps = (np.asarray(a) for a in M.topk_logprobs(PARAMS, tokens, k=k, config=CONFIG))
    assert ids.shape == lps.shape == (2, T, k) and ids.dtype == np.int32
    logits = np.asarray(M.logits(PARAMS, tokens, config=CONFIG), np.float64)
    full = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True))
    full -= logits.max(-1, keepdims=True)
    order = np.argsort(-full, axis=-1, kind="stable")[..., :k]  # ties: the lower id first
    np.testing.assert_allclose(lps, np.take_along_axis(full, order, -1), atol=1e-5)
    assert np.all(np.diff(lps, axis=-1) <= 0)  # most likely first
    picked = np.take_along_axis(full, ids.astype(np.int64), -1)  # the ids carry their values
    np.testing.assert_allclose(lps, picked, atol=1e-5)
    assert all(len(set(row)) == k for row in ids.reshape(-1, k).tolist())  # k distinct tokens


def test_ids_logprobs_read_the_log_softmax_at_each_id() -> None:
    rng = np.random.default_rng(3)
    tokens = rng.integers(0, VOCAB_SIZE, (2, T)).astype(np.int32)
    ids = rng.integers(-1, VOCAB_SIZE, (2, T, 3)).astype(np.int32)
    got = np.asarray(M.ids_logprobs(PARAMS, tokens, ids, config=CONFIG))
    logits = np.asarray(M.logits(PARAMS, tokens, config=CONFIG), np.float64)
    full = logits - logits.max(-1, keepdims=True)
    full -= np.log(np.exp(full).sum(-1, keepdims=True))
    np.testing.assert_allclose(got, np.take_along_axis(full, np.maximum(ids, 0), -1), atol=1e-5)
    one = np.asarray(M.ids_logprobs(PARAMS, tokens, ids[..., :1], config=CONFIG))[..., 0]
    np.testing.assert_allclose(  # one id a position: target_logprobs' values
        one,
        np.asarray(M.target_logprobs(PARAMS, tokens, np.maximum(ids[..., 0], 0), config=CONFIG)),
        atol=2e-6,
    )


# --- sampling --------------------------------------------------------------------------------


def _training_logprobs(prompt: list[int], completion: Any) -> np.ndarray:
    seq = np.concatenate([prompt, completion]).astype(np.int32)
    width = 2 * T + NEW
    inputs = np.zeros((1, width), np.int32)
    targets = np.zeros((1, width), np.int32)
    inputs[0, : len(seq) - 1] = seq[:-1]
    targets[0, : len(seq) - 1] = seq[1:]
    lp = np.asarray(M.target_logprobs(PARAMS, inputs, targets, config=CONFIG))[0]
    return lp[len(prompt) - 1 : len(seq) - 1]


def test_sampler_logprobs_equal_training_logprobs() -> None:
    prompts = _prompts(3)
    out = _sample(_batch(prompts, temperature=1.0))
    for i, prompt in enumerate(prompts):
        n = out.num_tokens_B[i]
        assert n == NEW and not out.stopped_B[i]
        np.testing.assert_allclose(
            out.logprobs_B_M[i, :n], _training_logprobs(prompt, out.tokens_B_M[i, :n]), atol=1e-5
        )


def test_greedy_equals_stepwise_argmax_reference() -> None:
    prompts = _prompts(4, n=3)
    out = _sample(_batch(prompts, temperature=0.0, max_new=[6, 6, 6]))
    for i, prompt in enumerate(prompts):
        seq = list(prompt)
        for _ in range(6):
            padded = np.zeros((1, 2 * T), np.int32)
            padded[0, : len(seq)] = seq
            seq.append(
                int(np.argmax(np.asarray(M.logits(PARAMS, padded, config=CONFIG))[0, len(seq) - 1]))
            )
        assert out.tokens_B_M[i, :6].tolist() == seq[len(prompt) :]
        assert out.num_tokens_B[i] == 6
    top1 = _sample(_batch(prompts, temperature=1.0, top_k=1, max_new=[6, 6, 6]))
    np.testing.assert_array_equal(top1.tokens_B_M, out.tokens_B_M)
    tiny_nucleus = _sample(_batch(prompts, temperature=1.0, top_p=1e-6, max_new=[6, 6, 6]))
    np.testing.assert_array_equal(tiny_nucleus.tokens_B_M, out.tokens_B_M)


def test_stop_tokens_sequences_and_lengths() -> None:
    prompts = _prompts(5, n=4)
    free = _sample(_batch(prompts, temperature=0.0))
    # A stop token: the row ends right after the first occurrence, token included.
    row0 = free.tokens_B_M[0]
    stop_token = int(row0[3])
    first = row0.tolist().index(stop_token)
    out = _sample(_batch(prompts[:1], temperature=0.0, stop_ids=(stop_token,)))
    assert out.num_tokens_B[0] == first + 1 and out.stopped_B[0]
    assert out.tokens_B_M[0, : first + 1].tolist() == row0[: first + 1].tolist()
    assert (out.tokens_B_M[0, first + 1 :] == 0).all() and (
        out.logprobs_B_M[0, first + 1 :] == 0
    ).all()
    # A stop sequence: the row ends once its generated tail equals the sequence.
    row1 = free.tokens_B_M[1].tolist()
    seq = tuple(row1[4:7])
    end = next(i + 3 for i in range(NEW - 2) if tuple(row1[i : i + 3]) == seq)
    out = _sample(_batch(prompts[:2], temperature=0.0, stop_seqs=((999_999,), seq)))
    assert out.num_tokens_B[1] == end and out.stopped_B[1]
    assert out.tokens_B_M[1, :end].tolist() == row1[:end]
    # A stop sequence that would need the prompt's tokens does not fire.
    prompt = prompts[2]
    straddle = (prompt[-1], int(free.tokens_B_M[2, 0]))
    if straddle not in {tuple(free.tokens_B_M[2, i : i + 2]) for i in range(NEW - 1)}:
        out = _sample(_batch(prompts[:3], temperature=0.0, stop_seqs=(straddle,)))
        assert out.num_tokens_B[2] == NEW and not out.stopped_B[2]
    # Per-row max_new_tokens, reason "length"; padding rows generate nothing.
    out = _sample(_batch(prompts, temperature=1.0, max_new=[1, 5, 16, 3]))
    assert out.num_tokens_B.tolist() == [1, 5, 16, 3, 0, 0, 0, 0]
    assert not out.stopped_B.any()
    # Every token a stop token: one token each, reason "stop".
    out = _sample(_batch(prompts, temperature=1.0, stop_ids=tuple(range(VOCAB_SIZE))))
    assert out.num_tokens_B[:4].tolist() == [1, 1, 1, 1] and out.stopped_B[:4].all()
    assert EOS_ID < VOCAB_SIZE


_PIECES = ("a", "b", "ab", "ba", "c", "", "abc", "<|s|>")  # token id -> its text


@settings(max_examples=300, deadline=None)
@given(
    tokens=st.lists(st.integers(0, len(_PIECES) - 1), max_size=12),
    stops=st.lists(st.text("abc<|s>", min_size=1, max_size=4), min_size=1, max_size=3),
)
def test_stop_string_end_is_the_first_prefix_whose_text_holds_a_stop(
    tokens: list[int], stops: list[str]
) -> None:
    def decode(ids: list[int]) -> str:
        return "".join(_PIECES[i] for i in ids)

    # The slow reference: every prefix, shortest first.
    want = next(
        (n for n in range(1, len(tokens) + 1) if any(s in decode(tokens[:n]) for s in stops)),
        None,
    )
    assert M.stop_string_end(tokens, stops, decode) == want


def test_stop_string_end_spans_tokens_and_refuses_an_empty_stop() -> None:
    def decode(ids: list[int]) -> str:
        return "".join(_PIECES[i] for i in ids)

    # "bc" is spelled by "ab" + "c" (ids 2, 4): neither token alone holds it.
    assert M.stop_string_end([0, 2, 4, 1], ["bc"], decode) == 3
    assert M.stop_string_end([0, 2, 4, 1], ["x"], decode) is None
    assert M.stop_string_end([], ["a"], decode) is None
    with pytest.raises(ValueError, match="empty stop string"):
        M.stop_string_end([0], ["a", ""], decode)


def test_same_seeds_same_samples_and_rows_are_independent() -> None:
    prompts = _prompts(6)
    first = _sample(_batch(prompts))
    again = _sample(_batch(prompts))
    np.testing.assert_array_equal(first.tokens_B_M, again.tokens_B_M)
    np.testing.assert_array_equal(first.logprobs_B_M, again.logprobs_B_M)
    # Changing the other rows (prompts and seeds) does not change row 0.
    seeds = np.stack([np.zeros(B), np.ones(B), np.arange(B)], 1)
    seeds[1:, 2] += 100
    shuffled = _sample(_batch([prompts[0], *_prompts(7, n=B - 1)], seeds=seeds))
    np.testing.assert_array_equal(shuffled.tokens_B_M[0], first.tokens_B_M[0])
    # Different key material gives different samples.
    seeds[0, 2] = 12345
    other = _sample(_batch(prompts, seeds=seeds))
    assert (other.tokens_B_M[0] != first.tokens_B_M[0]).any()


def test_second_call_in_the_same_bucket_does_not_retrace() -> None:
    _sample(_batch(_prompts(8, n=3)))
    with count_compiles() as compiled:
        _sample(_batch(_prompts(9, n=7), max_new=[2] * 7, temperature=0.0, stop_seqs=((1, 2),)))
    assert compiled.traces_of(M.sample_tokens) == 0
    tokens = np.zeros((4, T), np.int32)
    M.target_logprobs(PARAMS, tokens, tokens, config=CONFIG)
    with count_compiles() as compiled:
        M.target_logprobs(PARAMS, tokens + 1, tokens + 2, config=CONFIG)
    assert compiled.traces_of(M.target_logprobs) == 0


# --- optimiser -------------------------------------------------------------------------------


@pytest.mark.parametrize("clip", [0.0, 0.5])
def test_adam_step_matches_float64_reference(clip: float) -> None:
    rng = np.random.default_rng(0)
    params = {"a": jnp.asarray(rng.normal(size=(3, 2)), jnp.float32), "b": jnp.ones(4)}
    hyper = M.AdamHyperparams(
        learning_rate=0.01, beta1=0.8, beta2=0.9, eps=1e-6, weight_decay=0.1, grad_clip_norm=clip
    )
    state = M.init_optimizer_state(params)
    ref = {k: np.asarray(v, np.float64) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in ref.items()}
    v = {k: np.zeros_like(x) for k, x in ref.items()}
    for step in range(1, 4):
        grads = {k: rng.normal(size=x.shape) for k, x in ref.items()}
        params, state, norm = M.apply_adam_update(
            params, state, jax.tree_util.tree_map(jnp.float32, grads), hyper
        )
        total = math.sqrt(sum((g**2).sum() for g in grads.values()))
        assert float(norm) == pytest.approx(total, rel=1e-5)
        scale = min(1.0, clip / total) if clip > 0 else 1.0
        for k in ref:
            g = grads[k] * scale
            m[k] = 0.8 * m[k] + 0.2 * g
            v[k] = 0.9 * v[k] + 0.1 * g**2
            m_hat, v_hat = m[k] / (1 - 0.8**step), v[k] / (1 - 0.9**step)
            ref[k] = ref[k] - 0.01 * (m_hat / (np.sqrt(v_hat) + 1e-6) + 0.1 * ref[k])
        for k in ref:
            np.testing.assert_allclose(np.asarray(params[k]), ref[k], rtol=1e-5, atol=1e-6)


def test_sampled_logprobs_are_those_of_the_tempered_distribution() -> None:
    # Tinker reports log p_T(token) = log_softmax(logits / T)[token] for the token it drew.
    prompts = _prompts(6, n=3)
    for temperature in (0.5, 2.0):
        out = _sample(_batch(prompts, temperature=temperature, max_new=[5, 5, 5]))
        for i, prompt in enumerate(prompts):
            seq = list(prompt) + out.tokens_B_M[i, :5].tolist()
            padded = np.zeros((1, 2 * T), np.int32)
            padded[0, : len(seq)] = seq
            logits_T_V = np.asarray(M.logits(PARAMS, padded, config=CONFIG), np.float64)[0]
            for k in range(5):
                position = len(prompt) - 1 + k
                scaled_V = logits_T_V[position] / temperature
                want = scaled_V[seq[position + 1]] - np.log(np.exp(scaled_V - scaled_V.max()).sum())
                want -= scaled_V.max()
                assert abs(out.logprobs_B_M[i, k] - want) < 1e-4, (temperature, i, k)


def test_sampled_logprobs_never_positive_or_infinite_for_a_confident_model() -> None:
    # A trained policy is near-certain of many tokens; log_softmax(logits / 0.7) of such a token
    # used to come out a few ulps above 0, which TokensWithLogprobs refuses. Tiny temperatures
    # used to give +-inf.
    peaked = dict(PARAMS)
    peaked["unembed_E_V"] = PARAMS["unembed_E_V"] * 100.0
    prompts = _prompts(6, n=3)
    for temperature in (1e-12, 0.05, 0.3, 0.7, 1.0):
        out = _sample(_batch(prompts, temperature=temperature, max_new=[16, 16, 16]), peaked)
        logprobs = out.logprobs_B_M[:3]
        assert np.all(np.isfinite(logprobs)), temperature
        assert np.all(logprobs <= 0.0), (temperature, float(logprobs.max()))


def test_the_suite_runs_with_implicit_rank_promotion_as_an_error() -> None:
    # tests/conftest.py sets it; the model's broadcasts are explicit (`scale_E[None, None, :]`).
    # a getattr: jax.config declares no type for its flag attributes
    assert getattr(jax.config, "jax_numpy_rank_promotion") == "raise"  # noqa: B009
    with pytest.raises(ValueError, match="rank_promotion"):
        jnp.ones((2, 3)) * jnp.ones((3,))
