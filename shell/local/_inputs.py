"""Validating Tinker request inputs at the edge, and packing datums into bucketed arrays.

Conventions:
- Every check raises at submission, before any state changes, with a message that names the
  offending argument by its path (`Datum[3].loss_fn_inputs['weights']`, `sample.prompt`, ...):
  `TypeError` for a wrong type, `ValueError` for a bad value, `NotImplementedError` for what the
  local backend does not support (non-token chunks, `loss_fn="custom"`).
- Token ids are int64 on the host and must lie in `[0, vocab_size)`.
- `check_data` validates a `forward_backward` batch; `plan_chunks` splits it into jitted calls
  (longest datums first, each chunk padded to its own length bucket and a power-of-two row
  count within the memory budget); `group_chunks` gathers consecutive chunks of one shape for
  one call to loop over; `pack_rows` packs one chunk. `plan_prefix_chunks` and
  `pack_prefix_chunk` are the prefix-shared route: when the datums' token tries
  (`rlpure.packing.pack_prefix_tree`) hold at most `PREFIX_SHARING_FRACTION` of their tokens,
  each chunk is a few packed trie rows (`rlpure.model.PrefixRows`) plus the datums' usual
  `[D, T]` loss inputs; `plan_grouped_chunks` (`rlpure.packing`) and `pack_grouped_chunk`
  are its two-level form (`rlpure.model.GroupedRows`: a prefix row per group of datums, a
  suffix row per datum), which the training client weighs against the tries
  (`prefix_key_weight`; `shell.local._training`). Tinker's shifted alignment is
  kept: input position `i` predicts `loss_fn_inputs["target_tokens"][i]`, and every
  `loss_fn_inputs` tensor is 1-D with the length of its `model_input`, but `cross_entropy`'s
  `target_tokens` and `weights`, which may be `(N, K)`: `K` targets a position (top-K
  distillation; a call's datums may mix `K`s and `(N,)`, packed to `[D, T, K_max]`, the
  padding weighted 0). Sparse tensors are densified (0 where unlisted). Datums are right-padded
  to `[D, T]`: `D` a power of two (two sizes per doubling on the grouped route: 3, 6, 12, …),
  `T` a `length_bucket` (16, then two sizes per doubling), so
  that training compiles a handful of times; `valid_D_T` is 1.0 on real positions and 0.0 on
  padding and on the padded rows.
- Packing is host-side numpy (memory movement, not maths).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import msgspec
import numpy as np
from tinker import types

from rlpure import model as model_lib
from rlpure.buckets import bucket_size
from rlpure.losses import KNOWN_LOSS_INPUTS, LOSSES, LossSpec
from rlpure.packing import (
    GroupedChunk,
    GroupedPlan,
    group_prefix_rows,
    pack_prefix_tree,
    prefix_tree_size,
)

__all__ = [
    "PREFIX_ROW_WIDTH",
    "PREFIX_SHARING_FRACTION",
    "CheckedData",
    "PackedData",
    "PrefixChunk",
    "PrefixPlan",
    "TrainChunk",
    "call_groups",
    "check_data",
    "check_token_range",
    "dense_from_csr",
    "group_chunks",
    "length_bucket",
    "loss_config_key",
    "model_input_tokens",
    "pack_grouped_chunk",
    "pack_grouped_chunks",
    "pack_prefix_chunk",
    "pack_rows",
    "plan_chunks",
    "plan_prefix_chunks",
    "prefix_key_weight",
    "row_bucket",
    "to_float",
]


def row_bucket(n: int, *, minimum: int = 8) -> int:
    """The local backend's padded size for `n` rows or positions: the next power of two, at least
    `minimum` (`rlpure.buckets.bucket_size` with one step per octave).

    Examples:
        >>> [row_bucket(n) for n in (0, 1, 8, 9, 100)]
        [8, 8, 8, 16, 128]
    """
    return bucket_size(n, minimum=minimum, steps_per_octave=1)


def model_input_tokens(model_input: Any, where: str) -> np.ndarray:
    """The int64 `[N]` token ids of a token-only `tinker.ModelInput` (`where` names it)."""
    if not isinstance(model_input, types.ModelInput):
        raise TypeError(f"{where}: expected tinker.ModelInput, got {type(model_input).__name__}")
    for i, chunk in enumerate(model_input.chunks):
        if not isinstance(chunk, types.EncodedTextChunk):
            raise NotImplementedError(
                f"{where}.chunks[{i}]: {type(chunk).__name__} is not supported by the local "
                "backend (token chunks only)"
            )
    return np.asarray(model_input.to_ints(), np.int64).reshape(-1)


def check_token_range(tokens: np.ndarray, vocab_size: int, where: str) -> None:
    """Raises `ValueError` naming the first token of `tokens` (`[N]`, or `[N, K]`: then its
    position and column) outside `[0, vocab_size)`."""
    if tokens.size and (tokens.min() < 0 or tokens.max() >= vocab_size):
        flat = int(np.argmax(((tokens < 0) | (tokens >= vocab_size)).reshape(-1)))
        bad = np.unravel_index(flat, tokens.shape)
        at = f"position {bad[0]}" + (f", column {bad[1]}" if tokens.ndim == 2 else "")
        raise ValueError(f"{where}: token {int(tokens[bad])} at {at} is outside [0, {vocab_size})")


def dense_from_csr(
    values: np.ndarray,
    crow: np.ndarray,
    col: np.ndarray,
    shape: Sequence[int],
    *,
    fill: int | float,
    where: str,
) -> np.ndarray:
    """The 2-D sparse CSR tensor `(values, crow, col)` of `shape` as a dense array of
    `values`' dtype, `fill` where nothing is listed (Tinker's `TensorData` sparse layout).

    Raises:
        ValueError: `shape` is not 2-D, or the indices do not describe it (a row's columns
            not increasing included; naming `where`).

    Examples:
        >>> dense_from_csr(np.array([5, 7]), np.array([0, 1, 1, 2]), np.array([1, 0]), [3, 2],
        ...                fill=-1, where="t").tolist()
        [[-1, 5], [-1, -1], [7, -1]]
    """
    if len(shape) != 2:
        raise ValueError(f"{where}: a sparse CSR tensor needs a 2-D shape, got {list(shape)}")
    rows, cols = shape
    if (
        crow.size != rows + 1
        or col.size != values.size
        or (crow.size and (crow[0] != 0 or crow[-1] != values.size or np.any(np.diff(crow) < 0)))
        or (col.size and (col.min() < 0 or col.max() >= cols))
    ):
        raise ValueError(f"{where}: inconsistent sparse CSR indices for shape {list(shape)}")
    row_of = np.repeat(np.arange(rows), np.diff(crow))
    if np.any((np.diff(col) <= 0) & (np.diff(row_of) == 0)):  # as torch's invariants check
        raise ValueError(f"{where}: sparse CSR column indices must increase within each row")
    dense = np.full((rows, cols), fill, dtype=values.dtype)
    dense[row_of, col] = values
    return dense


def to_float(value: Any, where: str) -> float:
    """`value` as a finite float; bools, non-numbers and non-finite values are refused."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{where}: expected a number, got {type(value).__name__}")
    out = float(value)
    if not math.isfinite(out):
        raise ValueError(f"{where}: expected a finite number, got {out}")
    return out


