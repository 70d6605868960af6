"""``tf.train.Example`` records parsed without TensorFlow, by the ``protobuf`` package.

The schema is TensorFlow's ``tensorflow/core/example/{example,feature}.proto``, declared here field for
field in a private descriptor pool (so it never clashes with another copy, e.g. TensorBoard's).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np


@functools.cache
def example_message() -> Any:
    """The ``Example`` message class, built from a descriptor equal to TensorFlow's ``example.proto``."""
    try:  # imported here: only TFF's files need it (the ``datasets`` extra)
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    except ImportError:
        raise ImportError("Reading TFF's SQLite files needs protobuf: pip install 'fl-lightning[datasets]'.") from None
    field = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="fl_lightning/tf_example.proto", package="tensorflow", syntax="proto3")

    def message(name: str, *fields: tuple[str, int, int, int, str | None]) -> descriptor_pb2.DescriptorProto:
        described = proto.message_type.add(name=name)
        for field_name, number, kind, label, type_name in fields:
            added = described.field.add(name=field_name, number=number, type=kind, label=label)
            if type_name is not None:
                added.type_name = type_name
        return described

    repeated, optional = field.LABEL_REPEATED, field.LABEL_OPTIONAL
    message("BytesList", ("value", 1, field.TYPE_BYTES, repeated, None))
    message("FloatList", ("value", 1, field.TYPE_FLOAT, repeated, None))
    message("Int64List", ("value", 1, field.TYPE_INT64, repeated, None))
    feature = message(
        "Feature",
        ("bytes_list", 1, field.TYPE_MESSAGE, optional, ".tensorflow.BytesList"),
        ("float_list", 2, field.TYPE_MESSAGE, optional, ".tensorflow.FloatList"),
        ("int64_list", 3, field.TYPE_MESSAGE, optional, ".tensorflow.Int64List"),
    )
    feature.oneof_decl.add(name="kind")
    for added in feature.field:
        added.oneof_index = 0
    features = message("Features", ("feature", 1, field.TYPE_MESSAGE, repeated, ".tensorflow.Features.FeatureEntry"))
    entry = features.nested_type.add(name="FeatureEntry")
    entry.field.add(name="key", number=1, type=field.TYPE_STRING, label=optional)
    entry.field.add(name="value", number=2, type=field.TYPE_MESSAGE, label=optional, type_name=".tensorflow.Feature")
    entry.options.map_entry = True
    message("Example", ("features", 1, field.TYPE_MESSAGE, optional, ".tensorflow.Features"))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.Example"))


def parse_example(serialized: bytes) -> dict[str, np.ndarray | list[bytes]]:
    """The features of one serialized ``tf.train.Example``: ``float32``/``int64`` arrays, or a list of ``bytes``."""
    example = example_message().FromString(serialized)
    parsed: dict[str, np.ndarray | list[bytes]] = {}
    for key, feature in example.features.feature.items():
        kind = feature.WhichOneof("kind")
        if kind == "float_list":
            parsed[key] = np.asarray(feature.float_list.value, dtype=np.float32)
        elif kind == "int64_list":
            parsed[key] = np.asarray(feature.int64_list.value, dtype=np.int64)
        else:  # bytes_list, or no value (TensorFlow reads that as an empty list)
            parsed[key] = list(feature.bytes_list.value)
    return parsed
