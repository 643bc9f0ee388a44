"""`tf.train.Example` parsing without TensorFlow (the framing, with its CRCs
checked, is `static_keras.index.tfrecord`).

`example_class()` returns a message class for `tensorflow.Example` built from
the proto definition at run time in a private descriptor pool: protobuf (a
dependency of Beam) parses it, and TensorFlow is never imported.
"""

from __future__ import annotations

import functools


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
