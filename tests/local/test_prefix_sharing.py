"""Prefix-shared `forward` and `forward_backward` equal the unshared computation.

The datums of a call that share token prefixes are packed as tries (`plan_prefix_chunks`,
`pack_prefix_chunk`) and run through `rlpure.model.prefix_target_logprobs_fn`, or grouped by a
shared prefix (`plan_grouped_chunks`, `pack_grouped_chunk`: a prefix row per group, a suffix row
per datum) and run through `rlpure.model.grouped_target_logprobs_fn`. Here, for both, on prefix
trees with no sharing, full sharing, nested sharing and a datum that is a prefix of another (and
random trees), the logprobs, losses and gradients of that route are compared with the unshared
route's, at the model level (a llama-family toy with grouped-query attention, full weights and
LoRA adapters) and through the training client (full fine-tuning of a toy model, LoRA on a
tiny pretrained Llama). Tolerances are float32 reassociation: masked keys get weight exactly 0,
only the order of the sums changes. A mask that drops a branch's attention to its prompt (a
suffix's to its prefix row) fails the comparison, and a new sharing pattern of the same padded
shapes does not recompile.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import msgspec
import numpy as np
import pytest
from tinker import types

from rlpure import model as model_lib
from rlpure.model import _grouped_forward, _prefix_forward
from rlpure.packing import (
    GroupedChunk,
    group_shared_prefixes,
    plan_grouped_chunks,
    prefix_tree_size,
    sort_sequences,
)
from shell.local import LocalTrainingClient, _training
from shell.local._inputs import (
    CheckedData,
    TrainChunk,
    check_data,
    pack_grouped_chunk,
    pack_prefix_chunk,
    pack_rows,
    plan_prefix_chunks,
    prefix_key_weight,
)
from shell.local._train_steps import (
    lora_logprobs,
    lora_loss_and_grad,
    loss_and_logprob_grad,
    model_backward,
    model_forward_vjp,
)
from tests.compile_count import count_compiles
from tests.local.hf_fixtures import random_llama_trainer, restoring_routes
from tests.local.micro import MICRO_NAME, micro_service

CONFIG = model_lib.ModelConfig(
    vocab_size=61,
    d_model=32,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    d_ff=48,
    max_seq_len=128,
    family="llama",
    init_std=0.2,
)
LORA = model_lib.LoraConfig(rank=4)

Case = Callable[[np.random.Generator], list[np.ndarray]]


def _tokens(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(0, 50, n).astype(np.int64)


def _no_sharing(rng: np.random.Generator) -> list[np.ndarray]:
    return [np.concatenate([[50 + d], _tokens(rng, 3 + 2 * d)]) for d in range(4)]


def _full_sharing(rng: np.random.Generator) -> list[np.ndarray]:
    same = _tokens(rng, 9)
    return [same.copy() for _ in range(4)]


def _nested(rng: np.random.Generator) -> list[np.ndarray]:
    system = _tokens(rng, 6)
    out = []
    for _ in range(2):
        prompt = np.concatenate([system, _tokens(rng, 5)])
        out += [np.concatenate([prompt, _tokens(rng, int(rng.integers(1, 6)))]) for _ in range(3)]
    return out


def _prefix_of_another(rng: np.random.Generator) -> list[np.ndarray]:
    long = _tokens(rng, 14)
    return [long[:8], long, long[:8].copy(), np.concatenate([long[:8], _tokens(rng, 3)])]


def _random_tree(rng: np.random.Generator) -> list[np.ndarray]:
    """2–7 sequences, each after the first extending a random prefix of an earlier one by 0–5
    tokens (at least 1 when the prefix is empty)."""
    out = [_tokens(rng, int(rng.integers(1, 10)))]
    for _ in range(int(rng.integers(1, 7))):
        base = out[int(rng.integers(len(out)))]
        stem = base[: int(rng.integers(0, base.size + 1))]
        out.append(
            np.concatenate([stem, _tokens(rng, int(rng.integers(0 if stem.size else 1, 6)))])
        )
    return out


CASES: dict[str, Case] = {
    "no sharing": _no_sharing,
    "full sharing": _full_sharing,
    "nested": _nested,
    "prefix of another": _prefix_of_another,
    **{f"random tree {seed}": _random_tree for seed in range(4)},
}


def _checked(seqs: list[np.ndarray], rng: np.random.Generator) -> CheckedData:
    inputs = [
        {
            "target_tokens": _tokens(rng, s.size),
            "advantages": rng.normal(size=s.size).astype(np.float32),
        }
        for s in seqs
    ]
    return CheckedData(
        tokens_D=tuple(seqs), inputs_D=tuple(inputs), keys=("advantages", "target_tokens")
    )


# Every case is padded to these shapes (rows, row width, datum rows, datum length), so the
# model-level comparison compiles once per route and adapter setting.
SHAPES = (8, 64, 8, 64)


def _packs(seqs: list[np.ndarray], rng: np.random.Generator, row_width: int) -> tuple[Any, Any]:
    """(the prefix-shared pack, the unshared pack of the same datums in the same order)."""
    checked = _checked(seqs, rng)
    plan = plan_prefix_chunks(
        checked.tokens_D, rows_for_width=lambda width: 64, max_fraction=1.0, row_width=row_width
    )
    assert plan is not None and len(plan.chunks) == 1
    rows, width, datums, length = SHAPES
    assert plan.rows <= rows and plan.width <= width
    assert plan.datums <= datums and plan.length <= length
    plan = msgspec.structs.replace(plan, rows=rows, width=width, datums=datums, length=length)
    chunk = plan.chunks[0]
    shared = pack_prefix_chunk(checked, plan, chunk)
    plain = pack_rows(checked, TrainChunk(index_D=chunk.index_D, rows=datums, width=length))
    return shared, plain


def _routes(
    params: Any,
    adapters: Any,
    prefix: model_lib.PrefixRows,
    input_D_T: jax.Array,
    target_D_T: jax.Array,
    weight_D_T: jax.Array,
    valid_D_T: jax.Array,
    *,
    lora: bool,
) -> dict[str, tuple[Any, Any]]:
    """Logprobs (zero on padding) and the gradient of `Σ weight · lp` (of the full weights,
    or of the adapters with `lora`) on the prefix-shared and the unshared route."""
    lora_config = LORA if lora else None

    def shared_lp(p: Any, a: Any) -> jax.Array:
        return model_lib.prefix_target_logprobs_fn(p, prefix, target_D_T, CONFIG, a, lora_config)

    def plain_lp(p: Any, a: Any) -> jax.Array:
        return model_lib.target_logprobs_fn(p, input_D_T, target_D_T, CONFIG, a, lora_config)

    out = {}
    for name, fn in (("shared", shared_lp), ("plain", plain_lp)):
        if lora:
            lp_D_T, vjp = jax.vjp(lambda a, fn=fn: fn(params, a), adapters)
        else:
            lp_D_T, vjp = jax.vjp(lambda p, fn=fn: fn(p, adapters), params)
        (grads,) = vjp(weight_D_T)
        out[name] = (lp_D_T * valid_D_T, grads)
    return out


_routes_jit = jax.jit(_routes, static_argnames="lora")


@functools.cache
def _weights() -> tuple[Any, Any]:
    """Random weights (norm scales near 1) and adapters with `B ≠ 0`, drawn once with numpy in
    the shapes of `init_params` and `init_lora` (their eager init compiles op by op: ~20 s on
    a loaded 2-core machine)."""
    rng = np.random.default_rng(0)

    def draw(path: Any, leaf: jax.ShapeDtypeStruct) -> np.ndarray:
        noise = rng.normal(size=leaf.shape).astype(np.float32)
        return 1.0 + 0.1 * noise if "norm_scale" in jax.tree_util.keystr(path) else 0.2 * noise

    params = jax.eval_shape(lambda: model_lib.init_params(jax.random.key(0), CONFIG))
    adapters = jax.eval_shape(lambda: model_lib.init_lora(jax.random.key(1), CONFIG, LORA))
    return (
        jax.tree_util.tree_map_with_path(draw, params),
        jax.tree_util.tree_map_with_path(draw, adapters),
    )


def _both_routes(
    seqs: list[np.ndarray], seed: int, row_width: int, *, lora: bool, routes: Any = _routes_jit
) -> dict[str, tuple[Any, Any]]:
    """`_routes` on `seqs` packed both ways (inputs drawn from `seed`), with `_weights()`."""
    rng = np.random.default_rng(seed)
    shared, plain = _packs(seqs, rng, row_width)
    params, adapters = _weights()
    weight_D_T = shared.inputs["advantages"] * shared.valid_D_T
    out: dict[str, tuple[Any, Any]] = routes(
        params,
        adapters if lora else None,
        shared.prefix,
        plain.input_D_T,
        plain.inputs["target_tokens"],
        weight_D_T,
        plain.valid_D_T,
        lora=lora,
    )
    return out


def _assert_trees_close(a: Any, b: Any) -> None:
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        x, y = np.asarray(x), np.asarray(y)
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(y).max())))


def _assert_routes_equal(routes: dict[str, tuple[Any, Any]]) -> None:
    (lp_shared, g_shared), (lp_plain, g_plain) = routes["shared"], routes["plain"]
    # Float32 reassociation grows with the logprob's size: on an AMD EPYC (AVX2) one LoRA
    # logprob of -9.30 differs by 2.0e-5 (2.2e-6 relative), 1e-6 or less elsewhere; a branch
    # that loses its prompt differs by 2.3 (`test_a_branch_that_cannot_see_its_prompt…`).
    np.testing.assert_allclose(lp_shared, lp_plain, rtol=5e-6, atol=2e-5)
    _assert_trees_close(g_shared, g_plain)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("name", list(CASES))
def test_model_logprobs_and_gradients_equal_the_unshared_pass(name: str, lora: bool) -> None:
    seed = sum(map(ord, name))
    seqs = CASES[name](np.random.default_rng(seed))
    # Rows of at most 12 nodes: larger trees are cut, the prefix packed in several rows.
    for row_width in (12, 512):
        _assert_routes_equal(_both_routes(seqs, seed, row_width, lora=lora))


def _mask_without_the_prompt(end_R_W: jax.Array) -> jax.Array:
    """A plausible bug: a query reads only keys whose subtree ends where its own does, so every
    branch but the last loses its prompt (and the last keeps it)."""
    original = _original_mask(end_R_W)
    return original & (end_R_W[:, None, :] == end_R_W[:, :, None])


_original_mask = _prefix_forward.prefix_attention_mask


def test_a_branch_that_cannot_see_its_prompt_fails_the_comparison(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seqs = CASES["nested"](np.random.default_rng(0))
    _assert_routes_equal(_both_routes(seqs, 0, 512, lora=False))
    monkeypatch.setattr(_prefix_forward, "prefix_attention_mask", _mask_without_the_prompt)
    # A fresh jit, so the patched mask is traced (the module's would reuse its cache).
    fresh = jax.jit(lambda *args, **kwargs: _routes(*args, **kwargs), static_argnames="lora")
    with pytest.raises(AssertionError, match="Not equal to tolerance"):
        _assert_routes_equal(_both_routes(seqs, 0, 512, lora=False, routes=fresh))


# -- the grouped route (a prefix row per group, a suffix row per datum) --

# Every grouped case is padded to these shapes (prefix rows, prefix width, datum rows, suffix
# width), the datums to SHAPES' length.
GROUPED_SHAPES = (8, 32, 8, 32)


def _grouped_pack(seqs: list[np.ndarray], rng: np.random.Generator, widths: Any) -> Any:
    """(the grouped pack, the unshared pack of the same datums in the same order): grouped by
    the planner, or at the given (prefix width, suffix width)."""
    checked = _checked(seqs, rng)
    plan = plan_grouped_chunks(
        checked.tokens_D, positions_for_keys=lambda keys: 4096, key_weight=0.0
    )
    assert plan is not None and len(plan.chunks) == 1
    if widths is not None:
        s, u = widths
        groups = group_shared_prefixes(
            sort_sequences(checked.tokens_D), prefix_width=s, suffix_width=u, max_datums=8
        )
        assert groups is not None
        plan = msgspec.structs.replace(
            plan, chunks=(GroupedChunk(groups=tuple(groups)),), prefix_width=s, suffix_width=u
        )
    p, s, d, u = GROUPED_SHAPES
    assert plan.prefix_rows <= p and len(plan.chunks[0].groups) <= p
    assert plan.prefix_width <= s and plan.datums <= d and plan.suffix_width <= u
    plan = msgspec.structs.replace(plan, prefix_rows=p, prefix_width=s, datums=d, suffix_width=u)
    chunk = plan.chunks[0]
    grouped = pack_grouped_chunk(checked, plan, chunk, length=SHAPES[3])
    plain = pack_rows(checked, TrainChunk(index_D=chunk.index_D, rows=d, width=SHAPES[3]))
    return grouped, plain


def _grouped_routes(
    params: Any,
    adapters: Any,
    rows: model_lib.GroupedRows,
    input_D_T: jax.Array,
    target_D_T: jax.Array,
    weight_D_T: jax.Array,
    valid_D_T: jax.Array,
    *,
    lora: bool,
) -> dict[str, tuple[Any, Any]]:
    """`_routes` with the grouped route as "shared"."""
    lora_config = LORA if lora else None

    def shared_lp(p: Any, a: Any) -> jax.Array:
        return model_lib.grouped_target_logprobs_fn(p, rows, target_D_T, CONFIG, a, lora_config)

    def plain_lp(p: Any, a: Any) -> jax.Array:
        return model_lib.target_logprobs_fn(p, input_D_T, target_D_T, CONFIG, a, lora_config)

    out = {}
    for name, fn in (("shared", shared_lp), ("plain", plain_lp)):
        if lora:
            lp_D_T, vjp = jax.vjp(lambda a, fn=fn: fn(params, a), adapters)
        else:
            lp_D_T, vjp = jax.vjp(lambda p, fn=fn: fn(p, adapters), params)
        (grads,) = vjp(weight_D_T)
        out[name] = (lp_D_T * valid_D_T, grads)
    return out


_grouped_routes_jit = jax.jit(_grouped_routes, static_argnames="lora")


def _grouped_both(
    seqs: list[np.ndarray], seed: int, widths: Any, *, lora: bool, routes: Any = _grouped_routes_jit
) -> dict[str, tuple[Any, Any]]:
    rng = np.random.default_rng(seed)
    grouped, plain = _grouped_pack(seqs, rng, widths)
    params, adapters = _weights()
    weight_D_T = grouped.inputs["advantages"] * grouped.valid_D_T
    out: dict[str, tuple[Any, Any]] = routes(
        params,
        adapters if lora else None,
        grouped.prefix,
        plain.input_D_T,
        plain.inputs["target_tokens"],
        weight_D_T,
        plain.valid_D_T,
        lora=lora,
    )
    return out


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("name", list(CASES))
def test_grouped_logprobs_and_gradients_equal_the_unshared_pass(name: str, lora: bool) -> None:
    seed = sum(map(ord, name))
    seqs = CASES[name](np.random.default_rng(seed))
    # As planned, then with prefixes capped at 4 tokens (suffixes of up to 16 carry the rest)
    # and with 1-token suffixes where they fit (a sequence longer than 32 fits no group).
    _assert_routes_equal(_grouped_both(seqs, seed, None, lora=lora))
    _assert_routes_equal(_grouped_both(seqs, seed, (4, 16), lora=lora))
    _assert_routes_equal(_grouped_both(seqs, seed, (32, 1), lora=lora))


def _suffix_mask_without_the_prompt(prefix_length_D: jax.Array, s: int, u: int) -> jax.Array:
    """A plausible bug: suffix queries read only their own keys (each datum's prompt lost)."""
    mask = _original_suffix_mask(prefix_length_D, s, u)
    return mask.at[:, :, :s].set(False)


_original_suffix_mask = _grouped_forward.suffix_attention_mask


def test_a_suffix_that_cannot_see_its_prefix_fails_the_comparison(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seqs = CASES["nested"](np.random.default_rng(0))
    _assert_routes_equal(_grouped_both(seqs, 0, None, lora=False))
    monkeypatch.setattr(_grouped_forward, "suffix_attention_mask", _suffix_mask_without_the_prompt)
    fresh = jax.jit(
        lambda *args, **kwargs: _grouped_routes(*args, **kwargs), static_argnames="lora"
    )
    with pytest.raises(AssertionError, match="Not equal to tolerance"):
        _assert_routes_equal(_grouped_both(seqs, 0, None, lora=False, routes=fresh))


# -- the planner --


def _group_batch(
    rng: np.random.Generator, *, groups: int, samples: int, prompt: tuple[int, int], answer: Any
) -> tuple[np.ndarray, ...]:
    """`groups` prompts of `prompt` (low, high inclusive) tokens, each with `samples` answers of
    `answer` (low, high exclusive) tokens."""
    out = []
    for _ in range(groups):
        head = rng.integers(0, 1000, int(rng.integers(prompt[0], prompt[1] + 1)))
        out += [
            np.concatenate([head, rng.integers(0, 1000, int(rng.integers(*answer)))])
            for _ in range(samples)
        ]
    return tuple(out)


def _budget_rows(width: int) -> int:
    """The default budget's rows at `width` (16384 positions a call, a power of two)."""
    return 1 << max(0, (16_384 // width).bit_length() - 1)


@pytest.mark.parametrize(
    ("groups", "samples", "prompt", "answer"),
    [(8, 8, (90, 110), (2, 7)), (16, 8, (128, 128), (1, 33)), (64, 8, (128, 128), (1, 33))],
    ids=["8x8 demo", "16x8", "64x8"],
)
def test_the_planner_computes_few_padded_positions_for_ragged_answers(
    groups: int, samples: int, prompt: tuple[int, int], answer: tuple[int, int]
) -> None:
    """Every padded row position pays the whole model and unembedding: with answers of ragged
    lengths the planned positions stay within 1.3× the trie's distinct prefixes (rows filled
    to a width chosen first, not a width set by the fullest row; ~1.9× before)."""
    for seed in range(4):
        data = _group_batch(
            np.random.default_rng(seed),
            groups=groups,
            samples=samples,
            prompt=prompt,
            answer=answer,
        )
        plan = plan_prefix_chunks(data, rows_for_width=_budget_rows, max_fraction=1.0)
        assert plan is not None
        computed = len(plan.chunks) * plan.rows * plan.width
        assert computed <= 1.3 * prefix_tree_size(data), (seed, plan.rows, plan.width)
        assert sorted(d for chunk in plan.chunks for d in chunk.index_D) == list(range(len(data)))
        assert all(len(chunk.rows_R) <= plan.rows for chunk in plan.chunks)
        for chunk in plan.chunks:
            for row in chunk.rows_R:
                assert prefix_tree_size([data[d] for d in row]) <= plan.width


# -- through the training client --


def _datum(tokens: np.ndarray, rng: np.random.Generator) -> types.Datum:
    n = tokens.size - 1
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1].tolist()),
        loss_fn_inputs={
            "target_tokens": types.TensorData.from_numpy(tokens[1:].astype(np.int64)),
            "logprobs": types.TensorData.from_numpy(np.full(n, -4.0, np.float32)),
            "advantages": types.TensorData.from_numpy(rng.normal(size=n).astype(np.float32)),
        },
    )


def _grpo_data(rng: np.random.Generator, groups: int, samples: int, prompt: int) -> list[Any]:
    data = []
    for _ in range(groups):
        head = _tokens(rng, prompt)
        data += [
            _datum(np.concatenate([head, _tokens(rng, int(rng.integers(2, 8)))]), rng)
            for _ in range(samples)
        ]
    return data


ROUTES = {"trie": model_lib.PrefixRows, "grouped": model_lib.GroupedRows}


def _run_both(
    trainer: LocalTrainingClient, data: list[Any], *, backward: bool, route: str
) -> dict[str, tuple[Any, Any]]:
    """The call on the prefix-shared route `route` (`prefix_route`) and on the unshared one."""
    trainer.prefix_route = route  # type: ignore[assignment]
    out = {}
    for name, fraction in (("shared", 1.0), ("plain", 0.0)):
        trainer.prefix_sharing_fraction = fraction
        groups = trainer._packed_groups(check_data(data, "importance_sampling", trainer.config))
        if name == "shared":
            layout = ROUTES.get(route, tuple(ROUTES.values()))  # "auto": either
            assert all(isinstance(p.prefix, layout) for group in groups for p in group)
        else:
            assert groups[0][0].prefix is None
        call = trainer.forward_backward if backward else trainer.forward
        result = call(data, "importance_sampling").result()
        out[name] = (result, trainer._grads)
        trainer._grads = None
    return out


def _assert_client_routes_equal(out: dict[str, tuple[Any, Any]], *, backward: bool) -> None:
    (shared, g_shared), (plain, g_plain) = out["shared"], out["plain"]
    for a, b in zip(shared.loss_fn_outputs, plain.loss_fn_outputs, strict=True):
        np.testing.assert_allclose(a["logprobs"].to_numpy(), b["logprobs"].to_numpy(), atol=2e-5)
    assert shared.metrics.keys() == plain.metrics.keys()
    for key, value in plain.metrics.items():
        assert shared.metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-4), key
    if backward:
        _assert_trees_close(g_shared, g_plain)


