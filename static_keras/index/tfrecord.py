"""TFRecord framing and TensorFlow's masked CRC-32C, without TensorFlow.

A TFRecord file is a sequence of records, each `uint64 length`, `uint32
masked CRC-32C of the length`, `length` bytes of data, `uint32 masked
CRC-32C of the data` (all little-endian). The same masked CRC guards
checkpoint entries (`export/checkpoint_patch.py`). Read by the Beam index
build (its TFRecord shards) and by the warmup-record reader, which would
otherwise need `tf.data` (and log a note on every read).
"""

from __future__ import annotations

import struct

import google_crc32c

_MASK_DELTA = 0xA282EAD8


def masked_crc32c(data: bytes) -> int:
    """LevelDB's and TensorFlow's masked CRC-32C of `data`."""
    return mask_crc32c(google_crc32c.value(data))


def mask_crc32c(value: int) -> int:
    """The masked form of a CRC-32C (`google_crc32c.value` / `.extend`)."""
    return (((value >> 15) | (value << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def read_records(file, path: str):
    """Yields the data of each record of an open TFRecord `file`.

    Raises:
        ValueError: naming `path` and the record when the file is truncated
            or a CRC does not match.
    """
    row = 0
    while True:
        header = file.read(12)
        if not header:
            return
        if len(header) < 12:
            raise ValueError(f"{path}: the TFRecord file is truncated (row {row})")
        (length,) = struct.unpack("<Q", header[:8])
        if masked_crc32c(header[:8]) != struct.unpack("<I", header[8:])[0]:
            raise ValueError(f"{path}: TFRecord length checksum mismatch (row {row})")
        data = file.read(length)
        footer = file.read(4)
        if len(data) < length or len(footer) < 4:
            raise ValueError(f"{path}: the TFRecord file is truncated (row {row})")
        if masked_crc32c(data) != struct.unpack("<I", footer)[0]:
            raise ValueError(f"{path}: TFRecord data checksum mismatch (row {row})")
        yield data
        row += 1
