"""The `static-keras` command line.

User mistakes (a missing file, a wrong shape, a bad vocab size) end in one
line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


class UserError(Exception):
    """A mistake in the command's input: reported in one line."""


def _load_array(path: str):
    import numpy as np

    if not os.path.isfile(path):
        raise UserError(f"no such file: {path}")
    if path.endswith(".npy"):
        return np.load(path, allow_pickle=False)
    if path.endswith(".csv"):
        return np.loadtxt(path, delimiter=",", dtype=np.int64, ndmin=2)
    raise UserError(f"unsupported input format (expected .npy or .csv): {path}")


def _dense_levels(text: str):
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an int or 'auto', got {text!r}") from None


def _cmd_build_index(args) -> None:
    import numpy as np

    from static_keras.index.static_index import StaticIndex

    sequences = _load_array(args.sequences)
    item_ids = None
    if args.item_ids:
        item_ids = _load_array(args.item_ids)
        item_ids = (
            np.asarray(item_ids).reshape(-1)
            if item_ids.ndim == 2 and 1 in item_ids.shape
            else item_ids
        )
    start = time.perf_counter()
    index = StaticIndex.build(
        sequences,
        args.vocab_size,
        item_ids=item_ids,
        dense_levels=args.dense_levels,
        on_duplicate_item=args.on_duplicate_item,
    )
    seconds = time.perf_counter() - start
    index.save(args.out)
    print(f"built in {seconds:.2f} s, wrote {args.out}")
    _print_stats(index)


def _cmd_inspect(args) -> None:
    from static_keras.index.static_index import StaticIndex

    _print_stats(StaticIndex.load(args.index))


def _print_stats(index) -> None:
    print(f"sequences     {index.num_sequences:,}")
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


def _cmd_demo(args) -> None:
    from static_keras.demo import run_demo

    results = run_demo(seed=args.seed)
    if results["constrained_valid"] != 1.0 or not results["item_ids_match"]:
        raise SystemExit("demo failed: constrained decoding returned an invalid item")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="static-keras",
        description="STATIC constrained decoding for Keras 3 and TensorFlow Serving.",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser(
        "demo", help="build an index and decode with a Keras decoder, with and without it"
    )
    demo.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    demo.set_defaults(run=_cmd_demo)

    build = commands.add_parser("build-index", help="compile sequences into an index file")
    build.add_argument("sequences", help="int array [N, L] of semantic IDs (.npy or .csv)")
    build.add_argument("--vocab-size", type=int, required=True, help="token ids per level, V")
    build.add_argument("--out", required=True, help="index file to write (.npz)")
    build.add_argument("--item-ids", help="int array [N] of catalogue ids (.npy or .csv)")
    build.add_argument(
        "--dense-levels",
        default="auto",
        type=_dense_levels,
        help="steps served by dense masks (int or 'auto', the default)",
    )
    build.add_argument(
        "--on-duplicate-item",
        default="error",
        choices=["error", "first", "last"],
        help="one semantic ID with two item ids: fail, or keep the first/last",
    )
    build.set_defaults(run=_cmd_build_index)

    inspect = commands.add_parser("inspect", help="print an index file's statistics")
    inspect.add_argument("index", help="index file written by build-index or StaticIndex.save")
    inspect.set_defaults(run=_cmd_inspect)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.run(args)
    except (UserError, ValueError, FileNotFoundError) as error:
        print(f"static-keras: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
