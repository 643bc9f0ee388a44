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

from static_keras.export import direct_io
from static_keras.index.tfrecord import mask_crc32c
from static_keras.index.tfrecord import masked_crc32c

_MAGIC = 0xDB4775248B80FB57
_FOOTER_BYTES = 48  # two block handles padded to 20 bytes each, then the magic
_RESTART_INTERVAL = 16
_CHUNK = 1 << 22  # elements written per chunk


def replace_tensors(
    source_prefix: str, target_prefix: str, tensors: Mapping[str, np.ndarray]
) -> int:
    """Writes checkpoint `target_prefix`: that of `source_prefix` with
    `tensors` (checkpoint key -> array of the same dtype and shape) replaced.

    Shards still read are hard-linked (copied where the filesystem has no
    links); the replaced values form one new shard. Returns the bytes
    written (the new shard and the index).
    """
    header, entries = _read_index(source_prefix)
    missing = sorted(set(tensors) - set(entries))
    if missing:
        raise ValueError(f"{source_prefix} has no tensors {missing}")

    # The replaced values, in key order, as one new shard (written below).
    for key in tensors:
        _check_value(key, entries[key], tensors[key])
        entries[key]["shard_id"] = -1  # the new shard's

    # Shards some unchanged tensor still reads keep their order; the new one goes last.
    kept = sorted({e["shard_id"] for e in entries.values() if e["shard_id"] >= 0})
    renumber = {old: new for new, old in enumerate(kept)}
    shards = len(kept) + 1
    for entry in entries.values():
        entry["shard_id"] = renumber.get(entry["shard_id"], shards - 1)
    for old, new in renumber.items():
        _link_or_copy(
            _shard(source_prefix, old, header["num_shards"]), _shard(target_prefix, new, shards)
        )
    offset = 0
    with direct_io.SequentialWriter(_shard(target_prefix, shards - 1, shards)) as file:
        for key in sorted(tensors):
            size, crc = _write_tensor(file, key, entries[key], tensors[key])
            entries[key].update(offset=offset, size=size, crc32c=crc)
            offset += size
    header["num_shards"] = shards
    table = _table(
        [(b"", _header_bytes(header))]
        + [(key.encode(), _entry_bytes(entry)) for key, entry in entries.items()]
    )
    with open(target_prefix + ".index", "wb") as file:
        file.write(table)
    return offset + len(table)


def read_tensors(prefix: str, keys, dtypes=None) -> dict[str, np.ndarray]:
    """The tensors `keys` of checkpoint `prefix` (arrays of their own), each
    checked against its stored CRC-32C as TensorFlow's reader checks it.

    `dtypes`: optional `{key: dtype}` to read a tensor as (a narrower one
    its values fit, such as uint16 tokens stored as int32), converted a
    chunk at a time: no full-size buffer of the stored bytes."""
    header, entries = _read_index(prefix)
    out = {}
    for key in keys:
        entry = entries.get(key)
        if entry is None:
            raise ValueError(f"{prefix} has no tensor {key!r}")
        dtype = _numpy_dtype(key, entry)
        target = (dtypes or {}).get(key)
        with open(_shard(prefix, entry["shard_id"], header["num_shards"]), "rb") as file:
            file.seek(entry["offset"])
            target = dtype if target is None else np.dtype(target)
            value, crc = _read_array(file, entry["size"], dtype, target)
        if crc is None or mask_crc32c(crc) != entry["crc32c"]:
            raise ValueError(f"{prefix}: tensor {key!r} does not match its checksum (corrupt)")
        out[key] = value.reshape(entry["shape"])
    return out


def _read_array(file, size: int, stored: np.dtype, target: np.dtype):
    """`(array of `target`, CRC-32C or None when short)` of `size` stored
    bytes, read a chunk at a time into a writable array: straight into it
    when the dtypes agree, else through one reused chunk buffer (no fresh
    buffer per chunk: this machine pays for every new page)."""
    count = size // stored.itemsize
    value = np.empty(count, target)
    same = stored == target
    buffer = None if same else np.empty(min(_CHUNK, count), stored)
    crc, done = 0, 0
    while done < count:
        step = min(_CHUNK, count - done)
        part = value[done : done + step] if same else buffer[:step]
        if file.readinto(memoryview(part).cast("B")) != step * stored.itemsize:
            return value, None
        crc = google_crc32c.extend(crc, part.view(np.uint8))  # an array: no copy
        if not same:
            value[done : done + step] = part
        done += step
    if count * stored.itemsize != size:
        return value, None
    return value, crc


