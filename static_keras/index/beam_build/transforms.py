"""The Beam steps of an index build: read shards, and build each partition's tail.

`ReadShard` reads a shard whole on one worker, checks each block, sorts it
by partition key (the first `p` tokens) and emits its rows per key, or,
with the staged shuffle, stages the sorted block and emits `Slice`
references to it; `BuildTail` compiles one partition's rows to its tail and
stages it. Bad rows go to the "errors" output, never stop the pipeline.
`Plan` is what every worker needs to know (pickled into the DoFns).
"""

from __future__ import annotations

import dataclasses
import typing

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems

from static_keras.index.beam_build import partitions
from static_keras.index.beam_build import staging
from static_keras.index.beam_build.shards import ShardSpec
from static_keras.index.beam_build.shards import read_blocks
from static_keras.index.layout import token_dtype


@dataclasses.dataclass(frozen=True)
class Plan:
    """What every worker needs to know (pickled into the DoFns)."""

    spec: ShardSpec
    partition_levels: int
    on_duplicate_item: str
    staging: str
    shuffle: str


class ReadShard(beam.DoFn):
    """(file index, path) -> (key, rows of that key), per block; bad rows to 'errors'.

    With `shuffle="staged"` a block is written to the staging folder sorted
    by key, and only `Slice` references to its runs go through the shuffle.
    """

    def __init__(self, plan: Plan):
        self.plan = plan

    def process(self, element):
        file_index, path = element
        spec, p, staged = self.plan.spec, self.plan.partition_levels, self.plan.shuffle == "staged"
        seen, num_rows = set(), 0
        try:
            for block, (first_row, rows, item_ids) in enumerate(read_blocks(spec, path)):
                order = None
                if item_ids is not None:
                    if first_row + len(rows) > 2**partitions.ROW_BITS:
                        raise ValueError(f"{path}: more than 2**40 rows in one file")
                    order = np.arange(first_row, first_row + len(rows), dtype=np.int64)
                    order += file_index << partitions.ROW_BITS
                num_rows += len(rows)
                keys, rows, item_ids, order = partitions.sort_block(
                    rows, item_ids, order, spec.vocab_size, p
                )
                if staged:
                    name = f"block-{file_index:09d}-{block:06d}.bin"
                    block_path = FileSystems.join(self.plan.staging, name)
                    parts = [rows] + ([item_ids, order] if item_ids is not None else [])
                    staging.write_bytes(block_path, b"".join(a.tobytes() for a in parts))
                for key, start, stop in partitions.key_runs(keys):
                    seen.add(key)
                    if staged:
                        yield key, Slice(block_path, len(rows), start, stop)
                    elif item_ids is None:
                        yield key, (rows[start:stop], None, None)
                    else:
                        yield key, (rows[start:stop], item_ids[start:stop], order[start:stop])
        except ValueError as error:
            yield beam.pvalue.TaggedOutput("errors", (0, file_index, str(error)))
        # A marker: this file's row count (checked against the partitions'),
        # then its keys (for the progress display).
        staging.write_bytes(
            FileSystems.join(self.plan.staging, f"read-{file_index:09d}.npy"),
            staging.npy_bytes(np.array([num_rows] + sorted(seen), dtype=np.int64)),
        )


class Slice(typing.NamedTuple):
    """Rows `[start, stop)` of a staged block of `rows` rows."""

    path: str
    rows: int
    start: int
    stop: int

    def load(self, spec: ShardSpec):
        """`(rows, item_ids, order)` of the slice, read from the staged block."""
        dtype = token_dtype(spec.vocab_size)
        row_bytes = spec.length * dtype.itemsize
        count = self.stop - self.start
        with FileSystems.open(self.path) as file:
            file.seek(self.start * row_bytes)
            rows = np.frombuffer(file.read(count * row_bytes), dtype=dtype)
            if not spec.item_id_field:
                return rows.reshape(count, spec.length), None, None
            ids_at = self.rows * row_bytes
            file.seek(ids_at + self.start * 8)
            item_ids = np.frombuffer(file.read(count * 8), dtype=np.int64)
            file.seek(ids_at + self.rows * 8 + self.start * 8)
            order = np.frombuffer(file.read(count * 8), dtype=np.int64)
        return rows.reshape(count, spec.length), item_ids, order


class BuildTail(beam.DoFn):
    """(key, chunks) -> staged tail and (key, counts, widths); errors to 'errors'."""

    def __init__(self, plan: Plan):
        self.plan = plan

    def process(self, element):
        key, chunks = element
        plan = self.plan
        chunks = (c.load(plan.spec) if isinstance(c, Slice) else c for c in chunks)
        try:
            tail = partitions.build_tail(
                chunks, plan.spec.vocab_size, plan.partition_levels, plan.on_duplicate_item
            )
        except ValueError as error:
            yield beam.pvalue.TaggedOutput("errors", (1, key, str(error)))
            return
        staging.write_bytes(staging.part_path(plan.staging, key), partitions.to_bytes(tail))
        yield key, tail["counts"], tail["widths"], int(tail["rows"])
