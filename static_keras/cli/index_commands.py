"""`build-index` and `inspect`: an index from a file of semantic IDs, and
what an index file holds."""

from __future__ import annotations

import argparse
import os
import sys
import time

from static_keras.cli.output import UserError


def load_array(path: str, column: str | None = None):
    """An int array from .npy, .csv (no header) or .parquet (integer columns)."""
    import numpy as np

    if not os.path.isfile(path):
        raise UserError(f"no such file: {path}")
    if path.endswith(".npy"):
        return np.load(path, allow_pickle=False)
    if path.endswith(".csv"):
        return np.loadtxt(path, delimiter=",", dtype=np.int64, ndmin=2)
    if path.endswith(".parquet"):
        try:
            import pyarrow.parquet as parquet
        except ImportError:
            raise UserError(
                "reading .parquet needs pyarrow: pip install 'static-keras[data]'"
            ) from None
        table = parquet.read_table(path)
        names = [column] if column else [n for n in table.column_names if n != "item_id"]
        missing = [n for n in names if n not in table.column_names]
        if missing:
            raise UserError(f"{path}: no column {missing[0]!r} (columns: {table.column_names})")
        return np.stack([table.column(n).to_numpy() for n in names], axis=1)
    raise UserError(f"unsupported input format (expected .npy, .csv or .parquet): {path}")


class _ProgressBar:
    """A one-line progress bar on stderr, for builds of large inputs."""

    def __init__(self, enabled: bool):
        self.enabled = enabled

    def __call__(self, stage: str, fraction: float) -> None:
        if not self.enabled:
            return
        filled = int(30 * fraction)
        end = "\n" if fraction >= 1 else ""
        sys.stderr.write(
            f"\r[{'#' * filled}{'.' * (30 - filled)}] {fraction:4.0%} {stage:<12}{end}"
        )
        sys.stderr.flush()


def dense_levels(text: str):
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an int or 'auto', got {text!r}") from None


def command_build_index(args) -> None:
    if args.runner == "beam":
        _build_index_beam(args)
        return
    from static_keras.index.static_index import StaticIndex

    beam_only = [
        flag
        for flag, value in (
            ("--beam-option", args.beam_option),
            ("--input-format", args.input_format != "auto"),
            ("--sequence-field", args.sequence_field),
            ("--item-id-field", args.item_id_field),
            ("--partition-levels", args.partition_levels != "auto"),
            ("--temp-location", args.temp_location),
        )
        if value
    ]
    if beam_only:
        raise UserError(f"{beam_only[0]} needs --runner beam")
    if len(args.sequences) != 1:
        raise UserError(
            "the in-process runner reads one file; globs and many files need --runner beam"
        )
    sequences = load_array(args.sequences[0])
    item_ids = None
    if args.item_ids:
        item_ids = load_array(args.item_ids, column="item_id")
        if item_ids.ndim == 2 and item_ids.shape[1] == 1:
            item_ids = item_ids[:, 0]
    large = sequences.size >= 10**7 and sys.stderr.isatty()
    progress = _ProgressBar(args.progress or large)
    start = time.perf_counter()
    index = StaticIndex.build(
        sequences,
        args.vocab_size,
        item_ids=item_ids,
        dense_levels=args.dense_levels,
        on_duplicate_item=args.on_duplicate_item,
        headroom=args.headroom,
        progress=progress,
    )
    seconds = time.perf_counter() - start
    index.save(args.out)
    progress("saved", 1.0)
    print(f"built in {seconds:.2f} s, wrote {args.out}")
    _print_stats(index)