@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize("backward", [True, False], ids=["forward_backward", "forward"])
def test_full_fine_tuning_client_routes_agree(tmp_path: Path, backward: bool, route: str) -> None:
    trainer = micro_service(tmp_path).create_lora_training_client(base_model=MICRO_NAME).result()
    data = _grpo_data(np.random.default_rng(1), groups=3, samples=4, prompt=12)
    out = _run_both(trainer, data, backward=backward, route=route)
    _assert_client_routes_equal(out, backward=backward)


@pytest.fixture(scope="module")
def _lora_trainer_of_module(tmp_path_factory: pytest.TempPathFactory) -> LocalTrainingClient:
    trainer = random_llama_trainer(
        tmp_path_factory.mktemp("states"), tmp_path_factory.mktemp("llama")
    )
    # One step so that B ≠ 0 and the gradients of every adapter matrix are non-zero.
    trainer.forward_backward(_grpo_data(np.random.default_rng(2), 2, 2, 6), "importance_sampling")
    trainer.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    return trainer


@pytest.fixture
def lora_trainer(_lora_trainer_of_module: LocalTrainingClient) -> Iterator[LocalTrainingClient]:
    """The module's LoRA trainer (built once), its route settings restored after each test."""
    yield from restoring_routes(_lora_trainer_of_module)