class CheckedData(msgspec.Struct, frozen=True, kw_only=True, eq=False):
    """Validated `tinker.Datum`s, still ragged (host-side numpy).

    `tokens_D[d]` is datum `d`'s int64 `[N_d]` model input and `inputs_D[d]` its
    `loss_fn_inputs` arrays, each `[N_d]` (`target_tokens` int64, the others float) but
    `cross_entropy`'s top-K distillation inputs, which may be `[N_d, K_d]`; every datum has the
    same `keys`. `top_k` is the largest `K_d` (0: every datum `[N_d]`): the `top_k_keys`
    pack to `[D, T, top_k]`, a datum's `K_d` columns first (an `[N_d]` one in column 0), the
    rest zeros (weight 0: no loss, no gradient).
    """

    tokens_D: tuple[np.ndarray, ...]
    inputs_D: tuple[dict[str, np.ndarray], ...]
    keys: tuple[str, ...]
    top_k: int = 0
    top_k_keys: tuple[str, ...] = ()

    def unpadded(self, d: int, values_T: np.ndarray) -> np.ndarray:
        """Datum `d`'s row of a packed `[T]` or `[T, top_k]` output, cut to its own `[N_d]`
        or `[N_d, K_d]` (the shape of its `target_tokens`)."""
        shape = self.inputs_D[d]["target_tokens"].shape if self.top_k else self.tokens_D[d].shape
        out = values_T[: shape[0]]
        if self.top_k:
            out = out[:, : shape[1]] if len(shape) == 2 else out[:, 0]
        return out

    @property
    def length_D(self) -> np.ndarray:
        """int64 `[D]`: each datum's length `N_d`."""
        return np.array([t.size for t in self.tokens_D], np.int64)