def _build_index_beam(args) -> None:
    """`build-index --runner beam`: shards (globs) through an Apache Beam pipeline."""
    if args.item_ids:
        raise UserError(
            "with --runner beam, item ids come from the shards: pass --item-id-field "
            "(a Parquet column, a TFRecord feature, or the last CSV column)"
        )
    try:
        from static_keras.index.beam_build import PipelineFailed
        from static_keras.index.beam_build import build_index_beam
    except ImportError as error:
        raise UserError(
            f"--runner beam needs Apache Beam ({error}): pip install 'static-keras[beam]'"
        ) from None
    start = time.perf_counter()
    try:
        index = build_index_beam(
            args.sequences,
            args.vocab_size,
            args.out,
            input_format=args.input_format,
            sequence_field=args.sequence_field,
            item_id_field=args.item_id_field,
            dense_levels=args.dense_levels,
            on_duplicate_item=args.on_duplicate_item,
            partition_levels=args.partition_levels,
            pipeline_options=args.beam_option or [],
            temp_location=args.temp_location,
            progress=_ProgressBar(args.progress or sys.stderr.isatty()),
        )
    except PipelineFailed as error:
        raise UserError(str(error)) from None
    if args.headroom:  # the pipeline writes the exact layout; laid out again here
        from static_keras.index.headroom import with_headroom

        index = type(index)(*with_headroom(index.layout, index.arrays, args.headroom))
        index.save(args.out)
    seconds = time.perf_counter() - start
    print(f"built with Apache Beam in {seconds:.2f} s, wrote {args.out}")
    _print_stats(index)


_BUILD_HINT = "build an index from it with `static-keras build-index`"


def load_index(path: str):
    """An index file of any kind (semantic IDs or a string set)."""
    from static_keras.index import archive

    if os.path.isfile(path):
        check_is_archive(path)
    try:
        return archive.load(path)
    except (FileNotFoundError, ValueError) as error:
        raise UserError(str(error)) from None


def check_is_archive(path: str) -> None:
    """UserError naming what `path` is when it is not an .npz archive (an
    index is one): a plain array, a Parquet or text file, a Keras model."""
    import zipfile

    import numpy as np

    with open(path, "rb") as file:
        start = file.read(4096)
    what = None
    if start.startswith(b"\x93NUMPY"):
        try:
            array = np.load(path, mmap_mode="r", allow_pickle=False)
        except ValueError as error:
            what = f"it is a .npy file NumPy cannot read ({error})"
        else:
            kind = "int" if array.dtype.kind in "iu" else str(array.dtype)
            axes = {1: "[N]", 2: "[N, L]"}.get(array.ndim, str(list(array.shape)))
            what = f"it holds one {kind} array {axes} (shape {array.shape})"
            if array.ndim == 2 and kind == "int":
                what += f"; {_BUILD_HINT}"
            elif array.ndim == 1 and kind == "int":
                what += (
                    " (item ids?); an index is built from semantic IDs [N, L] with "
                    "`static-keras build-index` (item ids go to its --item-ids)"
                )
    elif start.startswith(b"PAR1"):
        what = f"it is a Parquet file; {_BUILD_HINT}"
    elif start.startswith(b"PK\x03\x04"):
        with zipfile.ZipFile(path) as archive:
            names = set(archive.namelist())
        if {"config.json", "metadata.json"} <= names:
            what = "it is a Keras model (.keras), not an index file"
    elif not start:
        what = "the file is empty"
    elif b"\0" not in start:
        what = f"it is a text file (CSV?); {_BUILD_HINT}"
    else:
        what = "it is not an .npz archive (index files are written by build-index or .save)"
    if what:
        raise UserError(f"{path}: not a static-keras index: {what}")


def command_inspect(args) -> None:
    _print_stats(load_index(args.index))


def _print_stats(index) -> None:
    print(f"kind          {index.kind}")
    if index.kind == "semantic_ids":
        print(f"sequences     {index.num_members:,}")
    else:
        print(f"members       {index.num_members:,}")
        print(f"eos_token_id  {index.eos_token_id}")
    print(f"states        {index.num_states:,}")
    print(f"vocab_size    {index.vocab_size}")
    print(f"length        {index.length}")
    print(f"dense_levels  {index.dense_levels}")
    print(f"step_widths   {list(index.step_widths)}")
    print(f"item_ids      {'yes' if index.has_item_ids else 'no'}")
    print(f"bytes         {index.nbytes:,}")
    for name, array in index.arrays.items():
        print(f"  {name:<14}{str(array.dtype):>8} {str(array.shape):>18} {array.nbytes:>14,}")
    print(f"checksum      {index.checksum}")
