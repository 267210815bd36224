"""msgpack and JSON round trips of any record, or tuple / list of records, exactly.

msgpack stores arrays as raw little-endian bytes; JSON stores them as lists (float32 values
survive the float64 text form exactly). Decoding validates fully: msgspec runs each record's
`__post_init__`.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable
from typing import Any, TypeVar, cast

import msgspec
import numpy as np


def _msgpack_enc_hook(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return {"dtype": obj.dtype.str, "data": obj.tobytes()}
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


def _json_enc_hook(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


_ALLOWED_WIRE_DTYPES = {"<i4", "<f4", "<i8", "<f8"}


def _dec_hook(kind: type, obj: Any) -> Any:
    if kind is np.ndarray:
        if isinstance(obj, dict):
            dtype = obj.get("dtype")
            data = obj.get("data")
            if dtype not in _ALLOWED_WIRE_DTYPES or not isinstance(data, (bytes, memoryview)):
                raise ValueError(f"array: unsupported wire form (dtype={dtype!r})")
            if len(data) % np.dtype(dtype).itemsize:
                raise ValueError(f"array: {len(data)} bytes is not a whole number of {dtype}")
            return np.frombuffer(data, dtype=dtype)
        if isinstance(obj, list):
            try:
                return np.asarray(obj)  # the record's __post_init__ checks the dtype and casts
            except (TypeError, ValueError) as err:
                raise ValueError(f"array: {err}") from None
        raise ValueError(f"array: expected a list or an encoded array, got {type(obj).__name__}")
    raise NotImplementedError(f"cannot decode {kind}")


_MSGPACK_ENCODER = msgspec.msgpack.Encoder(enc_hook=_msgpack_enc_hook)
_JSON_ENCODER = msgspec.json.Encoder(enc_hook=_json_enc_hook)

T = TypeVar("T")


def encode_msgpack(obj: Any) -> bytes:
    """Encodes a record (or a tuple/list of records) to msgpack bytes."""
    return _MSGPACK_ENCODER.encode(obj)


# Decoders are stateless and costly to build, so they are built once per target type (msgspec's
# advice); the cache holds nothing that depends on the data decoded.
@functools.lru_cache(maxsize=64)
def _msgpack_decoder(kind: Any) -> msgspec.msgpack.Decoder[Any]:
    return msgspec.msgpack.Decoder(kind, dec_hook=_dec_hook)


@functools.lru_cache(maxsize=64)
def _json_decoder(kind: Any) -> msgspec.json.Decoder[Any]:
    return msgspec.json.Decoder(kind, dec_hook=_dec_hook)


# What msgspec raises, instead of a `ValidationError`, on untrusted input where `kind` leaves the
# structure open (`Any`, `list`, `dict` fields): nesting deeper than the interpreter's recursion
# limit, and strings that are not UTF-8. Both are faults of the data, reported as such.
_UNVALIDATED_ERRORS = (RecursionError, UnicodeDecodeError)


def _validation_error(err: RecursionError | UnicodeDecodeError) -> msgspec.ValidationError:
    if isinstance(err, RecursionError):
        return msgspec.ValidationError("input is nested too deeply")
    return msgspec.ValidationError(f"invalid UTF-8 in a string: {err.reason} at byte {err.start}")


def decode_msgpack(data: bytes, kind: type[T]) -> T:
    """Decodes msgpack `data` as `kind` (e.g. `tuple[TrajectoryGroup, ...]`), validating fully.

    Raises:
        msgspec.ValidationError: naming the path (`$.trajectories_G[0]...`) and the problem;
            also for input nested too deeply or holding strings that are not UTF-8.
    """
    try:
        decoded: T = _msgpack_decoder(cast(Hashable, kind)).decode(data)  # a decoder for `kind`
    except _UNVALIDATED_ERRORS as err:
        raise _validation_error(err) from None
    return decoded


def encode_json(obj: Any) -> bytes:
    """Encodes a record (or a tuple/list of records) to JSON bytes."""
    return _JSON_ENCODER.encode(obj)


def decode_json(data: bytes | str, kind: type[T]) -> T:
    """Decodes JSON `data` as `kind`, validating fully (see `decode_msgpack`)."""
    try:
        decoded: T = _json_decoder(cast(Hashable, kind)).decode(data)  # a decoder for `kind`
    except _UNVALIDATED_ERRORS as err:
        raise _validation_error(err) from None
    return decoded