class PackedData(msgspec.Struct, frozen=True, kw_only=True, eq=False):
    """Some `tinker.Datum`s packed to bucketed `[D, T]` arrays (host-side numpy).

    Row `r < len(length_D)` holds datum `index_D[r]` of the call; the rows after are padding
    (`valid_D_T` 0). `prefix` is set on the prefix-shared route: the datums' tokens packed as
    trie rows, or grouped by shared prefixes, the model input in place of `input_D_T`.
    """

    input_D_T: np.ndarray
    inputs: dict[str, np.ndarray]
    valid_D_T: np.ndarray
    length_D: np.ndarray
    index_D: np.ndarray
    prefix: model_lib.PrefixRows | model_lib.GroupedRows | None = None

    @property
    def model_input(self) -> np.ndarray | model_lib.PrefixRows | model_lib.GroupedRows:
        """What the model reads: `prefix` when set, else `input_D_T`."""
        return self.input_D_T if self.prefix is None else self.prefix


class TrainChunk(msgspec.Struct, frozen=True, kw_only=True):
    """One jitted training call of a `forward_backward`: which datums, padded to what."""

    index_D: tuple[int, ...]
    """The datums (indices into the call's data) this chunk holds, longest first."""
    rows: int
    """Padded row count (a power of two, at least `len(index_D)`)."""
    width: int
    """Padded length (`length_bucket` of the chunk's longest datum)."""


def length_bucket(n: int) -> int:
    """The padded length of a datum or prompt of `n` tokens: 16, then two sizes per doubling
    (…, 512, 768, 1024, 1536, 2048), so that padding costs at most 1.5× in length (2.25× in
    attention) rather than the 2× (4×) of powers of two, for at most twice the buckets.

    Examples:
        >>> [length_bucket(n) for n in (1, 16, 17, 100, 970, 1025)]
        [16, 16, 24, 128, 1024, 1536]
    """
    return bucket_size(n, minimum=16, steps_per_octave=2)


def check_data(
    data: Sequence[types.Datum], loss_fn: str, config: model_lib.ModelConfig
) -> CheckedData:
    """Validates `data` for `loss_fn` on a model of shape `config` (see the module docstring).

    Raises:
        TypeError, ValueError, NotImplementedError: naming the datum and key.
    """
    if isinstance(data, types.Datum) or not isinstance(data, Sequence):
        raise TypeError("forward_backward: data must be a list of tinker.Datum")
    if not data:
        raise ValueError("forward_backward: no data provided")
    if loss_fn not in LOSSES:
        if loss_fn == "custom":
            raise NotImplementedError(
                "loss_fn='custom' runs a loss uploaded to a Tinker server; the local backend "
                "runs custom losses client-side: pass the loss to forward_backward_custom"
            )
        raise ValueError(f"unknown loss_fn {loss_fn!r}; known losses: {sorted(LOSSES)}")
    spec = LOSSES[loss_fn]
    tokens_D: list[np.ndarray] = []
    inputs_D: list[dict[str, np.ndarray]] = []
    keys: frozenset[str] | None = None
    top_k = 0
    for d, datum in enumerate(data):
        where = f"Datum[{d}]"
        if not isinstance(datum, types.Datum):
            raise TypeError(f"{where}: expected tinker.Datum, got {type(datum).__name__}")
        tokens = model_input_tokens(datum.model_input, f"{where}.model_input")
        if tokens.size == 0:
            raise ValueError(f"{where}.model_input: empty")
        if tokens.size > config.max_seq_len:
            raise ValueError(
                f"{where}.model_input: length {tokens.size} exceeds the model's max_seq_len "
                f"{config.max_seq_len}"
            )
        check_token_range(tokens, config.vocab_size, f"{where}.model_input")
        arrays = {
            key: _loss_input(key, tensor, tokens, spec, config, f"{where}.loss_fn_inputs[{key!r}]")
            for key, tensor in datum.loss_fn_inputs.items()
        }
        top_k = max(top_k, _targets_per_position(arrays, spec, where))
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
    missing = [k for k in spec.required_inputs if k not in keys]
    if missing:
        raise ValueError(f"{loss_fn}: every datum needs loss_fn_inputs {missing}")
    return CheckedData(
        tokens_D=tuple(tokens_D),
        inputs_D=tuple(inputs_D),
        keys=tuple(sorted(keys)),
        top_k=top_k,
        top_k_keys=tuple(key for key in spec.top_k_inputs if key in keys) if top_k else (),
    )