@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize("backward", [True, False], ids=["forward_backward", "forward"])
def test_lora_client_routes_agree(
    lora_trainer: LocalTrainingClient, backward: bool, route: str
) -> None:
    data = _grpo_data(np.random.default_rng(3), groups=2, samples=4, prompt=20)
    out = _run_both(lora_trainer, data, backward=backward, route=route)
    _assert_client_routes_equal(out, backward=backward)


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_several_chunks_agree_with_the_unshared_route(
    tmp_path: Path,
    lora_trainer: LocalTrainingClient,
    monkeypatch: pytest.MonkeyPatch,
    lora: bool,
) -> None:
    """Rows of at most 24 nodes and one row per chunk: the groups are cut over several chunks
    (stacked into one `lora_loss_and_grad` call with LoRA, one call each for full fine-tuning),
    duplicated datums included, and each datum's logprobs land at its own index."""
    if lora:
        trainer = lora_trainer
    else:
        service = micro_service(tmp_path)
        trainer = service.create_lora_training_client(base_model=MICRO_NAME).result()
    trainer.prefix_route = "trie"
    monkeypatch.setattr(
        _training, "plan_prefix_chunks", functools.partial(plan_prefix_chunks, row_width=24)
    )
    monkeypatch.setattr(trainer._runtime, "training_rows", lambda config, width: 1)
    data = _grpo_data(np.random.default_rng(5), groups=3, samples=4, prompt=14)
    data += [data[0], data[5]]
    trainer.prefix_sharing_fraction = 1.0
    groups = trainer._packed_groups(check_data(data, "importance_sampling", trainer.config))
    assert all(pack.prefix is not None for group in groups for pack in group)
    assert sum(map(len, groups)) >= 4
    assert max(map(len, groups)) > 1 if lora else len(groups) > 1
    for backward in (True, False):
        out = _run_both(trainer, data, backward=backward, route="trie")
        _assert_client_routes_equal(out, backward=backward)


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_several_grouped_chunks_agree_with_the_unshared_route(
    tmp_path: Path,
    lora_trainer: LocalTrainingClient,
    monkeypatch: pytest.MonkeyPatch,
    lora: bool,
) -> None:
    """At most 40 positions a chunk: groups of at most 3 datums (a prompt cut over several
    groups, computed in each), one group a chunk, over several chunks (stacked into one call
    with LoRA), duplicated datums included; each datum's logprobs land at its own index."""
    if lora:
        trainer = lora_trainer
    else:
        service = micro_service(tmp_path)
        trainer = service.create_lora_training_client(base_model=MICRO_NAME).result()
    monkeypatch.setattr(trainer._runtime, "training_positions", lambda config, keys: 40)
    data = _grpo_data(np.random.default_rng(5), groups=3, samples=4, prompt=14)
    data += [data[0], data[5]]
    trainer.prefix_route = "grouped"
    trainer.prefix_sharing_fraction = 1.0
    groups = trainer._packed_groups(check_data(data, "importance_sampling", trainer.config))
    assert sum(map(len, groups)) >= 4
    assert max(map(len, groups)) > 1 if lora else len(groups) > 1
    for backward in (True, False):
        out = _run_both(trainer, data, backward=backward, route="grouped")
        _assert_client_routes_equal(out, backward=backward)


