"""A checkpoint with a few tensors replaced, writing only their bytes.

An eligibility refresh changes a few MB of set bits in a version whose
checkpoint holds the whole index (about 1 GB at 2 x 10^7 items). Reading
every tensor back and saving them all again costs seconds per GB; instead
the new checkpoint links the source's data shards as they are (hard links:
versions are immutable, nothing ever writes into a published file), writes
the replaced tensors to one new shard, and writes a new index that points
there. The result is a plain TensorFlow checkpoint (tensor bundle) that
`tf.train.load_checkpoint`, `tf.saved_model.load` and TF Serving's
`LoadSavedModel` read like any other.

The bundle format, as TensorFlow writes it (tensorflow/core/util/
tensor_bundle): `<prefix>.data-<i>-of-<n>` shards of raw tensor bytes and
`<prefix>.index`, a LevelDB-format table (uncompressed blocks, each followed
by a type byte and a masked CRC-32C; a 48-byte footer ending in the table
magic) that maps "" to a `BundleHeaderProto` (shard count, endianness) and
each tensor key to a `BundleEntryProto` (dtype, shape, shard, offset, size
and the masked CRC-32C of the bytes, which the reader checks).
"""

from __future__ import annotations

import os
import shutil
import struct
from typing import Mapping

import google_crc32c
import numpy as np

_MAGIC = 0xDB4775248B80FB57
_FOOTER_BYTES = 48  # two block handles padded to 20 bytes each, then the magic
_RESTART_INTERVAL = 16


def replace_tensors(
    source_prefix: str, target_prefix: str, tensors: Mapping[str, np.ndarray]
) -> int:
    """Writes checkpoint `target_prefix`: that of `source_prefix` with
    `tensors` (checkpoint key -> array of the same dtype and shape) replaced.

    Shards still read are hard-linked (copied where the filesystem has no
    links); the replaced values form one new shard. Returns the bytes
    written (the new shard and the index).
    """
    from tensorflow.core.protobuf import tensor_bundle_pb2

    entries = _read_table(_read(source_prefix + ".index"))
    if not entries or entries[0][0] != b"":
        raise ValueError(f"{source_prefix}.index has no bundle header")
    header = tensor_bundle_pb2.BundleHeaderProto.FromString(entries[0][1])
    if header.endianness != tensor_bundle_pb2.BundleHeaderProto.LITTLE:
        raise ValueError(f"{source_prefix}: only little-endian checkpoints are supported")
    parsed = {
        key: tensor_bundle_pb2.BundleEntryProto.FromString(value) for key, value in entries[1:]
    }
    missing = sorted(set(tensors) - {key.decode() for key in parsed})
    if missing:
        raise ValueError(f"{source_prefix} has no tensors {missing}")

    # The replaced values, in key order, as one new shard.
    chunks, offset = [], 0
    for key in sorted(tensors):
        entry = parsed[key.encode()]
        data = _tensor_bytes(key, entry, tensors[key])
        entry.offset, entry.size = offset, len(data)
        entry.crc32c = _masked_crc(data)
        entry.shard_id = -1  # numbered below
        chunks.append(data)
        offset += len(data)

    # Shards some unchanged tensor still reads keep their order; the new one goes last.
    kept = sorted({e.shard_id for e in parsed.values() if e.shard_id >= 0})
    renumber = {old: new for new, old in enumerate(kept)}
    shards = len(kept) + 1
    for entry in parsed.values():
        entry.shard_id = renumber.get(entry.shard_id, shards - 1)
    for old, new in renumber.items():
        _link_or_copy(
            _shard(source_prefix, old, header.num_shards), _shard(target_prefix, new, shards)
        )
    with open(_shard(target_prefix, shards - 1, shards), "wb") as file:
        for data in chunks:
            file.write(data)
    header.num_shards = shards
    table = _table(
        [(b"", header.SerializeToString())]
        + [(key, parsed[key].SerializeToString()) for key, _ in entries[1:]]
    )
    with open(target_prefix + ".index", "wb") as file:
        file.write(table)
    return offset + len(table)