def _loss_input(
    key: str,
    tensor: types.TensorData,
    tokens: np.ndarray,
    spec: LossSpec,
    config: model_lib.ModelConfig,
    where: str,
) -> np.ndarray:
    """Datum input `key` as a checked numpy array (`where` names it): a known Tinker input,
    dense or sparse CSR (densified, 0 where unlisted), of the model input's shape `(N,)` or,
    for an input of `spec.top_k_inputs`, `(N, K)`; target ids in the vocabulary, other
    values finite."""
    if key not in KNOWN_LOSS_INPUTS:
        hint = (
            " (the cookbook's 'mask' is not a Tinker input; strip it before "
            "forward_backward as tinker_cookbook.rl.train._remove_mask does)"
            if key == "mask"
            else ""
        )
        raise ValueError(
            f"{where.rsplit('[', 1)[0]}: unknown key {key!r}; Tinker inputs are "
            f"{sorted(KNOWN_LOSS_INPUTS)}{hint}"
        )
    if tensor.sparse_crow_indices is not None:
        if tensor.shape is None or tensor.sparse_col_indices is None:
            raise ValueError(f"{where}: a sparse TensorData needs its shape and col indices")
        arr = dense_from_csr(
            np.asarray(tensor.data, np.dtype(tensor.dtype)),
            np.asarray(tensor.sparse_crow_indices, np.int64),
            np.asarray(tensor.sparse_col_indices, np.int64),
            tensor.shape,
            fill=0,
            where=where,
        )
    else:
        arr = np.asarray(tensor.to_numpy())
    top_k = key in spec.top_k_inputs and arr.ndim == 2 and arr.shape[:1] == tokens.shape
    if arr.shape != tokens.shape and not (top_k and arr.shape[1] >= 1):
        distill = (
            f" ((N, K) inputs are {', '.join(LOSSES['cross_entropy'].top_k_inputs)} of "
            "cross_entropy only: top-K distillation)"
            if arr.ndim == 2
            and not spec.top_k_inputs
            and key in LOSSES["cross_entropy"].top_k_inputs
            else ""
        )
        raise ValueError(f"{where}: shape {arr.shape} != model_input shape {tokens.shape}{distill}")
    if key == "target_tokens":
        if arr.dtype.kind not in "iu":
            raise TypeError(f"{where}: expected integer token ids, got dtype {arr.dtype}")
        check_token_range(arr, config.vocab_size, where)
    elif not np.all(np.isfinite(arr)):
        raise ValueError(f"{where}: non-finite values")
    return arr


def _targets_per_position(arrays: dict[str, np.ndarray], spec: LossSpec, where: str) -> int:
    """K of a datum's `(N, K)` top-K inputs (every one of `spec.top_k_inputs` it has, alike),
    or 0 when they are `(N,)`."""
    shapes = {key: arrays[key].shape for key in spec.top_k_inputs if key in arrays}
    if len(set(shapes.values())) > 1:
        described = ", ".join(f"{key} {shape}" for key, shape in shapes.items())
        raise ValueError(f"{where}.loss_fn_inputs: shapes differ: {described}")
    shape = next(iter(shapes.values()), (0,))
    return shape[1] if len(shape) == 2 else 0


