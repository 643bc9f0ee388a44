"""Reads the metadata of a GGUF file (llama.cpp's model format), nothing else.

A GGUF file starts with `GGUF`, a version (2 or 3), the tensor and key-value
counts, then the key-value pairs (the tokenizer lives there) before any
tensor. This reader memory-maps the file and parses only those pairs, so a
multi-gigabyte model costs the pages of its header. Arrays of numbers come
back as NumPy arrays in one `frombuffer`; arrays of strings as lists of
`bytes` (one slice each); the `gguf` package's reader builds a NumPy view
per element, far slower on a large vocabulary.

Standard library and NumPy only.
"""

from __future__ import annotations

import mmap
import os
import struct

import numpy as np

_MAGIC = b"GGUF"
_STRING, _ARRAY = 8, 9
#: GGUF value types of fixed size -> NumPy dtypes (little-endian).
_SCALARS = {
    0: np.dtype("<u1"),
    1: np.dtype("<i1"),
    2: np.dtype("<u2"),
    3: np.dtype("<i2"),
    4: np.dtype("<u4"),
    5: np.dtype("<i4"),
    6: np.dtype("<f4"),
    7: np.dtype("<u1"),  # bool
    10: np.dtype("<u8"),
    11: np.dtype("<i8"),
    12: np.dtype("<f8"),
}


def read_gguf_metadata(path: str | os.PathLike) -> dict:
    """The key-value metadata of a GGUF file.

    Returns:
        dict from key to value: `int`/`float`/`bool` scalars, `bytes`
        strings, NumPy arrays of numbers, lists of `bytes` for string arrays.

    Raises:
        ValueError: not a GGUF file, an unsupported version or byte order, or
            a truncated header.
    """
    path = os.fspath(path)
    with open(path, "rb") as file:
        try:
            view = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file cannot be mapped
            raise ValueError(f"{path!r} is not a GGUF file (it is empty)") from None
    try:
        return _Parser(view, path).metadata()
    finally:
        view.close()


class _Parser:
    def __init__(self, buffer, path: str):
        self.buffer = buffer
        self.path = path
        self.at = 0

    def _take(self, size: int):
        end = self.at + size
        if size < 0 or end > len(self.buffer):
            raise ValueError(f"{self.path!r} is truncated: its GGUF header ends early")
        start, self.at = self.at, end
        return start

    def _unpack(self, fmt: str):
        start = self._take(struct.calcsize(fmt))
        return struct.unpack_from(fmt, self.buffer, start)[0]

    def _string(self) -> bytes:
        size = self._unpack("<Q")
        start = self._take(size)
        return self.buffer[start : start + size]

    def _value(self, kind: int):
        if kind == _STRING:
            return self._string()
        if kind == _ARRAY:
            item_kind = self._unpack("<I")
            count = self._unpack("<Q")
            if item_kind == _STRING:
                return [self._string() for _ in range(count)]
            if item_kind in _SCALARS:
                dtype = _SCALARS[item_kind]
                start = self._take(count * dtype.itemsize)
                return np.frombuffer(self.buffer, dtype, count, start).copy()
            if item_kind == _ARRAY:
                return [self._value(_ARRAY) for _ in range(count)]
            raise ValueError(f"{self.path!r}: unknown GGUF value type {item_kind}")
        if kind in _SCALARS:
            dtype = _SCALARS[kind]
            start = self._take(dtype.itemsize)
            value = np.frombuffer(self.buffer, dtype, 1, start)[0].item()
            return bool(value) if kind == 7 else value
        raise ValueError(f"{self.path!r}: unknown GGUF value type {kind}")

    def metadata(self) -> dict:
        if bytes(self.buffer[:4]) != _MAGIC:
            raise ValueError(f"{self.path!r} is not a GGUF file (no GGUF magic)")
        self._take(4)
        version = self._unpack("<I")
        if version not in (2, 3):
            hint = " (a big-endian file?)" if version > 0xFFFF else ""
            raise ValueError(f"{self.path!r}: GGUF version {version} is not supported{hint}")
        self._unpack("<Q")  # tensor count
        count = self._unpack("<Q")
        out = {}
        for _ in range(count):
            key = self._string().decode("utf-8", errors="replace")
            out[key] = self._value(self._unpack("<I"))
        return out