def _two_patterns(rng: np.random.Generator) -> tuple[list[Any], list[Any]]:
    """Two sharing patterns with the same padded shapes (one row of 96, 8 datums of 32): a
    21-token prompt with 8 answers (85 nodes), and a 6-token system prefix, 2 prompts of 12 and
    4 answers each (94 nodes)."""
    head = _tokens(rng, 21)
    flat = [_datum(np.concatenate([head, _tokens(rng, 9)]), rng) for _ in range(8)]
    system = _tokens(rng, 6)
    nested = []
    for _ in range(2):
        prompt = np.concatenate([system, _tokens(rng, 12)])
        nested += [_datum(np.concatenate([prompt, _tokens(rng, 9)]), rng) for _ in range(4)]
    return flat, nested


def _shapes(trainer: LocalTrainingClient, data: list[Any]) -> tuple[Any, ...]:
    pack = trainer._packed_groups(check_data(data, "importance_sampling", trainer.config))[0][0]
    assert isinstance(pack.prefix, model_lib.PrefixRows)
    return pack.prefix.tokens_R_W.shape, pack.prefix.gather_D_T.shape


def test_a_new_sharing_pattern_of_the_same_shapes_does_not_recompile(
    tmp_path: Path, lora_trainer: LocalTrainingClient
) -> None:
    toy = micro_service(tmp_path).create_lora_training_client(base_model=MICRO_NAME).result()
    steps = (
        (lora_trainer, (lora_loss_and_grad, lora_logprobs, loss_and_logprob_grad)),
        (toy, (model_forward_vjp, model_backward, loss_and_logprob_grad)),
    )
    for trainer, jitted in steps:
        trainer.prefix_sharing_fraction = 0.8
        trainer.prefix_route = "trie"
        flat, nested = _two_patterns(np.random.default_rng(4))
        assert _shapes(trainer, flat) == _shapes(trainer, nested)
        trainer.forward_backward(flat, "importance_sampling").result()
        trainer.forward(flat, "importance_sampling").result()
        with count_compiles() as compiled:
            trainer.forward_backward(nested, "importance_sampling").result()
            trainer.forward(nested, "importance_sampling").result()
        traces = [compiled.traces_of(fn) for fn in jitted]
        assert traces == [0, 0, 0], (traces, dict(compiled.traces))
        trainer._grads = None