def plan_chunks(length_D: np.ndarray, *, rows_for_width: Callable[[int], int]) -> list[TrainChunk]:
    """Splits datums of `length_D` into jitted training calls, longest datums first.

    Datums are sorted by length (descending, stable); each chunk takes the next
    `rows_for_width(width)` of them (a power of two: the memory budget at that width), where
    `width` is the `length_bucket` of its longest datum, and pads its rows to a power of two
    (at least 8 when the budget allows). So a batch of mixed lengths pads each datum only to
    its chunk's width (short datums never pay a long one's quadratic attention), and padding
    rows exist only in the last, partial chunk of each width.

    Examples:
        >>> chunks = plan_chunks(np.array([10, 900, 20, 1000]), rows_for_width=lambda w: 2)
        >>> [(c.index_D, c.rows, c.width) for c in chunks]
        [((3, 1), 2, 1024), ((2, 0), 2, 24)]
    """
    order = np.argsort(-np.asarray(length_D), kind="stable")
    chunks = []
    start = 0
    while start < order.size:
        width = length_bucket(int(length_D[order[start]]))
        budget = rows_for_width(width)
        index = tuple(int(d) for d in order[start : start + budget])
        rows = min(budget, row_bucket(len(index)))
        chunks.append(TrainChunk(index_D=index, rows=rows, width=width))
        start += len(index)
    return chunks


def group_chunks(chunks: Sequence[TrainChunk], *, limit: int) -> list[tuple[TrainChunk, ...]]:
    """`chunks` in order, cut into runs of one shape `(rows, width)` of at most `limit` chunks
    each: what one jitted call can loop over.

    Examples:
        >>> chunks = plan_chunks(np.array([900, 1000, 950, 20]), rows_for_width=lambda w: 1)
        >>> [[(c.rows, c.width) for c in group] for group in group_chunks(chunks, limit=2)]
        [[(1, 1024), (1, 1024)], [(1, 1024)], [(1, 24)]]
    """
    if limit < 1:
        raise ValueError(f"group_chunks: limit must be at least 1, got {limit}")
    groups: list[tuple[TrainChunk, ...]] = []
    for chunk in chunks:
        last = groups[-1] if groups else ()
        if (
            last
            and len(last) < limit
            and (last[0].rows, last[0].width) == (chunk.rows, chunk.width)
        ):
            groups[-1] = (*last, chunk)
        else:
            groups.append((chunk,))
    return groups


def pack_rows(checked: CheckedData, chunk: TrainChunk) -> PackedData:
    """Packs the datums of `chunk` right-padded into `[chunk.rows, chunk.width]` arrays."""
    n_d, n_t = chunk.rows, chunk.width
    input_D_T = np.zeros((n_d, n_t), np.int32)
    valid_D_T = np.zeros((n_d, n_t), np.float32)
    inputs = {
        key: np.zeros(
            (n_d, n_t, checked.top_k) if key in checked.top_k_keys else (n_d, n_t),
            np.int32 if key == "target_tokens" else np.float32,
        )
        for key in checked.keys
    }
    length_D = np.zeros(len(chunk.index_D), np.int64)
    for row, d in enumerate(chunk.index_D):
        tokens = checked.tokens_D[d]
        n = tokens.size
        length_D[row] = n
        input_D_T[row, :n] = tokens
        valid_D_T[row, :n] = 1.0
        for key, arr in checked.inputs_D[d].items():
            if key in checked.top_k_keys:
                inputs[key][row, :n, : arr.shape[1] if arr.ndim == 2 else 1] = arr.reshape(n, -1)
            else:
                inputs[key][row, :n] = arr
    return PackedData(
        input_D_T=input_D_T,
        inputs=inputs,
        valid_D_T=valid_D_T,
        length_D=length_D,
        index_D=np.asarray(chunk.index_D, np.int64),
    )


