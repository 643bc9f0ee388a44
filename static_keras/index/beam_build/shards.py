"""Reads one shard of semantic IDs (Parquet, TFRecord or CSV) in validated blocks.

A shard is read whole by one worker, in blocks of rows, so every row keeps
its file and row number (counted from 0, as `StaticIndex.build` counts rows).
Every block goes through the builder's own checks (`validate_sequences`,
`validate_item_ids`), so a bad row fails with the message `StaticIndex.build`
gives, prefixed by the file: `gs://b/ids-3.parquet: \\`sequences\\` holds token
4096 (row 17, position 2), out of range for vocab_size=2048`.

Formats (read by `shard_formats.py`):
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

from static_keras.index.beam_build import shard_formats
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
        for first_row, rows, item_ids in shard_formats.READERS[kind](spec, path, file):
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