def _two_groupings(rng: np.random.Generator) -> tuple[list[Any], list[Any]]:
    """Two groupings with the same padded shapes (2 prefix rows, 8 datums): 2 prompts of 20
    tokens with 4 answers each, and 2 prompts sharing a 6-token system prefix with 3 and 5
    answers of ragged lengths (the longest as long as the first pattern's)."""
    even = []
    for _ in range(2):
        head = _tokens(rng, 20)
        even += [_datum(np.concatenate([head, _tokens(rng, 9)]), rng) for _ in range(4)]
    system = _tokens(rng, 6)
    ragged = []
    for samples in (3, 5):
        head = np.concatenate([system, _tokens(rng, 14)])
        ragged += [
            _datum(np.concatenate([head, _tokens(rng, 9 - k % 4)]), rng) for k in range(samples)
        ]
    return even, ragged


def _grouped_shapes(trainer: LocalTrainingClient, data: list[Any]) -> tuple[Any, ...]:
    pack = trainer._packed_groups(check_data(data, "importance_sampling", trainer.config))[0][0]
    assert isinstance(pack.prefix, model_lib.GroupedRows)
    return tuple(np.shape(array) for array in pack.prefix)


def test_a_new_grouping_of_the_same_shapes_does_not_recompile(
    tmp_path: Path, lora_trainer: LocalTrainingClient
) -> None:
    toy = micro_service(tmp_path).create_lora_training_client(base_model=MICRO_NAME).result()
    steps = (
        (lora_trainer, (lora_loss_and_grad, lora_logprobs, loss_and_logprob_grad)),
        (toy, (model_forward_vjp, model_backward, loss_and_logprob_grad)),
    )
    for trainer, jitted in steps:
        trainer.prefix_sharing_fraction = 0.8
        trainer.prefix_route = "grouped"
        even, ragged = _two_groupings(np.random.default_rng(4))
        assert _grouped_shapes(trainer, even) == _grouped_shapes(trainer, ragged)
        trainer.forward_backward(even, "importance_sampling").result()
        trainer.forward(even, "importance_sampling").result()
        with count_compiles() as compiled:
            trainer.forward_backward(ragged, "importance_sampling").result()
            trainer.forward(ragged, "importance_sampling").result()
        traces = [compiled.traces_of(fn) for fn in jitted]
        assert traces == [0, 0, 0], (traces, dict(compiled.traces))
        trainer._grads = None


