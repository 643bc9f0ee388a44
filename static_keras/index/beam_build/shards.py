"""Reads one shard of semantic IDs (Parquet, TFRecord or CSV) in validated blocks.

A shard is read whole by one worker, in blocks of rows, so every row keeps
its file and row number (counted from 0, as `StaticIndex.build` counts rows).
Every block goes through the builder's own checks (`validate_sequences`,
`validate_item_ids`), so a bad row fails with the message `StaticIndex.build`
gives, prefixed by the file: `gs://b/ids-3.parquet: \\`sequences\\` holds token
4096 (row 17, position 2), out of range for vocab_size=2048`.

Formats:
- Parquet: one integer column per position (every column but the item id
  column, in file order), or one list-of-integers column (`sequence_field`).
- TFRecord: `tf.train.Example` records with an int64-list feature
  (`sequence_field`, default `"semantic_id"`) and, for item ids, a one-value
  int64 feature (`item_id_field`). Gzip files (`.gz`) are read as such.
- CSV: no header, `L` integers per line, then the item id when
  `item_id_field` is set; blank lines are skipped. Gzip files (`.gz`) too.

Files are opened through Beam's `FileSystems`, so any filesystem Beam
supports works (local, `gs://`, `s3://`, `hdfs://` with their extras).
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np

from static_keras.index.input_checks import validate_item_ids
from static_keras.index.input_checks import validate_sequences

FORMATS = ("parquet", "tfrecord", "csv")
_SUFFIXES = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".tfrecord": "tfrecord",
    ".tfrecords": "tfrecord",
    ".tfr": "tfrecord",
    ".csv": "csv",
}
#: Rows per block: a block is validated, split by partition and sent on at once.
BLOCK_ROWS = 1 << 20


def detect_format(path: str) -> str:
    """The format of `path` from its suffix (a trailing `.gz` is skipped)."""
    name = path.lower().removesuffix(".gz")
    for suffix, kind in _SUFFIXES.items():
        if name.endswith(suffix):
            return kind
    raise ValueError(
        f"{path}: cannot tell the input format from the file name (expected "
        f"{', '.join(sorted(_SUFFIXES))}, optionally .gz); pass `input_format`"
    )


@dataclasses.dataclass(frozen=True)
class ShardSpec:
    """How to read every shard of one build.

    Attributes:
        vocab_size: token ids per position, V.
        length: tokens per sequence, L, or None to take it from the block.
        input_format: one of `FORMATS`, or "auto" (from each file's suffix).
        sequence_field: Parquet list column or TFRecord feature of the IDs.
        item_id_field: Parquet column, TFRecord feature, or (CSV) any
            non-empty string for a last column of item ids; None for none.
        block_rows: rows per block.
    """

    vocab_size: int
    length: int | None
    input_format: str = "auto"
    sequence_field: str | None = None
    item_id_field: str | None = None
    block_rows: int = BLOCK_ROWS


def read_blocks(spec: ShardSpec, path: str):
    """Yields `(first_row, rows, item_ids)` blocks of one shard, validated.

    `rows` is `[n, L]` in the narrow token dtype, `item_ids` int64 `[n]` or
    None. Raises ValueError naming the file and row of the first bad row.
    """
    from apache_beam.io.filesystems import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    kind = detect_format(path) if spec.input_format == "auto" else spec.input_format
    if kind not in FORMATS:
        raise ValueError(f"`input_format` must be 'auto' or one of {FORMATS}. Received {kind!r}")
    # Parquet seeks (its footer comes first): never through a decompressor.
    compression = CompressionTypes.UNCOMPRESSED if kind == "parquet" else CompressionTypes.AUTO
    with FileSystems.open(path, compression_type=compression) as file:
        reader = {"parquet": _parquet, "tfrecord": _tfrecord, "csv": _csv}[kind]
        for first_row, rows, item_ids in reader(spec, path, file):
            if len(rows) == 0:
                continue
            yield first_row, *_validated(spec, path, first_row, rows, item_ids)


def _validated(spec: ShardSpec, path: str, first_row: int, rows, item_ids):
    try:
        rows = validate_sequences(rows, spec.vocab_size, first_row=first_row)
        if spec.length is not None and rows.shape[1] != spec.length:
            raise ValueError(
                "`sequences` is ragged: every sequence must have the same length "
                f"(rows here have {rows.shape[1]} tokens, the first file's have {spec.length})"
            )
        if item_ids is not None:
            item_ids = validate_item_ids(item_ids, len(rows), first_row=first_row)
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None
    return rows, item_ids


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
    from static_keras.index.beam_build.tfrecord import read_records

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
