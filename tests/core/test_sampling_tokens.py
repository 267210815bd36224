"""Pinned tokens of `rlpure.model.sample_tokens` for fixed seeds, and the pieces of its draw
against `jax.random`: speeding the decode loop up must not change what a seed samples.

The pins were recorded before the decode loop was restructured (per-layer KV-cache buffers,
the unrolled layers and threefry; issue 29) and held after it. They are float results of
XLA's CPU backend: a machine whose CPU features change the rounding may move a logprob in
its last bits (hence the tolerance) and, rarely, a tempered token; greedy tokens should hold.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlpure import model as M
from rlpure.model import _sampling
from rlpure.model._layers import NEG_INF

CONFIG = M.get_model_config("rlpure/tiny")
PARAMS = M.init_params(jax.random.key(0), CONFIG)
B, T, NEW = 8, 16, 16

# Recorded at 135b35c (before issue 29's decode changes): tokens, then the sum of logprobs.
_TEMPERED_TOKENS = [
    [164, 86, 208, 74, 74, 71, 121, 31, 127, 247, 228, 61, 88, 71, 254, 162],
    [149, 233, 258, 240, 122, 110, 111, 182, 210, 235, 74, 153, 191, 89, 17, 211],
    [96, 18, 47, 213, 147, 190, 119, 162, 213, 135, 113, 192, 220, 87, 234, 69],
    [175, 250, 253, 208, 113, 103, 49, 177, 147, 31, 43, 63, 49, 25, 199, 63],
    [176, 127, 212, 44, 121, 202, 75, 81, 32, 44, 104, 128, 61, 121, 255, 242],
    [209, 109, 161, 55, 214, 11, 10, 225, 147, 88, 95, 7, 104, 90, 178, 156],
    [39, 208, 5, 6, 257, 23, 25, 181, 55, 202, 7, 161, 174, 60, 203, 174],
    [162, 114, 102, 168, 113, 188, 27, 229, 214, 109, 3, 214, 214, 220, 171, 208],
]
# Re-recorded in session 22, when the top-p nucleus became the tempered distribution's
# (`_filter_logits`); the draw's noise and the other pins are unchanged.
_FILTERED_TOKENS = [
    [172, 150, 9, 244, 164, 242, 203, 87, 242, 242, 140, 242, 195, 107, 242, 204],
    [63, 140, 202, 63, 6, 6, 227, 6, 220, 124, 242, 127, 9, 182, 137, 87],
    [177, 182, 116, 246, 231, 177, 75, 96, 127, 75, 127, 96, 142, 218, 66, 107],
    [177, 66, 188, 75, 24, 137, 83, 166, 258, 209, 67, 208, 67, 127, 61, 177],
    [76, 204, 157, 212, 231, 117, 117, 231, 72, 201, 15, 116, 256, 95, 9, 178],
    [195, 140, 67, 104, 43, 25, 66, 169, 252, 104, 214, 72, 188, 207, 107, 7],
    [150, 116, 246, 60, 244, 60, 60, 105, 235, 107, 7, 17, 75, 105, 150, 43],
    [72, 213, 150, 60, 94, 232, 104, 214, 104, 221, 177, 252, 133, 247, 150, 221],
]
_GREEDY_TOKENS = [
    [75, 214, 150, 188, 67, 188, 67, 188, 67, 107, 121, 242, 188, 67, 107, 242],
    [192, 117, 246, 246, 121, 182, 17, 75, 66, 75, 66, 121, 63, 127, 242, 121],
    [17, 63, 94, 94, 94, 138, 151, 138, 138, 138, 138, 138, 107, 107, 61, 107],
    [17, 17, 17, 63, 63, 227, 127, 17, 63, 182, 94, 90, 227, 227, 17, 17],
    [142, 122, 175, 242, 66, 60, 60, 60, 60, 60, 60, 60, 7, 177, 7, 177],
    [188, 67, 242, 192, 192, 192, 75, 107, 242, 242, 242, 242, 242, 242, 242, 188],
    [75, 107, 107, 107, 107, 107, 107, 107, 107, 107, 192, 107, 242, 242, 74, 242],
    [177, 150, 150, 150, 17, 17, 17, 17, 17, 17, 17, 17, 17, 17, 17, 17],
]
_PINS = {
    (1.0, 0, 1.0, 1): (_TEMPERED_TOKENS, -661.14404296875),
    (0.7, 20, 0.9, 2): (_FILTERED_TOKENS, -477.6781005859375),
    (0.0, 0, 1.0, 3): (_GREEDY_TOKENS, -450.68017578125),
}


def _batch(temperature: float, top_k: int, top_p: float, seed: int) -> M.SampleBatch:
    """`B` rows of random prompts of random lengths in `[1, T]`, key material `(seed, row)`."""
    rng = np.random.default_rng(seed)
    lengths_B = rng.integers(1, T + 1, B)
    prompt_B_T = np.zeros((B, T), np.int32)
    for i, n in enumerate(lengths_B):
        prompt_B_T[i, :n] = rng.integers(0, 256, n)
    return M.SampleBatch(
        prompt_tokens_B_T=prompt_B_T,
        prompt_length_B=lengths_B.astype(np.int32),
        max_new_tokens_B=np.full(B, NEW, np.int32),
        temperature_B=np.full(B, temperature, np.float32),
        top_k_B=np.full(B, top_k, np.int32),
        top_p_B=np.full(B, top_p, np.float32),
        key_material_B_K=np.stack([np.full(B, seed), np.arange(B)], 1).astype(np.uint32),
        stop_token_mask_B_V=np.zeros((B, CONFIG.vocab_size), bool),
        stop_seqs_B_Q_W=np.full((B, 4, 8), -1, np.int32),
        stop_seq_valid_B_Q=np.zeros((B, 4), bool),
    )


@pytest.mark.parametrize("settings", list(_PINS))
def test_a_seed_samples_the_pinned_tokens(settings: tuple[float, int, float, int]) -> None:
    tokens, logprob_sum = _PINS[settings]
    out = M.sample_tokens(PARAMS, _batch(*settings), config=CONFIG, max_new_tokens=NEW)
    np.testing.assert_array_equal(np.asarray(out.tokens_B_M), tokens)
    assert float(np.asarray(out.logprobs_B_M).sum()) == pytest.approx(logprob_sum, rel=1e-5)


@pytest.mark.parametrize("seed", range(6))
def test_the_nucleus_is_the_tempered_top_k_distributions(seed: int) -> None:
    """`_filter_logits` keeps what vLLM, SGLang and `transformers` keep: the top-k tokens, then
    the smallest head of `softmax(logits / T)` renormalised over them whose mass reaches
    `top_p` (a reference in numpy; the nucleus was once taken before the temperature)."""
    rng = np.random.default_rng(seed)
    rows, v = 16, 300
    logits = (rng.normal(size=(rows, v)) * rng.uniform(1, 6, (rows, 1))).astype(np.float32)
    top_k = rng.choice([0, 5, 40, 300], rows).astype(np.int32)
    top_p = rng.choice([1.0, 0.95, 0.5, 0.1], rows).astype(np.float32)
    temperature = rng.choice([1.0, 0.25, 0.7, 2.0], rows).astype(np.float32)
    kept = (
        np.asarray(
            _sampling._filter_logits(
                jnp.asarray(logits),
                jnp.asarray(top_k),
                jnp.asarray(top_p),
                jnp.asarray(temperature),
            )
        )
        > NEG_INF
    )
    for r in range(rows):
        order = np.argsort(-logits[r], kind="stable")
        k = top_k[r] if top_k[r] > 0 else v
        head = logits[r][order[:k]].astype(np.float64) / temperature[r]
        probs = np.exp(head - head.max())
        probs /= probs.sum()
        before = np.cumsum(probs) - probs
        n = k if top_p[r] >= 1 else max(int(np.sum(before < top_p[r])), 1)
        assert set(np.flatnonzero(kept[r])) == set(order[:n].tolist()), r


def _step_keys(n: int, salt: int) -> jax.Array:
    keys = jax.vmap(jax.random.key)(jnp.arange(n, dtype=jnp.uint32) * 977 + salt)
    return jax.vmap(lambda key: jax.random.fold_in(key, salt))(keys)


@pytest.mark.parametrize("salt", [0, 1, 12345])
def test_gumbel_noise_is_jax_random_gumbel_bit_for_bit(salt: int) -> None:
    keys = _step_keys(16, salt)
    got = np.asarray(jax.jit(_sampling._gumbel_noise, static_argnums=1)(keys, 3001))
    want = np.asarray(jax.vmap(lambda key: jax.random.gumbel(key, (3001,)))(keys))
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_the_draw_is_jax_random_categorical() -> None:
    """`_draw_tokens` picks what `jax.random.categorical` picks (the sampler's former draw)
    with the same keys, filtered or not, and its first-maximum argmax is `jnp.argmax`'s."""
    rng = np.random.default_rng(0)
    logits_B_V = rng.normal(size=(32, 1000)).astype(np.float32) * 3
    logits_B_V[:, ::7] = -1e30  # filtered-out entries
    keys = _step_keys(32, 5)
    want = jax.vmap(jax.random.categorical)(keys, logits_B_V)
    noise = _sampling._gumbel_noise(keys, 1000)
    got = _sampling._first_argmax(jax.lax.optimization_barrier(noise + logits_B_V))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    ties = np.array([[1.0, 3.0, 3.0, 0.0], [np.nan, 2.0, np.nan, 9.0], [-1, -1, -1, -1]])
    np.testing.assert_array_equal(
        np.asarray(_sampling._first_argmax(jnp.asarray(ties, jnp.float32))), [1, 0, 0]
    )


def test_a_mixed_batch_samples_each_row_as_its_own_settings_do() -> None:
    """Greedy, tempered and filtered rows in one batch (the draw, the sort and the argmax
    each run only when some live row needs them) sample what they sample apart."""
    settings = list(_PINS)
    batches = [_batch(*s) for s in settings]
    row_settings = np.arange(B) % len(settings)
    rows: dict[str, Any] = {
        name: np.stack([getattr(batches[k], name)[row] for row, k in enumerate(row_settings)])
        for name in M.SampleBatch.__struct_fields__
        if name
        not in ("prompt_index_B", "rows_per_prompt", "shared_prefix_length", "prefix_widths")
    }
    mixed = M.SampleBatch(**rows)
    out = M.sample_tokens(PARAMS, mixed, config=CONFIG, max_new_tokens=NEW)
    for row, k in enumerate(row_settings):
        np.testing.assert_array_equal(np.asarray(out.tokens_B_M)[row], _PINS[settings[k]][0][row])