def _tensor_bytes(key: str, entry, value) -> bytes:
    import tensorflow as tf

    dtype = tf.dtypes.as_dtype(entry.dtype)
    shape = tuple(d.size for d in entry.shape.dim)
    value = np.asarray(value)
    if dtype == tf.string or entry.slices:
        raise ValueError(f"{key}: only whole numeric tensors can be replaced")
    if value.shape != shape or value.dtype != dtype.as_numpy_dtype:
        raise ValueError(
            f"{key}: the checkpoint holds {dtype.name} {shape}; the new value is "
            f"{value.dtype} {value.shape}"
        )
    return np.ascontiguousarray(value).astype(value.dtype.newbyteorder("<"), copy=False).tobytes()


def _shard(prefix: str, index: int, count: int) -> str:
    return f"{prefix}.data-{index:05d}-of-{count:05d}"


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:  # another filesystem, or one without hard links
        shutil.copyfile(source, target)


def _read(path: str) -> bytes:
    with open(path, "rb") as file:
        return file.read()


def _masked_crc(data: bytes) -> int:
    """LevelDB's and TensorFlow's masked CRC-32C."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


# The table (LevelDB's format, as TensorFlow's lib/io writes it) ------------


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, at


def _put_varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _block(table: bytes, handle: bytes) -> bytes:
    """The contents of the block at `handle` (offset, size), its checksum checked."""
    offset, at = _varint(handle, 0)
    size, _ = _varint(handle, at)
    contents = table[offset : offset + size]
    kind = table[offset + size]
    (stored,) = struct.unpack("<I", table[offset + size + 1 : offset + size + 5])
    if kind != 0:
        raise ValueError("compressed checkpoint index blocks are not supported")
    if stored != _masked_crc(table[offset : offset + size + 1]):
        raise ValueError("checkpoint index block checksum mismatch (a corrupt file)")
    return contents


def _block_entries(block: bytes) -> list[tuple[bytes, bytes]]:
    (restarts,) = struct.unpack("<I", block[-4:])
    end = len(block) - 4 - 4 * restarts
    entries, key, at = [], b"", 0
    while at < end:
        shared, at = _varint(block, at)
        unshared, at = _varint(block, at)
        length, at = _varint(block, at)
        key = key[:shared] + block[at : at + unshared]
        at += unshared
        entries.append((key, block[at : at + length]))
        at += length
    return entries


def _read_table(table: bytes) -> list[tuple[bytes, bytes]]:
    """Every `(key, value)` of a table, in key order."""
    footer = table[-_FOOTER_BYTES:]
    if len(table) < _FOOTER_BYTES or struct.unpack("<Q", footer[-8:])[0] != _MAGIC:
        raise ValueError("not a checkpoint index (no table magic: truncated or corrupt)")
    _, at = _varint(footer, _varint(footer, 0)[1])  # skip the metaindex handle
    index = _block(table, footer[at:])
    entries = []
    for _, handle in _block_entries(index):
        entries.extend(_block_entries(_block(table, handle)))
    return entries


def _build_block(entries, interval: int) -> bytes:
    """A block without prefix compression (every key whole), restart points
    every `interval` entries."""
    out, restarts = bytearray(), []
    for position, (key, value) in enumerate(entries):
        if position % interval == 0:
            restarts.append(len(out))
        out += _put_varint(0) + _put_varint(len(key)) + _put_varint(len(value)) + key + value
    restarts = restarts or [0]
    out += struct.pack(f"<{len(restarts)}I", *restarts) + struct.pack("<I", len(restarts))
    return bytes(out)


def _table(entries) -> bytes:
    """A table of sorted `entries`: one data block, an empty metaindex, an
    index block whose one key (the last key) bounds the data block."""
    out = bytearray()

    def append(block: bytes) -> bytes:
        handle = _put_varint(len(out)) + _put_varint(len(block))
        trailed = block + b"\x00"
        out.extend(trailed + struct.pack("<I", _masked_crc(trailed)))
        return handle

    data = append(_build_block(entries, _RESTART_INTERVAL))
    meta = append(_build_block([], 1))
    index = append(_build_block([(entries[-1][0], data)], 1))
    handles = (meta + index).ljust(_FOOTER_BYTES - 8, b"\x00")
    out += handles + struct.pack("<Q", _MAGIC)
    return bytes(out)
