"""A fast reader for the GGUF container: metadata as Python values, tensors as memory-mapped bytes.

Why not `gguf.GGUFReader`: it builds numpy views for every element of every metadata array, so
opening SmolLM2-135M's file (49,152 tokens, 48,900 merges) takes ~4.5 s of CPU before any
tensor is read. This reader decodes the same layout in ~0.1 s; the `gguf` package still does
the dequantisation (`gguf.quants.dequantize`) and supplies the type tables
(`GGMLQuantizationType`, `GGML_QUANT_SIZES`). The tests write files with `gguf.GGUFWriter`,
so the two implementations check each other.

Layout (GGUF v2/v3, little-endian): magic `GGUF`, uint32 version, uint64 tensor count, uint64
metadata count; each metadata entry is a string key, a uint32 value type and the value (arrays:
uint32 item type, uint64 count, items; strings: uint64 byte length, UTF-8 bytes); each tensor
info is a string name, uint32 dimension count, uint64 dimensions (fastest-varying first), uint32
GGML type and uint64 offset; tensor data starts at the next multiple of `general.alignment`
(default 32) after the infos.
"""

from __future__ import annotations

import math
import mmap
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

__all__ = ["GGUFFile", "GGUFFormatError", "GGUFTensor", "read_gguf_file"]

_MAGIC = b"GGUF"
_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8"}
_NUMPY |= {11: "<i8", 12: "<f8"}
_STRING, _ARRAY = 8, 9


class GGUFFormatError(ValueError):
    """The bytes are not a GGUF file this reader understands (the message says where)."""


class GGUFTensor(msgspec.Struct, frozen=True, kw_only=True, eq=False):
    """One tensor of a GGUF file.

    Attributes:
        name: llama.cpp's tensor name (`blk.0.attn_q.weight`).
        tensor_type: its GGML type.
        shape: dimensions as GGUF lists them, fastest-varying first (`(cols, rows)`).
        data: its bytes, memory-mapped, `uint8 [rows..., bytes per row]` (what
            `gguf.quants.dequantize` takes).
    """

    name: str
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]
    data: np.ndarray


class GGUFFile(msgspec.Struct, frozen=True, kw_only=True, eq=False):
    """A GGUF file's metadata and tensors.

    Attributes:
        path: the file.
        version: the GGUF version (2 or 3).
        fields: metadata key → value (`int`, `float`, `bool`, `str`, or a `list` of those).
        tensors: the tensors, in file order.
    """

    path: Path
    version: int
    fields: Mapping[str, Any]
    tensors: tuple[GGUFTensor, ...]


class _Cursor:
    def __init__(self, buffer: mmap.mmap) -> None:
        self.buffer = buffer
        self.offset = 0

    def unpack(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self.buffer, self.offset)
        self.offset += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        length = self.unpack("<Q")
        end = self.offset + length
        if end > len(self.buffer):
            raise GGUFFormatError(
                f"a string of {length} bytes at byte {self.offset} runs past the end"
            )
        text = self.buffer[self.offset : end].decode("utf-8")
        self.offset = end
        return text

    def value(self, kind: int) -> Any:
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, count = self.unpack("<I"), self.unpack("<Q")
            if item in _NUMPY:
                dtype = np.dtype(_NUMPY[item])
                if self.offset + dtype.itemsize * count > len(self.buffer):
                    raise GGUFFormatError(
                        f"an array of {count} {dtype.name} at byte {self.offset} runs past the end"
                    )
                values = np.frombuffer(self.buffer, dtype=dtype, count=count, offset=self.offset)
                self.offset += dtype.itemsize * count
                return values.tolist()
            return [self.value(item) for _ in range(count)]
        raise GGUFFormatError(f"unknown metadata value type {kind} at byte {self.offset}")


def read_gguf_file(path: Path) -> GGUFFile:
    """Read a GGUF file's metadata and tensor table (tensor bytes stay memory-mapped).

    Raises:
        OSError: the file cannot be opened.
        GGUFFormatError: not GGUF, an unsupported version, a truncated or malformed table, or a
            tensor of a GGML type this `gguf` package does not know (naming it).
    """
    with path.open("rb") as handle:
        try:
            buffer = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file cannot be mapped
            raise GGUFFormatError("empty file") from None
    try:
        return _parse(path, buffer)
    except (struct.error, UnicodeDecodeError, IndexError) as error:
        raise GGUFFormatError(f"truncated or malformed ({error})") from None


def _parse(path: Path, buffer: mmap.mmap) -> GGUFFile:
    if buffer[:4] != _MAGIC:
        raise GGUFFormatError(f"magic is {bytes(buffer[:4])!r}, not b'GGUF'")
    cursor = _Cursor(buffer)
    cursor.offset = 4
    version = cursor.unpack("<I")
    if version not in (2, 3):
        raise GGUFFormatError(f"GGUF version {version} (only 2 and 3, little-endian, are read)")
    tensor_count, field_count = cursor.unpack("<Q"), cursor.unpack("<Q")
    fields: dict[str, Any] = {}
    for _ in range(field_count):
        key = cursor.string()
        try:
            fields[key] = cursor.value(cursor.unpack("<I"))
        except GGUFFormatError as error:
            raise GGUFFormatError(f"metadata field {key!r}: {error}") from None
    infos = []
    for _ in range(tensor_count):
        name = cursor.string()
        dims = tuple(cursor.unpack("<Q") for _ in range(cursor.unpack("<I")))
        type_id, offset = cursor.unpack("<I"), cursor.unpack("<Q")
        infos.append((name, dims, type_id, offset))
    alignment = fields.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment <= 0:
        raise GGUFFormatError(f"metadata field 'general.alignment' is {alignment!r}, not > 0")
    start = -(-cursor.offset // alignment) * alignment
    tensors = []
    for name, dims, type_id, offset in infos:
        try:
            tensor_type = GGMLQuantizationType(type_id)
            block, block_bytes = GGML_QUANT_SIZES[tensor_type]
        except (ValueError, KeyError):
            raise GGUFFormatError(
                f"tensor {name!r} has GGML type {type_id}, unknown to gguf (an unknown quantisation)"
            ) from None
        cols = dims[0] if dims else 1
        if cols % block:
            raise GGUFFormatError(
                f"tensor {name!r}: {cols} columns are not whole {tensor_type.name} blocks of {block}"
            )
        row_bytes = cols // block * block_bytes
        rows = tuple(reversed(dims[1:]))
        nbytes = row_bytes * math.prod(rows)
        begin = start + offset
        if begin + nbytes > len(buffer):
            raise GGUFFormatError(f"tensor {name!r} runs past the end of the file")
        data = np.frombuffer(buffer, dtype=np.uint8, count=nbytes, offset=begin)
        tensors.append(
            GGUFTensor(
                name=name,
                tensor_type=tensor_type,
                shape=dims,
                data=data.reshape(*rows, row_bytes),
            )
        )
    return GGUFFile(path=path, version=version, fields=fields, tensors=tuple(tensors))
