"""Field checks shared by the records: each returns a field's stored form or raises.

Conventions:
- Errors name the record and the field: `TokensWithLogprobs.logprobs: length 3 != tokens length 4`.
- Token sequences become read-only 1-D copies (`int32` ids as `TokenIds`, `float32` values),
  refusing lossy conversions; sequence fields become tuples.
- Metric and log values may be bools, stored as `1.0` / `0.0`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np

Metrics = dict[str, float | int]
"""Numbers averaged into the training logs, by name (bools are stored as `1.0` / `0.0`)."""
Logs = dict[str, str | int | float]
"""Free-form diagnostics by name, not aggregated."""
StopCondition = tuple[str | int, ...]
"""Stop strings or stop token ids (all of one kind), as the sampler's `stop` parameter."""


def as_stop_condition(stop: str | Sequence[str | int]) -> StopCondition:
    """`stop` as a `StopCondition`: a single string is one stop string, as
    `tinker.SamplingParams.stop` takes it (not a sequence of one-character stops).

    Examples:
        >>> as_stop_condition("</answer>"), as_stop_condition(["a", "b"]), as_stop_condition([7])
        (('</answer>',), ('a', 'b'), (7,))
    """
    return (stop,) if isinstance(stop, str) else tuple(stop)


_INT32_MAX = np.iinfo(np.int32).max


class TokenIds(np.ndarray):
    """A read-only int32 token-id array that is truthy when non-empty, as a `list[int]` is.

    Token fields of the records (`ModelInput.tokens`, `TokensWithLogprobs.tokens`) are this
    view of a plain numpy array. The one thing it changes is `bool(tokens)`: numpy refuses it
    for more than one element ("truth value of an array is ambiguous"), while cookbook code
    written for `list[int]` tests it (`if response and response[-1] == eos: ...` in the
    cookbook's renderers, handed `transition.ac.tokens`). Everything else — indexing, slicing
    (which keeps the view), `len`, `tolist`, element-wise `==` — is numpy's.
    """

    def __bool__(self) -> bool:
        if self.ndim == 1:
            return len(self) > 0
        return bool(self.item())  # a 0-d array: its one value


# Token sequences are numpy arrays, not Python lists: the sampler already returns arrays, and
# packing arrays into a padded batch is a handful of `memcpy`s where a list of ints costs one
# Python object per token (`benchmarks/bench_assembly.py` measures the difference).
def _frozen_array(values: Any, dtype: type, record: str, field: str) -> np.ndarray:
    """Copies `values` into a read-only 1-D array of `dtype`, refusing lossy conversions."""
    if isinstance(values, np.ndarray) and values.dtype == dtype and values.ndim == 1:
        out = values.copy()
    else:
        try:
            arr = np.asarray(values)
        except (TypeError, ValueError) as err:
            raise TypeError(f"{record}.{field}: cannot read as an array: {err}") from None
        if arr.ndim != 1:
            raise ValueError(f"{record}.{field}: expected a 1-D sequence, got shape {arr.shape}")
        if arr.size == 0:
            arr = arr.astype(dtype)
        if dtype is np.int32:
            if arr.dtype.kind == "b" or arr.dtype.kind not in "iu":
                raise TypeError(
                    f"{record}.{field}: token ids must be integers, got dtype {arr.dtype}"
                )
            if arr.size and int(arr.max()) > _INT32_MAX:
                raise ValueError(f"{record}.{field}: token id {int(arr.max())} exceeds int32")
            if arr.size and int(arr.min()) < 0:  # checked before the cast, which could wrap
                bad = int(np.argmax(arr < 0))
                raise ValueError(
                    f"{record}.{field}: negative token id {int(arr[bad])} at position {bad}"
                )
        elif arr.dtype.kind not in "fiu" or arr.dtype.kind == "b":
            raise TypeError(f"{record}.{field}: expected real numbers, got dtype {arr.dtype}")
        out = arr.astype(dtype, copy=True)
    if dtype is np.int32 and out.size and int(out.min()) < 0:
        bad = int(np.argmax(out < 0))
        raise ValueError(f"{record}.{field}: negative token id {int(out[bad])} at position {bad}")
    if dtype is np.float32 and not np.all(np.isfinite(out)):
        bad = int(np.argmax(~np.isfinite(out)))
        raise ValueError(f"{record}.{field}: non-finite value {out[bad]} at position {bad}")
    if dtype is np.float32 and field == "logprobs" and out.size and float(out.max()) > 0.0:
        bad = int(np.argmax(out > 0))
        raise ValueError(
            f"{record}.{field}: log-probability {out[bad]} > 0 at position {bad} (must be <= 0)"
        )
    if dtype is np.int32:
        out = out.view(TokenIds)
    out.flags.writeable = False
    return out


def _is_token_id(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and bool(value >= 0)


def _finite_float(value: Any, record: str, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{record}.{field}: expected a real number, got {type(value).__name__}")
    out = float(value)
    if not math.isfinite(out):
        raise ValueError(f"{record}.{field}: non-finite value {out}")
    return out


def _tuple_of(values: Any, kind: type, record: str, field: str) -> tuple[Any, ...]:
    """`values` as a tuple, each item checked to be a `kind` (which may be abstract: `Mapping`)."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"{record}.{field}: expected a sequence of {kind.__name__}")
    out = tuple(values)
    for i, item in enumerate(out):
        if not isinstance(item, kind):
            raise TypeError(
                f"{record}.{field}[{i}]: expected {kind.__name__}, got {type(item).__name__}"
            )
    return out


def _plain_mapping(
    values: Any, record: str, field: str, kinds: tuple[type, ...], *, finite: bool
) -> dict[str, Any]:
    """A copy of a str-keyed mapping whose values are `kinds` (numpy scalars unwrapped).

    Bools (Python or numpy) become `1.0` / `0.0`, as the cookbook's averaging reads them.

    Its value type is whatever `kinds` admits (a runtime tuple), hence `Any`; the two callers
    below give the precise types.
    """
    if not isinstance(values, Mapping):
        raise TypeError(f"{record}.{field}: expected a mapping, got {type(values).__name__}")
    out = {}
    for key, value in values.items():
        if not isinstance(key, str):
            raise TypeError(f"{record}.{field}: key {key!r} is not a string")
        if isinstance(value, (bool, np.bool_)):
            value = 1.0 if value else 0.0  # the cookbook averages metrics as numbers
        elif isinstance(value, (np.integer, np.floating)):
            value = value.item()
        if not isinstance(value, kinds):
            names = [k.__name__ for k in kinds]
            expected = ", ".join(names[:-1]) + " or " + names[-1]
            raise TypeError(
                f"{record}.{field}[{key!r}]: expected {expected}, got {type(value).__name__}"
            )
        if finite and not math.isfinite(cast(float, value)):
            raise ValueError(f"{record}.{field}[{key!r}]: non-finite value {value}")
        out[key] = value
    return out


def _plain_metrics(values: Any, record: str, field: str) -> Metrics:
    return _plain_mapping(values, record, field, (int, float), finite=True)


def _plain_logs(values: Any, record: str, field: str) -> Logs:
    return _plain_mapping(values, record, field, (str, int, float), finite=False)


def _check_bool(value: Any, record: str, field: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{record}.{field}: expected bool, got {type(value).__name__}")
    return bool(value)


def _check_str(value: Any, record: str, field: str, *, optional: bool = False) -> None:
    if not (isinstance(value, str) or (optional and value is None)):
        expected = "str or None" if optional else "str"
        raise TypeError(f"{record}.{field}: expected {expected}, got {type(value).__name__}")