def verify_tensors(prefix: str, keys) -> None:
    """Reads the bytes of tensors `keys` of checkpoint `prefix` back, a
    chunk at a time, and checks each against its stored CRC-32C as
    TensorFlow's reader does (no array is built). ValueError naming the
    first tensor that does not match."""
    header, entries = _read_index(prefix)
    for key in keys:
        entry = entries.get(key)
        if entry is None:
            raise ValueError(f"{prefix} has no tensor {key!r}")
        # From the disk, not the page cache: the bytes a server will load.
        crc, left = 0, entry["size"]
        path = _shard(prefix, entry["shard_id"], header["num_shards"])
        for data in direct_io.read_chunks(path, entry["offset"], entry["size"]):
            # It takes bytes or an array, not a memoryview: a view, no copy.
            crc = google_crc32c.extend(crc, np.frombuffer(data, np.uint8))
            left -= len(data)
        if left or mask_crc32c(crc) != entry["crc32c"]:
            raise ValueError(f"{prefix}: tensor {key!r} does not match its checksum (corrupt)")


def tensor_specs(prefix: str) -> dict[str, tuple[int, tuple[int, ...]]]:
    """`{key: (TensorFlow DataType number, shape)}` of every tensor."""
    _, entries = _read_index(prefix)
    return {key: (entry["dtype"], entry["shape"]) for key, entry in entries.items()}


def _read_index(prefix: str) -> tuple[dict, dict[str, dict]]:
    entries = _read_table(_read(prefix + ".index"))
    if not entries or entries[0][0] != b"":
        raise ValueError(f"{prefix}.index has no bundle header")
    header = _parse_header(entries[0][1])
    if header["endianness"] != 0:  # BundleHeaderProto.LITTLE
        raise ValueError(f"{prefix}: only little-endian checkpoints are supported")
    return header, {key.decode(): _parse_entry(value) for key, value in entries[1:]}


#: TensorFlow DataType numbers of the numeric dtypes (types.proto).
_DTYPES = {
    1: np.float32, 2: np.float64, 3: np.int32, 4: np.uint8, 5: np.int16, 6: np.int8,
    9: np.int64, 10: np.bool_, 17: np.uint16, 19: np.float16, 22: np.uint32, 23: np.uint64,
}  # fmt: skip


def numpy_dtype(key: str, dtype_number: int) -> np.dtype:
    """The NumPy dtype of a tensor of TensorFlow DataType `dtype_number`
    (as `tensor_specs` gives it); ValueError for a non-numeric one."""
    return _numpy_dtype(key, {"dtype": dtype_number, "slices": None})


def _numpy_dtype(key: str, entry: dict) -> np.dtype:
    dtype = _DTYPES.get(entry["dtype"])
    if dtype is None or entry["slices"]:
        raise ValueError(f"{key}: only whole numeric tensors can be read or replaced")
    return np.dtype(dtype).newbyteorder("<")


def _check_value(key: str, entry: dict, value) -> None:
    """ValueError unless `value` has the tensor's shape and a dtype that
    casts to the tensor's without loss (uint16 tokens to an int32 tensor)."""
    dtype = _numpy_dtype(key, entry)
    value = np.asarray(value)
    if value.shape != tuple(entry["shape"]) or not np.can_cast(value.dtype, dtype, "safe"):
        raise ValueError(
            f"{key}: the checkpoint holds {dtype.name} {entry['shape']}; the new value is "
            f"{value.dtype} {value.shape}"
        )


