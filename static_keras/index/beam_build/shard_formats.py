"""The readers of each shard format: Parquet, TFRecord, CSV.

Each yields `(first_row, rows, item_ids)` blocks of `spec.block_rows` rows
from an open file (`shards.read_blocks` opens it and validates every
block); a malformed record fails with its file and row.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # shards.py imports this module
    from static_keras.index.beam_build.shards import ShardSpec


def _ragged(path: str, row: int, found: int, expected: int) -> ValueError:
    return ValueError(
        f"{path}: `sequences` is ragged: every sequence must have the same length "
        f"(row {row} has {found} tokens, expected {expected})"
    )


# Parquet ---------------------------------------------------------------------


def _parquet(spec: ShardSpec, path: str, file):
    try:
        import pyarrow as pa
        import pyarrow.parquet as parquet
    except ImportError:
        raise ValueError(
            "reading Parquet needs pyarrow: pip install 'static-keras[beam]'"
        ) from None
    reader = parquet.ParquetFile(file)
    schema = reader.schema_arrow
    names = list(schema.names)
    for name in (spec.sequence_field, spec.item_id_field):
        if name is not None and name not in names:
            raise ValueError(f"{path}: no column {name!r} (columns: {names})")
    if spec.sequence_field is not None:
        columns = [spec.sequence_field]
    else:
        columns = [n for n in names if n != spec.item_id_field]
    as_list = len(columns) == 1 and pa.types.is_list(schema.field(columns[0]).type)
    types = [schema.field(c).type for c in columns]
    value_types = [t.value_type if as_list else t for t in types]
    for name, kind in zip(columns, value_types):
        if not pa.types.is_integer(kind):
            raise ValueError(
                f"{path}: `sequences` must hold integers. Received column {name!r} of type {kind}"
            )
    if not as_list and spec.length is not None and len(columns) != spec.length:
        raise ValueError(
            f"{path}: `sequences` is ragged: every sequence must have the same length "
            f"(row 0 has {len(columns)} tokens in columns {columns}, expected {spec.length})"
        )
    wanted = columns + ([spec.item_id_field] if spec.item_id_field else [])
    first_row = 0
    for batch in reader.iter_batches(batch_size=spec.block_rows, columns=wanted):
        n = batch.num_rows
        if as_list:
            rows = _list_column(path, batch.column(columns[0]), first_row, spec.length)
        else:
            for position, name in enumerate(columns):
                _no_nulls(path, batch.column(name), first_row, f"position {position}")
            rows = np.stack([batch.column(name).to_numpy() for name in columns], axis=1)
        item_ids = None
        if spec.item_id_field:
            column = batch.column(spec.item_id_field)
            if not pa.types.is_integer(column.type):
                raise ValueError(
                    f"{path}: `item_ids` must hold integers. Received column "
                    f"{spec.item_id_field!r} of type {column.type}"
                )
            _no_nulls(path, column, first_row, "item id")
            item_ids = column.to_numpy()
        yield first_row, rows.reshape(n, -1), item_ids
        first_row += n


def _no_nulls(path: str, column, first_row: int, what: str) -> None:
    if column.null_count:
        row = first_row + int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
        raise ValueError(f"{path}: `sequences` holds a null (row {row}, {what})")


def _list_column(path: str, column, first_row: int, length: int | None) -> np.ndarray:
    _no_nulls(path, column, first_row, "the whole sequence")
    lengths = column.value_lengths().to_numpy(zero_copy_only=False)
    expected = length if length is not None else int(lengths[0])
    bad = np.flatnonzero(lengths != expected)
    if bad.size:
        row = int(bad[0])
        raise _ragged(path, first_row + row, int(lengths[row]), expected)
    values = column.flatten()
    if values.null_count:
        row = int(np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))[0])
        raise ValueError(
            f"{path}: `sequences` holds a null (row {first_row + row // expected}, "
            f"position {row % expected})"
        )
    return values.to_numpy().reshape(len(column), expected)


# TFRecord --------------------------------------------------------------------


def _tfrecord(spec: ShardSpec, path: str, file):
    from google.protobuf.message import DecodeError

    from static_keras.index.beam_build.tfrecord import example_class
    from static_keras.index.tfrecord import read_records

    example = example_class()
    name = spec.sequence_field or "semantic_id"
    id_name = spec.item_id_field
    records = read_records(file, path)
    first_row = 0
    length = spec.length
    while True:
        block = list(itertools.islice(records, spec.block_rows))
        if not block:
            return
        values, ids = [], []
        for offset, record in enumerate(block):
            row = first_row + offset
            try:
                features = example.FromString(record).features.feature
            except DecodeError:
                raise ValueError(f"{path}: row {row} is not a tf.train.Example") from None
            tokens = _int64_feature(path, features, name, row, "sequences")
            if length is None:
                length = len(tokens)
            if len(tokens) != length:
                raise _ragged(path, row, len(tokens), length)
            values.extend(tokens)
            if id_name:
                item = _int64_feature(path, features, id_name, row, "item_ids")
                if len(item) != 1:
                    raise ValueError(
                        f"{path}: `item_ids` must hold one id per sequence: feature "
                        f"{id_name!r} of row {row} has {len(item)} values"
                    )
                ids.append(item[0])
        rows = np.array(values, dtype=np.int64).reshape(len(block), length)
        yield first_row, rows, np.array(ids, dtype=np.int64) if id_name else None
        first_row += len(block)


def _int64_feature(path: str, features, name: str, row: int, what: str):
    if name not in features:
        raise ValueError(
            f"{path}: row {row} has no feature {name!r} (features: {sorted(features)})"
        )
    feature = features[name]
    kind = feature.WhichOneof("kind")
    if kind is None:
        return []
    if kind != "int64_list":
        raise ValueError(
            f"{path}: `{what}` must hold integers. Received a {kind} feature {name!r} (row {row})"
        )
    return feature.int64_list.value


# CSV -------------------------------------------------------------------------


def _csv(spec: ShardSpec, path: str, file):
    # readline works on plain and on Beam's decompressing files alike.
    lines = (line.decode("utf-8") for line in iter(file.readline, b""))
    numbered = ((number, line) for number, line in enumerate(lines, start=1) if line.strip())
    with_ids = bool(spec.item_id_field)
    width = None if spec.length is None else spec.length + with_ids
    first_row = 0
    while True:
        block = list(itertools.islice(numbered, spec.block_rows))
        if not block:
            return
        if width is None:
            width = len(block[0][1].split(","))
        values = _parse_csv(path, block, first_row, width, with_ids)
        if with_ids:
            yield first_row, values[:, :-1], values[:, -1]
        else:
            yield first_row, values, None
        first_row += len(block)


def _parse_csv(path: str, block, first_row: int, width: int, with_ids: bool) -> np.ndarray:
    lines = [line for _, line in block]
    try:
        values = np.loadtxt(lines, delimiter=",", dtype=np.int64, ndmin=2, comments=None)
        if values.shape == (len(lines), width):
            return values
    except (ValueError, OverflowError):
        pass
    # Find and name the first bad line (the fast parse only says that one is).
    expected = width - with_ids
    for offset, (number, line) in enumerate(block):
        row, fields = first_row + offset, line.split(",")
        where = f"row {row}, line {number}"
        if len(fields) != width:
            raise ValueError(
                f"{path}: `sequences` is ragged: every sequence must have the same length "
                f"({where} has {len(fields) - with_ids} tokens, expected {expected})"
            )
        for position, field in enumerate(fields):
            try:
                value = int(field)
            except ValueError:
                what = "`item_ids`" if with_ids and position == expected else "`sequences`"
                raise ValueError(
                    f"{path}: {what} must hold integers. Received {field.strip()!r} "
                    f"({where}, position {position})"
                ) from None
            if not -(2**63) <= value < 2**63:
                raise ValueError(
                    f"{path}: `sequences` holds {value} ({where}, position {position}), "
                    "which does not fit in int64"
                )
    raise ValueError(f"{path}: cannot parse rows {first_row}.. as CSV integers")


#: format -> reader.
READERS = {"parquet": _parquet, "tfrecord": _tfrecord, "csv": _csv}
