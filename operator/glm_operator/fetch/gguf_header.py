"""Read the facts the planner needs from a GGUF file's header, without touching its tensors.

The GGUF layout (ggml docs/gguf.md), all little-endian:

    magic "GGUF" | version u32 | tensor_count u64 | kv_count u64      (v1: both counts u32)
    kv_count x (key: string, value_type u32, value)
    tensor_count x (name: string, n_dims u32, dims u64[n_dims], ggml_type u32, offset u64)
    padding to general.alignment (default 32), then the tensor data

A string is a u64 length and UTF-8 bytes; an array is an element type u32, a u64 count and
the elements. The parser reads only this header (a few MiB at most, mostly the tokenizer's
vocabulary) and seeks over numeric arrays, so a 400 GB model is inspected in milliseconds.
It is written here rather than taken from the `gguf` package so the fetch image needs no
numpy and so a hostile file cannot make it allocate more than the file's own size.
"""

from __future__ import annotations

import io
import math
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
# Nobody needs a key or a string value longer than this; a larger length means a corrupt file.
MAX_STRING_BYTES = 64 * 1024 * 1024

# value type id -> (struct format, size) for the fixed-size scalars
_SCALARS: dict[int, tuple[str, int]] = {
    0: ("<B", 1),  # UINT8
    1: ("<b", 1),  # INT8
    2: ("<H", 2),  # UINT16
    3: ("<h", 2),  # INT16
    4: ("<I", 4),  # UINT32
    5: ("<i", 4),  # INT32
    6: ("<f", 4),  # FLOAT32
    7: ("<?", 1),  # BOOL
    10: ("<Q", 8),  # UINT64
    11: ("<q", 8),  # INT64
    12: ("<d", 8),  # FLOAT64
}
_STRING = 8
_ARRAY = 9

# llama.cpp's LLAMA_FTYPE values for the names people write in manifests.
FILE_TYPE_NAMES: dict[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1",
    10: "Q2_K", 11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M",
    16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S",
    22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M",
    28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0",
    37: "TQ2_0", 38: "MXFP4_MOE",
}

# ggml_type id -> (values per block, bytes per block), from ggml's type traits: what a
# tensor of a type weighs (the nextn layers' bytes, which the pinned llama.cpp does not load).
GGML_TYPE_SIZES: dict[int, tuple[int, int]] = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
    9: (32, 40), 10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176),
    14: (256, 210), 15: (256, 292), 16: (256, 66), 17: (256, 74), 18: (256, 98),
    19: (256, 50), 20: (32, 18), 21: (256, 110), 22: (256, 82), 23: (256, 136), 24: (1, 1),
    25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8), 29: (256, 56), 30: (1, 2),
    34: (256, 54), 35: (256, 66), 39: (32, 17), 40: (64, 36), 41: (128, 18),
}  # fmt: skip

Scalar = int | float | bool | str


class GGUFFormatError(ValueError):
    """The bytes are not a readable GGUF header; the message says what and where."""


@dataclass(frozen=True)
class GGUFFacts:
    """What a GGUF header says about the model, in the vocabulary of llama.cpp's keys."""

    version: int
    tensor_count: int
    kv_count: int
    architecture: str | None
    name: str | None = None
    block_count: int | None = None
    context_length: int | None = None
    embedding_length: int | None = None
    head_count: int | None = None
    head_count_kv: int | None = None
    key_length: int | None = None
    value_length: int | None = None
    feed_forward_length: int | None = None  # n_ff; a per-layer array gives its largest
    expert_feed_forward_length: int | None = None  # MoE: one expert's n_ff
    nextn_predict_layers: int | None = None
    expert_count: int | None = None
    expert_used_count: int | None = None
    file_type: int | None = None
    alignment: int = DEFAULT_ALIGNMENT
    # Where the tensor data starts, and how many bytes of it the file holds (padding included).
    data_offset: int = 0
    tensor_data_bytes: int | None = None
    # Bytes of the nextn (MTP) layers' tensors (blk.N.* for the last nextn_predict_layers
    # blocks); None when the file has none or a tensor of a type this reader does not size.
    nextn_tensor_bytes: int | None = None
    # <arch>.vocab_size, else the length of tokenizer.ggml.tokens (as llama.cpp reads it).
    vocab_size: int | None = None
    metadata: dict[str, Scalar] = field(default_factory=dict, repr=False)
    # Small per-layer integer arrays (head_count_kv: 0 marks a recurrent layer; indexer types).
    arrays: dict[str, list[int]] = field(default_factory=dict, repr=False)

    @property
    def file_type_name(self) -> str | None:
        if self.file_type is None:
            return None
        return FILE_TYPE_NAMES.get(self.file_type, f"ftype-{self.file_type}")