def _write_tensor(file, key: str, entry: dict, value) -> tuple[int, int]:
    """Writes `value` in the tensor's dtype, a chunk at a time (no copy of
    the whole tensor in the stored dtype): `(bytes written, masked CRC-32C)`."""
    dtype = _numpy_dtype(key, entry)
    flat = np.ascontiguousarray(value).reshape(-1)
    crc, size = 0, 0
    for start in range(0, flat.size, _CHUNK):
        # A chunk at a time, as an array: the CRC's C extension and the
        # writer take it as it is (no bytes copy; 1.3 s of a 10^8 delta job).
        data = flat[start : start + _CHUNK].astype(dtype, copy=False).view(np.uint8)
        crc = google_crc32c.extend(crc, data)
        file.write(data)
        size += data.size
    return size, mask_crc32c(crc)


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


# The protos, field by field (tensor_bundle.proto) --------------------------


def _fields(data: bytes):
    """`(number, wire type, value, raw field bytes)` of each field."""
    at = 0
    while at < len(data):
        start = at
        tag, at = _varint(data, at)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, at = _varint(data, at)
        elif wire == 2:
            length, at = _varint(data, at)
            value, at = data[at : at + length], at + length
        elif wire == 5:
            (value,), at = struct.unpack("<I", data[at : at + 4]), at + 4
        elif wire == 1:
            (value,), at = struct.unpack("<Q", data[at : at + 8]), at + 8
        else:
            raise ValueError(f"unexpected protobuf wire type {wire} in a checkpoint index")
        yield number, wire, value, data[start:at]


def _parse_header(data: bytes) -> dict:
    """BundleHeaderProto: num_shards (1), endianness (2), version (3, kept as is)."""
    header = {"num_shards": 0, "endianness": 0, "rest": b""}
    for number, _, value, raw in _fields(data):
        if number == 1:
            header["num_shards"] = value
        elif number == 2:
            header["endianness"] = value
        else:
            header["rest"] += raw
    return header


def _header_bytes(header: dict) -> bytes:
    out = _put_varint(1 << 3) + _put_varint(header["num_shards"])
    if header["endianness"]:
        out += _put_varint(2 << 3) + _put_varint(header["endianness"])
    return out + header["rest"]


def _parse_entry(data: bytes) -> dict:
    """BundleEntryProto: dtype (1), shape (2: TensorShapeProto, dims of
    `size` (1)), shard_id (3), offset (4), size (5), crc32c (6, fixed32),
    slices (7, kept as is)."""
    entry = {"dtype": 0, "shape": (), "shape_bytes": None, "shard_id": 0, "offset": 0,
             "size": 0, "crc32c": 0, "slices": b""}  # fmt: skip
    names = {1: "dtype", 3: "shard_id", 4: "offset", 5: "size", 6: "crc32c"}
    for number, _, value, raw in _fields(data):
        if number in names:
            entry[names[number]] = value
        elif number == 2:
            entry["shape_bytes"] = value
            dims = []
            for field, _, dim, _ in _fields(value):
                if field == 2:  # Dim {int64 size = 1; string name = 2}
                    size = next((v for n, _, v, _ in _fields(dim) if n == 1), 0)
                    dims.append(size)
            entry["shape"] = tuple(dims)
        elif number == 7:
            entry["slices"] += raw
    return entry


def _entry_bytes(entry: dict) -> bytes:
    out = b""
    for number, name in ((1, "dtype"), (3, "shard_id"), (4, "offset"), (5, "size")):
        if number == 3:
            out += _length_field(2, entry["shape_bytes"])
        if entry[name]:
            out += _put_varint(number << 3) + _put_varint(entry[name])
    if entry["crc32c"]:
        out += _put_varint((6 << 3) | 5) + struct.pack("<I", entry["crc32c"])
    return out + entry["slices"]


def _length_field(number: int, value: bytes | None) -> bytes:
    if value is None:  # absent (an empty message is written: a scalar's shape)
        return b""
    return _put_varint((number << 3) | 2) + _put_varint(len(value)) + value


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
    if stored != masked_crc32c(table[offset : offset + size + 1]):
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
        out.extend(trailed + struct.pack("<I", masked_crc32c(trailed)))
        return handle

    data = append(_build_block(entries, _RESTART_INTERVAL))
    meta = append(_build_block([], 1))
    index = append(_build_block([(entries[-1][0], data)], 1))
    handles = (meta + index).ljust(_FOOTER_BYTES - 8, b"\x00")
    out += handles + struct.pack("<Q", _MAGIC)
    return bytes(out)