def test_an_unknown_prefix_route_is_refused_in_one_line(
    lora_trainer: LocalTrainingClient,
) -> None:
    data = _grpo_data(np.random.default_rng(5), 2, 4, 12)
    lora_trainer.prefix_route = "tries"  # type: ignore[assignment]
    with pytest.raises(ValueError, match="prefix_route must be one of auto, trie, grouped"):
        lora_trainer.forward(data, "importance_sampling").result()


def _datums_the_cut_tries_cannot_share(
    trainer: LocalTrainingClient, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[types.Datum], CheckedData]:
    """Six 30-token datums sharing their first 27 tokens, with the trainer's tries cut into
    rows of at most 30 nodes (the longest datum): one datum a row, so the tries share nothing
    and their planner gives up."""
    monkeypatch.setattr(
        _training, "plan_prefix_chunks", functools.partial(plan_prefix_chunks, row_width=24)
    )
    rng = np.random.default_rng(6)
    head = _tokens(rng, 27)
    data = [_datum(np.concatenate([head, _tokens(rng, 4)]), rng) for _ in range(6)]
    checked = check_data(data, "importance_sampling", trainer.config)
    assert set(checked.length_D.tolist()) == {30}
    return data, checked


def test_auto_groups_the_datums_when_cutting_the_tries_into_rows_loses_the_sharing(
    lora_trainer: LocalTrainingClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`_datums_the_cut_tries_cannot_share`: `"auto"` groups them (the shared tokens
    computed once)."""
    data, checked = _datums_the_cut_tries_cannot_share(lora_trainer, monkeypatch)
    rows_for_width = functools.partial(lora_trainer._runtime.training_rows, lora_trainer.config)
    assert plan_prefix_chunks(checked.tokens_D, rows_for_width=rows_for_width, row_width=24) is None
    assert lora_trainer.prefix_route == "auto"
    groups = lora_trainer._packed_groups(checked)
    assert all(isinstance(p.prefix, model_lib.GroupedRows) for group in groups for p in group)
    assert lora_trainer._auto_route == "grouped"
    out = _run_both(lora_trainer, data, backward=True, route="auto")
    _assert_client_routes_equal(out, backward=True)


def test_auto_stays_unshared_when_the_groups_padded_rows_save_too_little(
    lora_trainer: LocalTrainingClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`_datums_the_cut_tries_cannot_share` with `prefix_sharing_fraction` between their
    trie's share of the tokens (it passes) and the grouped plan's padded positions' (they do
    not): `"auto"` goes unshared instead of taking the groups."""
    _, checked = _datums_the_cut_tries_cannot_share(lora_trainer, monkeypatch)
    total = int(checked.length_D.sum())
    grouped = plan_grouped_chunks(
        checked.tokens_D,
        positions_for_keys=functools.partial(
            lora_trainer._runtime.training_positions, lora_trainer.config
        ),
        key_weight=prefix_key_weight(lora_trainer.config),
    )
    assert grouped is not None
    tree = prefix_tree_size(checked.tokens_D)
    assert tree < grouped.positions
    lora_trainer.prefix_sharing_fraction = (tree + grouped.positions) / 2 / total
    lora_trainer._auto_route = "trie"
    assert lora_trainer._packed_groups(checked)[0][0].prefix is None
    assert lora_trainer._auto_route == "trie"  # unchanged: no layout was taken
    lora_trainer.prefix_sharing_fraction = (grouped.positions + 1) / total  # the groups pass
    assert isinstance(lora_trainer._packed_groups(checked)[0][0].prefix, model_lib.GroupedRows)


@pytest.mark.parametrize("last", ["trie", "grouped"])
def test_auto_keeps_its_layout_unless_the_other_is_clearly_cheaper(last: str) -> None:
    other = "grouped" if last == "trie" else "trie"
    margin = _training.GROUPED_COST_MARGIN

    def choose(last_cost: float, other_cost: float) -> str:
        costs = {last: last_cost, other: other_cost}
        return _training.auto_prefix_layout(
            last,  # type: ignore[arg-type]
            trie_cost=costs["trie"],
            grouped_cost=costs["grouped"],
        )

    assert choose(100.0, 99.0) == last  # close calls do not flip
    assert choose(100.0, 100.0 * margin) == other
    assert choose(100.0, 50.0) == other