class _Reader:
    def __init__(self, stream: BinaryIO, size: int | None) -> None:
        self._stream = stream
        self._size = size

    def tell(self) -> int:
        return self._stream.tell()

    def exact(self, count: int, what: str) -> bytes:
        if self._size is not None and self.tell() + count > self._size:
            raise GGUFFormatError(
                f"truncated GGUF header: {what} needs {count} bytes at offset {self.tell()}, "
                f"file has {self._size}"
            )
        data = self._stream.read(count)
        if len(data) != count:
            raise GGUFFormatError(f"truncated GGUF header: {what} at offset {self.tell()}")
        return data

    def skip(self, count: int, what: str) -> None:
        if self._size is not None:
            if self.tell() + count > self._size:
                raise GGUFFormatError(
                    f"truncated GGUF header: {what} ({count} bytes) runs past the end of the file"
                )
            self._stream.seek(count, io.SEEK_CUR)
        else:
            self.exact(count, what)

    def u32(self, what: str) -> int:
        value: int = struct.unpack("<I", self.exact(4, what))[0]
        return value

    def u64(self, what: str) -> int:
        value: int = struct.unpack("<Q", self.exact(8, what))[0]
        return value

    def string(self, what: str) -> str:
        length = self.u64(what)
        if length > MAX_STRING_BYTES:
            raise GGUFFormatError(f"{what}: string length {length} is not plausible")
        raw = self.exact(length, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise GGUFFormatError(f"{what}: not UTF-8 ({exc})") from exc

    def skip_string(self, what: str) -> None:
        length = self.u64(what)
        self.skip(length, what)


def _read_value(reader: _Reader, value_type: int, key: str,
                counts: dict[str, int] | None = None) -> Scalar | list[int] | None:
    """The value of one key; arrays of ints are returned (for per-layer counts), others skipped
    (a string array's element count goes into `counts`: the vocabulary's size)."""
    if value_type in _SCALARS:
        fmt, size = _SCALARS[value_type]
        value: Scalar = struct.unpack(fmt, reader.exact(size, key))[0]
        return value
    if value_type == _STRING:
        return reader.string(key)
    if value_type == _ARRAY:
        element_type = reader.u32(f"{key} element type")
        count = reader.u64(f"{key} element count")
        if element_type in _SCALARS:
            fmt, size = _SCALARS[element_type]
            # Small integer (and bool) arrays carry per-layer values: head_count_kv, where 0
            # marks a recurrent layer (glm5-next), and attention.indexer.types.
            if fmt[-1] in "BbHhIiQq?" and count <= 4096:
                raw = reader.exact(size * count, key)
                return [int(v) for v in struct.unpack(f"<{count}{fmt[-1]}", raw)]
            reader.skip(size * count, key)
            return None
        if element_type == _STRING:
            if counts is not None:
                counts[key] = count
            for _ in range(count):
                reader.skip_string(key)
            return None
        if element_type == _ARRAY:
            raise GGUFFormatError(f"{key}: nested arrays are not part of GGUF")
        raise GGUFFormatError(f"{key}: unknown array element type {element_type}")
    raise GGUFFormatError(f"{key}: unknown value type {value_type}")


def _as_int(value: Scalar | list[int] | None) -> int | None:
    """Integer facts; for per-layer arrays the largest value (what memory sizing must cover)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, list):
        return max(value) if value else None
    if isinstance(value, int):
        return value
    return None


def read_gguf_header(stream: BinaryIO, size: int | None = None) -> GGUFFacts:
    """Parse the header from a binary stream positioned at the start of the file."""
    reader = _Reader(stream, size)
    magic = reader.exact(4, "magic")
    if magic != GGUF_MAGIC:
        raise GGUFFormatError(f"not a GGUF file: magic is {magic!r}, expected b'GGUF'")
    version = reader.u32("version")
    if version == 1:
        # v1 (before August 2023) used 32-bit lengths; llama.cpp itself no longer loads it.
        raise GGUFFormatError("GGUF version 1 is obsolete: re-convert the model")
    if version not in (2, 3):
        raise GGUFFormatError(f"unsupported GGUF version {version} (this reader knows 2 and 3)")
    tensor_count, kv_count = reader.u64("tensor_count"), reader.u64("kv_count")
    if size is not None and (kv_count > size or tensor_count > size):
        raise GGUFFormatError(
            f"implausible counts: {kv_count} keys, {tensor_count} tensors in a {size}-byte file"
        )

    values: dict[str, Scalar | list[int] | None] = {}
    string_arrays: dict[str, int] = {}
    for index in range(kv_count):
        key = reader.string(f"key #{index}")
        value_type = reader.u32(f"{key} value type")
        values[key] = _read_value(reader, value_type, key, string_arrays)

    architecture = values.get("general.architecture")
    arch = architecture if isinstance(architecture, str) else None
    block_count = _as_int(values.get(f"{arch}.block_count")) if arch else None
    nextn = _as_int(values.get(f"{arch}.nextn_predict_layers")) if arch else None
    nextn_prefixes = (
        tuple(f"blk.{i}." for i in range(block_count - nextn, block_count))
        if block_count and nextn and 0 < nextn <= block_count else ()
    )
    nextn_bytes: int | None = 0 if nextn_prefixes else None
    for index in range(tensor_count):
        what = f"tensor info #{index}"
        tensor_name = reader.string(what)
        n_dims = reader.u32(what)
        if n_dims > 8:
            raise GGUFFormatError(f"{what}: {n_dims} dimensions is not plausible")
        if nextn_bytes is not None and tensor_name.startswith(nextn_prefixes):
            dims = struct.unpack(f"<{n_dims}Q", reader.exact(8 * n_dims, what))
            ggml_type = reader.u32(what)
            reader.skip(8, what)  # data offset
            nextn_bytes = _tensor_bytes(dims, ggml_type, nextn_bytes)
        else:
            reader.skip(8 * n_dims + 4 + 8, what)  # dims, ggml type, data offset

    alignment = _as_int(values.get("general.alignment")) or DEFAULT_ALIGNMENT
    if alignment <= 0 or alignment & (alignment - 1):
        raise GGUFFormatError(f"general.alignment {alignment} is not a power of two")
    end_of_infos = reader.tell()
    data_offset = end_of_infos + (-end_of_infos % alignment)
    tensor_data_bytes = max(0, size - data_offset) if size is not None else None

    name = values.get("general.name")

    def arch_int(suffix: str) -> int | None:
        return _as_int(values.get(f"{arch}.{suffix}")) if arch else None

    metadata = {k: v for k, v in values.items() if isinstance(v, int | float | bool | str)}
    arrays = {k: v for k, v in values.items()
              if isinstance(v, list) and arch and k.startswith(f"{arch}.")}
    return GGUFFacts(
        version=version,
        tensor_count=tensor_count,
        kv_count=kv_count,
        architecture=arch,
        name=name if isinstance(name, str) else None,
        block_count=arch_int("block_count"),
        context_length=arch_int("context_length"),
        embedding_length=arch_int("embedding_length"),
        head_count=arch_int("attention.head_count"),
        head_count_kv=arch_int("attention.head_count_kv"),
        key_length=arch_int("attention.key_length"),
        value_length=arch_int("attention.value_length"),
        feed_forward_length=arch_int("feed_forward_length"),
        expert_feed_forward_length=arch_int("expert_feed_forward_length"),
        nextn_predict_layers=arch_int("nextn_predict_layers"),
        expert_count=arch_int("expert_count"),
        expert_used_count=arch_int("expert_used_count"),
        file_type=_as_int(values.get("general.file_type")),
        alignment=alignment,
        data_offset=data_offset,
        tensor_data_bytes=tensor_data_bytes,
        nextn_tensor_bytes=nextn_bytes or None,
        vocab_size=arch_int("vocab_size") or string_arrays.get("tokenizer.ggml.tokens"),
        metadata=metadata,
        arrays=arrays,
    )


def _tensor_bytes(dims: tuple[int, ...], ggml_type: int, total: int | None) -> int | None:
    """`total` plus one tensor's bytes; None once a type is unknown (the sum is not known)."""
    if total is None or ggml_type not in GGML_TYPE_SIZES:
        return None
    block, size = GGML_TYPE_SIZES[ggml_type]
    count = math.prod(dims)
    return total + count // block * size


def read_gguf_file(path: str | os.PathLike[str]) -> GGUFFacts:
    """Parse the header of the GGUF file at `path` (buffered, seeking over arrays)."""
    file_path = Path(path)
    size = file_path.stat().st_size
    with file_path.open("rb", buffering=1024 * 1024) as stream:
        return read_gguf_header(stream, size)
