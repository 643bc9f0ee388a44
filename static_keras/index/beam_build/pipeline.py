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
import os
import re

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.options.pipeline_options import StandardOptions

from static_keras.index.beam_build import partitions
from static_keras.index.beam_build import staging as staging_files
from static_keras.index.beam_build import transforms
from static_keras.index.beam_build.merge import merge_tails
from static_keras.index.beam_build.merge import plan_layout
from static_keras.index.beam_build.shards import ShardSpec
from static_keras.index.beam_build.shards import read_blocks
from static_keras.index.beam_build.staging import PipelineFailed
from static_keras.index.builder import DEFAULT_DENSE_BUDGET_BYTES
from static_keras.index.builder import resolve_dense_levels
from static_keras.index.input_checks import check_duplicate_policy
from static_keras.index.input_checks import check_vocab_size
from static_keras.index.static_index import StaticIndex


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
    staging = staging_files.make_staging(temp_location, pipeline_options, out)
    plan = transforms.Plan(spec, p, on_duplicate_item, staging, shuffle)
    try:
        report(f"reading 0/{len(files)} files", 0.0)
        with staging_files.Watcher(plan, len(files), report):
            _run(plan, files, pipeline_options)
        index = _assembled(
            staging, len(files), spec.length, p, report, vocab_size=vocab_size,
            dense_levels=dense_levels, dense_budget_bytes=dense_budget_bytes,
            has_item_ids=bool(item_id_field),
        )  # fmt: skip
        report("writing", 0.95)
        index.save(out)
        report("saved", 1.0)
        return index
    finally:
        staging_files.remove(staging)


def _assembled(staging, num_files, length, p, report, **layout_options) -> StaticIndex:
    """The `StaticIndex` of the pipeline's staged output: the partitions'
    summaries give the layout (`layout_options`: `plan_layout`'s settings),
    then their tails merge into its arrays."""
    staging_files.raise_first_error(staging)
    keys, counts, widths = staging_files.read_summaries(staging, num_files, length)
    layout = plan_layout(keys, counts, widths, p=p, **layout_options)

    def read_tail(j):
        with FileSystems.open(staging_files.part_path(staging, keys[j])) as file:
            return partitions.from_bytes(file.read())

    def merged(j):
        if j % max(1, len(keys) // 50) == 0 or j + 1 == len(keys):
            report(f"merging {j + 1}/{len(keys)}", 0.8 + 0.15 * (j + 1) / len(keys))

    return StaticIndex(layout, merge_tails(layout, keys, counts, read_tail, p, progress=merged))


# The pipeline ----------------------------------------------------------------


def _run(plan: transforms.Plan, files: list[str], options: PipelineOptions) -> None:
    pipeline = beam.Pipeline(options=options)
    read = (
        pipeline
        | "Files" >> beam.Create(list(enumerate(files)))
        | "SpreadFiles" >> beam.Reshuffle()
        | "ReadShards" >> beam.ParDo(transforms.ReadShard(plan)).with_outputs("errors", main="rows")
    )
    built = (
        read.rows
        | "GroupByPartition" >> beam.GroupByKey()
        | "BuildTails"
        >> beam.ParDo(transforms.BuildTail(plan)).with_outputs("errors", main="summaries")
    )
    _ = (
        built.summaries
        | "CollectSummaries" >> beam.combiners.ToList()
        | "WriteSummaries" >> beam.Map(staging_files.write_summaries, plan.staging)
    )
    _ = (
        (read.errors, built.errors)
        | "AllErrors" >> beam.Flatten()
        | "CollectErrors" >> beam.combiners.ToList()
        | "WriteErrors" >> beam.Map(staging_files.write_errors, plan.staging)
    )
    try:
        result = pipeline.run()
        state = result.wait_until_finish()
    except Exception as error:
        raise PipelineFailed(f"The Beam pipeline failed; no index was written. {_describe(error)}")
    if state is not None and str(state) not in ("DONE", "PipelineState.DONE"):
        raise PipelineFailed(f"The Beam pipeline ended in state {state}; no index was written")


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


def _describe(error: Exception) -> str:
    """One line: the failing step (when the runner names it) and the error."""
    text = str(error)
    step = re.findall(r"while running '([^']+)'", text)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    where = f"Step {step[-1].split('/')[0]!r} failed: " if step else ""
    return f"{where}{type(error).__name__}: {last[:500]}"