def call_groups(
    checked: CheckedData,
    packs: list[PackedData] | None,
    *,
    rows_for_width: Callable[[int], int],
    per_call: int,
) -> list[list[PackedData]]:
    """`checked`'s chunks in the groups one jitted call runs, at most `per_call` each: `packs`
    (a prefix-shared route's chunks, all of one shape) in order, or with None `plan_chunks`'
    rows of the memory budget, grouped by shape (`group_chunks`)."""
    if packs is not None:
        return [packs[start : start + per_call] for start in range(0, len(packs), per_call)]
    chunks = plan_chunks(checked.length_D, rows_for_width=rows_for_width)
    return [
        [pack_rows(checked, chunk) for chunk in group]
        for group in group_chunks(chunks, limit=per_call)
    ]


# The prefix-shared route runs when the datums' tries hold at most this fraction of their
# tokens (below, the longer rows' attention and the gather buy too little).
PREFIX_SHARING_FRACTION = 0.8
# Most trie nodes a packed row takes (or the longest datum's length, if longer): two GRPO groups
# of a 128-token prompt and 8 completions of 1–32 tokens (~270 nodes each) fill one row, where
# 512 left a third of most rows padding; attention costs each query the whole row, so rows
# stay short.
PREFIX_ROW_WIDTH = 768


class PrefixChunk(msgspec.Struct, frozen=True, kw_only=True):
    """One jitted training call on the prefix-shared route: packed trie rows of datums."""

    rows_R: tuple[tuple[int, ...], ...]
    """Each packed row's datums (indices into the call's data)."""

    @property
    def index_D(self) -> tuple[int, ...]:
        """The chunk's datums, row after row."""
        return tuple(d for row in self.rows_R for d in row)


class PrefixPlan(msgspec.Struct, frozen=True, kw_only=True):
    """A call's prefix-shared chunks, all padded to one shape (so one call loops over them)."""

    chunks: tuple[PrefixChunk, ...]
    rows: int
    """Packed rows per chunk (two sizes per doubling: 1, 2, 3, 4, 6, 8, 12, …)."""
    width: int
    """Row width (a `length_bucket` size, at least the longest datum's)."""
    datums: int
    """Datum rows per chunk (a power of two, at least 8)."""
    length: int
    """Padded datum length (`length_bucket` of the longest datum)."""
    nodes: int
    """Trie nodes over all rows: the positions the model computes."""


def _row_width_bucket(n: int) -> int:
    """A trie row width for `n` nodes: 16, then four sizes per doubling (…, 128, 160, 192, 224,
    256, 320, …), as rows fill to their width (datums pad to `length_bucket`'s coarser sizes)."""
    return bucket_size(n, minimum=16, steps_per_octave=4)


class _TrieLayout(NamedTuple):
    """Trie rows of one width spread over chunks (`_trie_layout`)."""

    width: int
    rows: list[tuple[int, ...]]  # each row's datum indices
    rows_per_chunk: int  # padded
    positions: int  # computed, padding included


