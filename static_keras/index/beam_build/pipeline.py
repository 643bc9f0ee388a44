"""`build_index_beam`: a `StaticIndex` from sharded files, built by Apache Beam.

The pipeline reads every shard whole on one worker (`shards.py`), checks
each block with the builder's validation, splits it by partition key (the
first `p` tokens) and groups rows by key, Beam's shuffle. Each partition is
then compiled to its tail with the builder's functions (`partitions.py`) and
staged as one small `.npz` under a staging folder (on any Beam filesystem;
beside the output by default). The launching process then plans the layout
from the partitions' counts and merges the tails in key order into the
arrays of one index (`merge.py`), which it saves with `StaticIndex.save`:
written to a temporary file, then renamed. Nothing is written to `out`
unless every step succeeded.

Bad rows do not stop the pipeline mid-way (a runner retries a failing
bundle; a bad row would fail every retry): they are collected, and the
build then fails with the first one, naming its file and row, as a
`ValueError` with `StaticIndex.build`'s message. A pipeline that fails for
any other reason (a worker killed, out of memory) raises `PipelineFailed`,
naming the step when the runner says which one.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import tempfile
import threading
import typing
import uuid

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import GoogleCloudOptions
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.options.pipeline_options import StandardOptions

from static_keras.index.beam_build import partitions
from static_keras.index.beam_build.merge import merge_tails
from static_keras.index.beam_build.merge import plan_layout
from static_keras.index.beam_build.shards import ShardSpec
from static_keras.index.beam_build.shards import read_blocks
from static_keras.index.builder import DEFAULT_DENSE_BUDGET_BYTES
from static_keras.index.builder import resolve_dense_levels
from static_keras.index.input_checks import check_duplicate_policy
from static_keras.index.input_checks import check_vocab_size
from static_keras.index.layout import token_dtype
from static_keras.index.static_index import StaticIndex


class PipelineFailed(RuntimeError):
    """The Beam pipeline did not finish; no index was written."""


@dataclasses.dataclass(frozen=True)
class _Plan:
    """What every worker needs to know (pickled into the DoFns)."""

    spec: ShardSpec
    partition_levels: int
    on_duplicate_item: str
    staging: str
    shuffle: str


def build_index_beam(
    sources,
    vocab_size: int,
    out: str | os.PathLike,
    *,
    input_format: str = "auto",
    sequence_field: str | None = None,
    item_id_field: str | None = None,
    dense_levels: int | str = "auto",
    on_duplicate_item: str = "error",
    dense_budget_bytes: int = DEFAULT_DENSE_BUDGET_BYTES,
    partition_levels: int | str = "auto",
    pipeline_options=None,
    temp_location: str | None = None,
    shuffle: str = "auto",
    progress=None,
) -> StaticIndex:
    """Builds an index from sharded files with Apache Beam and saves it to `out`.

    The result equals `StaticIndex.build` on all rows of the files taken in
    sorted path order, array for array (item ids with `"first"`/`"last"`
    follow that order). Runs on Beam's local runner by default; other
    runners (Dataflow, Flink, Spark) by `pipeline_options`.

    Args:
        sources: str or list of str. Paths or globs on any Beam filesystem.
        vocab_size: int. Number of token ids, V.
        out: local path of the index file to write.
        input_format: `"parquet"`, `"tfrecord"`, `"csv"`, or `"auto"` (from
            each file's suffix). Defaults to `"auto"`.
        sequence_field: Parquet list column or TFRecord int64-list feature of
            the IDs. Defaults to every Parquet column but the item ids, and
            to the feature `"semantic_id"`.
        item_id_field: Parquet column or TFRecord feature of the item ids;
            for CSV any name: the last column. Defaults to None (no ids).
        dense_levels: int or `"auto"`, as in `StaticIndex.build`; `"auto"`
            decides from the global level sizes. Defaults to `"auto"`.
        on_duplicate_item: `"error"`, `"first"` or `"last"`, as in
            `StaticIndex.build`. Defaults to `"error"`.
        dense_budget_bytes: int. Memory cap of `"auto"`. Defaults to 64 MiB.
        partition_levels: int in `[1, L]` or `"auto"`: tokens in a partition
            key. `"auto"` takes the fewest that allow 256 keys. A worker
            holds its largest partition. Defaults to `"auto"`.
        pipeline_options: `PipelineOptions`, or a list of flags such as
            `["--direct_num_workers=2", "--direct_running_mode=multi_processing"]`.
            Defaults to the in-process direct runner.
        temp_location: folder for staged partitions (any Beam filesystem;
            workers write it, this process reads it). Defaults to the
            pipeline's `--temp_location`, else a folder beside `out`.
        shuffle: how rows reach their partition. `"rows"`: through Beam's
            shuffle (Dataflow, Flink and Spark spill it to disk). `"staged"`:
            each block is written, sorted by key, to the staging folder, and
            the shuffle carries only references to its runs; memory then
            stays at a block per reader and a partition per builder on the
            local runner too, whose shuffle is held in memory. `"auto"`:
            staged on the direct runner, rows elsewhere. Defaults to `"auto"`.
        progress: optional callable `(stage: str, fraction: float)`.

    Returns:
        The `StaticIndex` that was saved.

    Raises:
        ValueError: naming the problem with the input (and its file and row).
        PipelineFailed: when the pipeline does not finish.

    Example:

    >>> import os, tempfile
    >>> import numpy as np
    >>> folder = tempfile.mkdtemp()
    >>> for shard, rows in enumerate([[[1, 2], [1, 3]], [[0, 2], [1, 2]]]):
    ...     np.savetxt(f"{folder}/ids-{shard}.csv", rows, fmt="%d", delimiter=",")
    >>> index = build_index_beam(f"{folder}/ids-*.csv", 4, f"{folder}/index.npz")
    >>> index.num_sequences, index.step_widths
    (3, (2, 2))
    >>> StaticIndex.load(f"{folder}/index.npz").checksum == index.checksum
    True
    >>> import shutil; shutil.rmtree(folder)
    """
    report = progress or (lambda stage, fraction: None)
    check_duplicate_policy(on_duplicate_item)
    vocab_size = check_vocab_size(vocab_size)
    out = os.fspath(out)
    files = _match([sources] if isinstance(sources, (str, os.PathLike)) else list(sources))
    spec = ShardSpec(vocab_size, None, input_format, sequence_field, item_id_field)
    spec = dataclasses.replace(spec, length=_peek_length(spec, files))
    p = partitions.choose_partition_levels(vocab_size, spec.length, partition_levels)
    if dense_levels != "auto":  # fail before the pipeline runs
        resolve_dense_levels(dense_levels, vocab_size, [1] * (spec.length + 1), dense_budget_bytes)
    if not isinstance(pipeline_options, PipelineOptions):
        pipeline_options = PipelineOptions(list(pipeline_options or []))
    shuffle = _choose_shuffle(shuffle, pipeline_options)
    staging = _make_staging(temp_location, pipeline_options, out)
    plan = _Plan(spec, p, on_duplicate_item, staging, shuffle)
    try:
        report(f"reading 0/{len(files)} files", 0.0)
        with _Watcher(plan, len(files), report):
            _run(plan, files, pipeline_options)
        _raise_first_error(staging)
        keys, counts, widths = _read_summaries(staging, len(files), spec.length)
        layout = plan_layout(
            keys,
            counts,
            widths,
            vocab_size=vocab_size,
            p=p,
            dense_levels=dense_levels,
            dense_budget_bytes=dense_budget_bytes,
            has_item_ids=bool(item_id_field),
        )

        def read_tail(j):
            with FileSystems.open(_part_path(staging, keys[j])) as file:
                return partitions.from_bytes(file.read())

        def merged(j):
            if j % max(1, len(keys) // 50) == 0 or j + 1 == len(keys):
                report(f"merging {j + 1}/{len(keys)}", 0.8 + 0.15 * (j + 1) / len(keys))

        arrays = merge_tails(layout, keys, counts, read_tail, p, progress=merged)
        index = StaticIndex(layout, arrays)
        del arrays
        report("writing", 0.95)
        index.save(out)
        report("saved", 1.0)
        return index
    finally:
        _remove(staging)


# The pipeline ----------------------------------------------------------------


def _run(plan: _Plan, files: list[str], options: PipelineOptions) -> None:
    pipeline = beam.Pipeline(options=options)
    read = (
        pipeline
        | "Files" >> beam.Create(list(enumerate(files)))
        | "SpreadFiles" >> beam.Reshuffle()
        | "ReadShards" >> beam.ParDo(_ReadShard(plan)).with_outputs("errors", main="rows")
    )
    built = (
        read.rows
        | "GroupByPartition" >> beam.GroupByKey()
        | "BuildTails" >> beam.ParDo(_BuildTail(plan)).with_outputs("errors", main="summaries")
    )
    _ = (
        built.summaries
        | "CollectSummaries" >> beam.combiners.ToList()
        | "WriteSummaries" >> beam.Map(_write_summaries, plan.staging)
    )
    _ = (
        (read.errors, built.errors)
        | "AllErrors" >> beam.Flatten()
        | "CollectErrors" >> beam.combiners.ToList()
        | "WriteErrors" >> beam.Map(_write_errors, plan.staging)
    )
    try:
        result = pipeline.run()
        state = result.wait_until_finish()
    except Exception as error:
        raise PipelineFailed(f"The Beam pipeline failed; no index was written. {_describe(error)}")
    if state is not None and str(state) not in ("DONE", "PipelineState.DONE"):
        raise PipelineFailed(f"The Beam pipeline ended in state {state}; no index was written")


class _ReadShard(beam.DoFn):
    """(file index, path) -> (key, rows of that key), per block; bad rows to 'errors'.

    With `shuffle="staged"` a block is written to the staging folder sorted
    by key, and only `_Slice` references to its runs go through the shuffle.
    """

    def __init__(self, plan: _Plan):
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
                    _write_bytes(block_path, b"".join(a.tobytes() for a in parts))
                for key, start, stop in partitions.key_runs(keys):
                    seen.add(key)
                    if staged:
                        yield key, _Slice(block_path, len(rows), start, stop)
                    elif item_ids is None:
                        yield key, (rows[start:stop], None, None)
                    else:
                        yield key, (rows[start:stop], item_ids[start:stop], order[start:stop])
        except ValueError as error:
            yield beam.pvalue.TaggedOutput("errors", (0, file_index, str(error)))
        # A marker: this file's row count (checked against the partitions'),
        # then its keys (for the progress display).
        _write_bytes(
            FileSystems.join(self.plan.staging, f"read-{file_index:09d}.npy"),
            _npy_bytes(np.array([num_rows] + sorted(seen), dtype=np.int64)),
        )


class _Slice(typing.NamedTuple):
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


class _BuildTail(beam.DoFn):
    """(key, chunks) -> staged tail and (key, counts, widths); errors to 'errors'."""

    def __init__(self, plan: _Plan):
        self.plan = plan

    def process(self, element):
        key, chunks = element
        plan = self.plan
        chunks = (c.load(plan.spec) if isinstance(c, _Slice) else c for c in chunks)
        try:
            tail = partitions.build_tail(
                chunks, plan.spec.vocab_size, plan.partition_levels, plan.on_duplicate_item
            )
        except ValueError as error:
            yield beam.pvalue.TaggedOutput("errors", (1, key, str(error)))
            return
        _write_bytes(_part_path(plan.staging, key), partitions.to_bytes(tail))
        yield key, tail["counts"], tail["widths"], int(tail["rows"])


def _write_summaries(summaries, staging: str) -> None:
    summaries = sorted(summaries, key=lambda s: s[0])
    keys = np.array([s[0] for s in summaries], dtype=np.int64)
    counts = np.array([s[1] for s in summaries], dtype=np.int64)
    widths = np.array([s[2] for s in summaries], dtype=np.int64)
    rows = np.array([s[3] for s in summaries], dtype=np.int64)
    arrays = {"keys": keys, "counts": counts, "widths": widths, "rows": rows}
    _write_bytes(FileSystems.join(staging, "summaries.npz"), partitions.to_bytes(arrays))


def _write_errors(errors, staging: str) -> None:
    text = json.dumps(sorted(errors))
    _write_bytes(FileSystems.join(staging, "errors.json"), text.encode())


# The launching side ----------------------------------------------------------


def _match(patterns: list) -> list[str]:
    # Local paths absolute: workers may run elsewhere in the tree.
    patterns = [os.fspath(p) for p in patterns]
    patterns = [p if "://" in p else os.path.abspath(p) for p in patterns]
    if not patterns:
        raise ValueError("`sources` is empty: pass at least one path or glob")
    files = set()
    for pattern, result in zip(patterns, FileSystems.match(patterns)):
        found = [m.path for m in result.metadata_list]
        if not found:
            raise ValueError(f"No input file matches {pattern!r}")
        files.update(found)
    return sorted(files)


def _peek_length(spec: ShardSpec, files: list[str]) -> int:
    """L, from the first row of the first file that has one."""
    first = dataclasses.replace(spec, block_rows=1)
    for path in files:
        for _, rows, _ in read_blocks(first, path):
            return int(rows.shape[1])
    raise ValueError(
        "`sequences` is empty: the valid set needs at least one sequence of at "
        f"least one token. Received 0 rows in {len(files)} files"
    )


def _choose_shuffle(shuffle: str, options: PipelineOptions) -> str:
    if shuffle not in ("auto", "rows", "staged"):
        raise ValueError(
            f"`shuffle` must be 'auto', 'rows' or 'staged'. Received: shuffle={shuffle!r}"
        )
    if shuffle != "auto":
        return shuffle
    runner = options.view_as(StandardOptions).runner
    local = runner is None or "direct" in str(runner).lower()
    return "staged" if local else "rows"


def _make_staging(temp_location, options: PipelineOptions, out: str) -> str:
    temp_location = temp_location or options.view_as(GoogleCloudOptions).temp_location
    if temp_location:
        staging = FileSystems.join(temp_location, f"static-keras-{uuid.uuid4().hex}")
        FileSystems.mkdirs(staging)
        return staging
    directory = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"No directory {directory!r} to write {out!r} into")
    return tempfile.mkdtemp(prefix=".static-keras-beam-", dir=directory)


def _part_path(staging: str, key) -> str:
    return FileSystems.join(staging, f"part-{int(key):019d}.npz")


def _raise_first_error(staging: str) -> None:
    """ValueError of the first bad file (in path order), else of the first partition."""
    with FileSystems.open(FileSystems.join(staging, "errors.json")) as file:
        errors = json.loads(file.read().decode())
    if not errors:
        return
    kind, _, message = errors[0]
    others = sum(1 for e in errors if e[0] == kind) - 1
    if others:
        message += f" ({others} more {'files' if kind == 0 else 'partitions'} failed likewise)"
    raise ValueError(message)


def _read_summaries(staging: str, num_files: int, length: int):
    with FileSystems.open(FileSystems.join(staging, "summaries.npz")) as file:
        summary = partitions.from_bytes(file.read())
    read = sum(int(_read_npy(path)[0]) for path in _list(FileSystems.join(staging, "read-*")))
    built = int(summary["rows"].sum())
    if read != built:  # a runner that lost or repeated work
        raise PipelineFailed(
            f"The Beam pipeline read {read} rows but its partitions hold {built}; "
            "no index was written"
        )
    if summary["keys"].size == 0:
        raise ValueError(
            "`sequences` is empty: the valid set needs at least one sequence of at "
            f"least one token. Received 0 rows in {num_files} files"
        )
    return summary["keys"], summary["counts"].reshape(-1, length + 1), summary["widths"]


def _list(pattern: str) -> list[str]:
    try:
        return [m.path for m in FileSystems.match([pattern])[0].metadata_list]
    except Exception:  # a folder being written or removed: try again later
        return []


def _remove(staging: str) -> None:
    paths = _list(FileSystems.join(staging, "*"))
    try:
        if paths:
            FileSystems.delete(paths)
        FileSystems.delete([staging])
    except Exception:  # nothing left to delete, or a filesystem without folders
        pass


def _write_bytes(path: str, data: bytes) -> None:
    with FileSystems.create(path) as file:
        file.write(data)


def _read_npy(path: str) -> np.ndarray:
    with FileSystems.open(path) as file:
        return np.load(io.BytesIO(file.read()), allow_pickle=False)


def _npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def _describe(error: Exception) -> str:
    """One line: the failing step (when the runner names it) and the error."""
    text = str(error)
    step = re.findall(r"while running '([^']+)'", text)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    where = f"Step {step[-1].split('/')[0]!r} failed: " if step else ""
    return f"{where}{type(error).__name__}: {last[:500]}"


class _Watcher:
    """Reports progress from the markers workers leave in the staging folder."""

    def __init__(self, plan: _Plan, num_files: int, report, interval: float = 0.5):
        self.plan, self.num_files, self.report = plan, num_files, report
        self.interval = interval
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.keys: dict[str, np.ndarray] = {}

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        if exc[0] is None:
            self._poll()

    def _loop(self):
        while not self.stop.wait(self.interval):
            self._poll()

    def _poll(self):
        staging = self.plan.staging
        read = _list(FileSystems.join(staging, "read-*"))
        if len(read) < self.num_files:
            self.report(
                f"reading {len(read)}/{self.num_files} files", 0.4 * len(read) / self.num_files
            )
            return
        for path in read:
            if path not in self.keys:
                try:
                    self.keys[path] = _read_npy(path)[1:]
                except Exception:  # still being written
                    return
        total = len(np.unique(np.concatenate(list(self.keys.values()))))
        built = len(_list(FileSystems.join(staging, "part-*")))
        self.report(f"partitions {built}/{total}", 0.4 + 0.4 * built / max(total, 1))
