"""TFRecord framing and `tf.train.Example` parsing without TensorFlow.

A TFRecord file is a sequence of records, each `uint64 length`, `uint32
masked CRC-32C of the length`, `length` bytes of data, `uint32 masked
CRC-32C of the data` (all little-endian). The CRCs are checked when a
CRC-32C implementation is installed (`google-crc32c` or `crcmod`, which the
`apache-beam[gcp]` extra brings); without one only the framing is checked.

`example_class()` returns a message class for `tensorflow.Example` built from
the proto definition at run time in a private descriptor pool: protobuf (a
dependency of Beam) parses it, and TensorFlow is never imported.
"""

from __future__ import annotations

import functools
import struct

_MASK_DELTA = 0xA282EAD8


@functools.cache
def _crc32c():
    """A CRC-32C function of bytes, or None when no implementation is installed."""
    try:
        import google_crc32c

        return google_crc32c.value
    except ImportError:
        pass
    try:
        import crcmod.predefined

        return crcmod.predefined.mkPredefinedCrcFun("crc-32c")
    except ImportError:
        return None


def _masked_crc(data: bytes, crc) -> int:
    value = crc(data)
    return (((value >> 15) | (value << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def read_records(file, path: str):
    """Yields the data of each record of an open TFRecord `file`.

    Raises:
        ValueError: naming `path` and the record when the file is truncated
            or a CRC does not match.
    """
    crc = _crc32c()
    row = 0
    while True:
        header = file.read(12)
        if not header:
            return
        if len(header) < 12:
            raise ValueError(f"{path}: the TFRecord file is truncated (row {row})")
        (length,) = struct.unpack("<Q", header[:8])
        if crc and _masked_crc(header[:8], crc) != struct.unpack("<I", header[8:])[0]:
            raise ValueError(f"{path}: TFRecord length checksum mismatch (row {row})")
        data = file.read(length)
        footer = file.read(4)
        if len(data) < length or len(footer) < 4:
            raise ValueError(f"{path}: the TFRecord file is truncated (row {row})")
        if crc and _masked_crc(data, crc) != struct.unpack("<I", footer)[0]:
            raise ValueError(f"{path}: TFRecord data checksum mismatch (row {row})")
        yield data
        row += 1


@functools.cache
def example_class():
    """The `tensorflow.Example` message class (tensorflow/core/example/*.proto)."""
    from google.protobuf import descriptor_pb2
    from google.protobuf import descriptor_pool
    from google.protobuf import message_factory

    fdp = descriptor_pb2.FileDescriptorProto(
        name="static_keras/tensorflow_example.proto", package="tensorflow", syntax="proto3"
    )
    field = descriptor_pb2.FieldDescriptorProto
    for name, kind in (
        ("BytesList", field.TYPE_BYTES),
        ("FloatList", field.TYPE_FLOAT),
        ("Int64List", field.TYPE_INT64),
    ):
        message = fdp.message_type.add(name=name)
        message.field.add(name="value", number=1, type=kind, label=field.LABEL_REPEATED)
    feature = fdp.message_type.add(name="Feature")
    feature.oneof_decl.add(name="kind")
    for number, (name, kind) in enumerate(
        (("bytes_list", "BytesList"), ("float_list", "FloatList"), ("int64_list", "Int64List")),
        start=1,
    ):
        feature.field.add(
            name=name,
            number=number,
            type=field.TYPE_MESSAGE,
            type_name=f".tensorflow.{kind}",
            label=field.LABEL_OPTIONAL,
            oneof_index=0,
        )
    features = fdp.message_type.add(name="Features")
    entry = features.nested_type.add(name="FeatureEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=field.TYPE_STRING, label=field.LABEL_OPTIONAL)
    entry.field.add(
        name="value",
        number=2,
        type=field.TYPE_MESSAGE,
        type_name=".tensorflow.Feature",
        label=field.LABEL_OPTIONAL,
    )
    features.field.add(
        name="feature",
        number=1,
        type=field.TYPE_MESSAGE,
        type_name=".tensorflow.Features.FeatureEntry",
        label=field.LABEL_REPEATED,
    )
    example = fdp.message_type.add(name="Example")
    example.field.add(
        name="features",
        number=1,
        type=field.TYPE_MESSAGE,
        type_name=".tensorflow.Features",
        label=field.LABEL_OPTIONAL,
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.Example"))