def _trie_layout(
    tokens_D: tuple[np.ndarray, ...], width: int, cap: int, rows_for_width: Callable[[int], int]
) -> _TrieLayout:
    """The datums' trie cut into rows of at most `min(width, cap)` nodes, spread evenly over
    chunks of at most `rows_for_width(width)` rows, their count rounded up two steps per
    doubling (1, 2, 3, 4, 6, 8, 12, …)."""
    rows = group_prefix_rows(tokens_D, max_width=min(width, cap))
    per_chunk = max(1, rows_for_width(width))
    chunks = -(-len(rows) // per_chunk)
    per = min(per_chunk, bucket_size(-(-len(rows) // chunks), steps_per_octave=2))
    return _TrieLayout(width=width, rows=rows, rows_per_chunk=per, positions=chunks * per * width)


def plan_prefix_chunks(
    tokens_D: tuple[np.ndarray, ...],
    *,
    rows_for_width: Callable[[int], int],
    max_fraction: float = PREFIX_SHARING_FRACTION,
    row_width: int = PREFIX_ROW_WIDTH,
) -> PrefixPlan | None:
    """Plans the prefix-shared route for datums `tokens_D`, or None when it saves too little.

    Each row width `width` from `length_bucket` of the longest datum up to that of
    `max(row_width, longest datum)` is tried: the datums' trie is cut into rows of at most
    `min(width, max(row_width, longest))` nodes (`rlpure.packing.group_prefix_rows`: subtrees,
    first-fit-decreasing), the rows spread over chunks of at most `rows_for_width(width)` rows
    (the memory budget), their count rounded two steps per doubling. The width computing the
    fewest padded positions (each pays the unembedding) wins, the narrower on a tie. None when
    the rows hold more than `max_fraction` of the datums' tokens.

    Examples:
        >>> prompt = np.arange(100)
        >>> data = tuple(np.concatenate([prompt, [200 + g] * 10]) for g in range(8))
        >>> plan = plan_prefix_chunks(data, rows_for_width=lambda w: 4)
        >>> plan.nodes, plan.rows, plan.width, plan.datums, plan.length
        (180, 1, 192, 8, 128)
        >>> plan_prefix_chunks(data[:1], rows_for_width=lambda w: 4) is None
        True
    """
    total = sum(t.size for t in tokens_D)
    longest = max(t.size for t in tokens_D)
    if prefix_tree_size(tokens_D) > max_fraction * total:
        return None
    cap = max(row_width, longest)
    best = layout = _trie_layout(tokens_D, _row_width_bucket(longest), cap, rows_for_width)
    while layout.width < _row_width_bucket(cap):
        layout = _trie_layout(tokens_D, _row_width_bucket(layout.width + 1), cap, rows_for_width)
        best = layout if layout.positions < best.positions else best  # the narrower on a tie
    width, rows, per = best.width, best.rows, best.rows_per_chunk
    sizes = [prefix_tree_size([tokens_D[d] for d in row]) for row in rows]
    if sum(sizes) > max_fraction * total:
        return None
    chunks = tuple(
        PrefixChunk(rows_R=tuple(rows[start : start + per])) for start in range(0, len(rows), per)
    )
    return PrefixPlan(
        chunks=chunks,
        rows=per,
        width=width,
        datums=row_bucket(max(len(c.index_D) for c in chunks)),
        length=length_bucket(longest),
        nodes=sum(sizes),
    )


def pack_prefix_chunk(checked: CheckedData, plan: PrefixPlan, chunk: PrefixChunk) -> PackedData:
    """Packs `chunk`'s datums as trie rows `[plan.rows, plan.width]` (`PackedData.prefix`) and
    their loss inputs right-padded to `[plan.datums, plan.length]`, as `pack_rows` does.

    `prefix.gather_D_T[d, t]` is the flat index `r · width + i` of datum row `d`'s node at
    position `t` (0 on padding); padded row slots hold token 0 at position 0 reading only
    themselves (`end = i + 1`).
    """
    n_r, n_w = plan.rows, plan.width
    tokens_R_W = np.zeros((n_r, n_w), np.int32)
    positions_R_W = np.zeros((n_r, n_w), np.int32)
    end_R_W = np.broadcast_to(np.arange(1, n_w + 1, dtype=np.int32), (n_r, n_w)).copy()
    gather_D_T = np.zeros((plan.datums, plan.length), np.int32)
    packed = pack_rows(
        checked, TrainChunk(index_D=chunk.index_D, rows=plan.datums, width=plan.length)
    )
    row_d = 0
    for r, datums in enumerate(chunk.rows_R):
        tree = pack_prefix_tree([checked.tokens_D[d] for d in datums])
        n = tree.tokens_N.size
        tokens_R_W[r, :n] = tree.tokens_N
        positions_R_W[r, :n] = tree.position_N
        end_R_W[r, :n] = tree.end_N
        for columns in tree.column_D:
            gather_D_T[row_d, : columns.size] = r * n_w + columns
            row_d += 1
    prefix = model_lib.PrefixRows(
        tokens_R_W=tokens_R_W, positions_R_W=positions_R_W, end_R_W=end_R_W, gather_D_T=gather_D_T
    )
    return msgspec.structs.replace(packed, prefix=prefix)


def prefix_key_weight(config: model_lib.ModelConfig) -> float:
    """The cost of one attention query-key pair relative to one computed position's (its
    layers' matmuls and the unembedding), in multiply-adds, the pair counted twice for the
    masked softmax's elementwise work: what `plan_grouped_chunks` and the route choice weigh
    `key_reads` by."""
    e, c, f = config.d_model, config.head_dim, config.d_ff
    h, n = config.n_heads, config.kv_heads
    mlp = (2 if config.family == "rlpure" else 3) * e * f
    per_layer = e * (h + 2 * n) * c + h * c * e + mlp
    position = config.n_layers * per_layer + e * config.vocab_size
    return 2 * config.n_layers * 2 * h * c / position


def pack_grouped_chunk(
    checked: CheckedData, plan: GroupedPlan, chunk: GroupedChunk, *, length: int
) -> PackedData:
    """Packs `chunk`'s groups as prefix rows `[plan.prefix_rows, plan.prefix_width]` and
    suffix rows `[plan.datums, plan.suffix_width]` (`PackedData.prefix`, a
    `rlpure.model.GroupedRows`), and their loss inputs right-padded to `[plan.datums,
    length]` as `pack_rows` does. Padded prefix rows hold token 0; padded suffix rows read
    prefix row 0 with prefix length 0."""
    n_p, n_s, n_d, n_u = plan.prefix_rows, plan.prefix_width, plan.datums, plan.suffix_width
    prefix_tokens_P_S = np.zeros((n_p, n_s), np.int32)
    suffix_tokens_D_U = np.zeros((n_d, n_u), np.int32)
    suffix_positions_D_U = np.zeros((n_d, n_u), np.int32)
    group_D = np.zeros(n_d, np.int32)
    prefix_length_D = np.zeros(n_d, np.int32)
    gather_D_T = np.zeros((n_d, length), np.int32)
    packed = pack_rows(checked, TrainChunk(index_D=chunk.index_D, rows=n_d, width=length))
    row_d = 0
    for g, group in enumerate(chunk.groups):
        shared = group.prefix_length
        first = checked.tokens_D[group.datums[0]]
        prefix_tokens_P_S[g, :shared] = first[:shared]
        for d in group.datums:
            tokens = checked.tokens_D[d]
            rest = tokens.size - shared
            suffix_tokens_D_U[row_d, :rest] = tokens[shared:]
            suffix_positions_D_U[row_d] = shared + np.arange(n_u)
            group_D[row_d], prefix_length_D[row_d] = g, shared
            gather_D_T[row_d, :shared] = g * n_s + np.arange(shared)
            gather_D_T[row_d, shared : tokens.size] = n_p * n_s + row_d * n_u + np.arange(rest)
            row_d += 1
    prefix = model_lib.GroupedRows(
        prefix_tokens_P_S=prefix_tokens_P_S,
        suffix_tokens_D_U=suffix_tokens_D_U,
        suffix_positions_D_U=suffix_positions_D_U,
        group_D=group_D,
        prefix_length_D=prefix_length_D,
        gather_D_T=gather_D_T,
    )
    return msgspec.structs.replace(packed, prefix=prefix)


def loss_config_key(loss_fn_config: Mapping[str, Any] | None) -> tuple[tuple[str, float], ...]:
    """`loss_fn_config` as sorted `(name, value)` pairs: hashable, so static under `jit`."""
    if loss_fn_config is None:
        return ()
    if not isinstance(loss_fn_config, Mapping):
        raise TypeError("loss_fn_config: expected a mapping of name to number")
    return tuple(
        sorted((str(k), to_float(v, f"loss_fn_config[{k!r}]")) for k, v in loss_fn_config.items())
    )


def pack_grouped_chunks(checked: CheckedData, plan: GroupedPlan) -> list[PackedData]:
    """Every chunk of `plan` packed (`pack_grouped_chunk`), the loss inputs right-padded to the
    `length_bucket` of the longest datum."""
    length = length_bucket(int(checked.length_D.max()))
    return [pack_grouped_chunk(checked, plan, chunk, length=length) for chunk in plan.chunks]
