"""Index build benchmark: time, peak RSS and index bytes against N.

Random semantic IDs as in the STATIC paper (L=8, V=2048, d=2). Each N runs
in a fresh subprocess so that its peak RSS is its own (input included: the
IDs are generated inside the measured process, as uint16, before the build).

    python -m benchmarks.build_index --sizes 1e6 1e7 2e7

Prints a table and writes benchmarks/results/build_index.csv.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time

from benchmarks.decoding.common import RESULTS_DIR
from benchmarks.decoding.common import child_main
from benchmarks.decoding.common import machine_line
from benchmarks.decoding.common import size_sweep
from benchmarks.decoding.common import write_csv


def _measure(n: int, vocab_size: int, length: int, dense_levels: int, seed: int) -> dict:
    import numpy as np

    from static_keras import StaticIndex

    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab_size, size=(n, length), dtype=np.uint16)
    rss_input = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    start = time.perf_counter()
    index = StaticIndex.build(ids, vocab_size, dense_levels=dense_levels)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        "n": n,
        "vocab_size": vocab_size,
        "length": length,
        "dense_levels": index.dense_levels,
        "build_s": round(seconds, 3),
        "peak_rss_gb": round(peak / 1e9, 3),
        "input_rss_gb": round(rss_input / 1e9, 3),
        "index_gb": round(index.nbytes / 1e9, 4),
        "num_states": index.num_states,
        "step_widths": " ".join(map(str, index.step_widths)),
        # The paper's memory model: 12 bytes per trie node + dense tables.
        "paper_model_gb": round((12 * index.num_states + 4 * vocab_size**2) / 1e9, 3),
    }


def _child(config: dict) -> list[dict]:
    keys = ("n", "vocab_size", "length", "dense_levels", "seed")
    return [_measure(*(config[key] for key in keys))]


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if child_main(_child, argv):
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", type=float, default=[1e6, 1e7, 2e7])
    parser.add_argument("--vocab-size", type=int, default=2048)
    parser.add_argument("--length", type=int, default=8)
    parser.add_argument("--dense-levels", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=os.path.join(RESULTS_DIR, "build_index.csv"))
    args = parser.parse_args(argv)
    config = {key: getattr(args, key) for key in ("vocab_size", "length", "dense_levels", "seed")}
    rows = size_sweep("benchmarks.build_index", args.sizes, config, _format)
    write_csv(args.out, rows)
    print(machine_line())
    print(f"wrote {args.out}")


def _format(row: dict) -> str:
    return (
        f"N={row['n']:>10,}  build {row['build_s']:7.2f} s  peak RSS "
        f"{row['peak_rss_gb']:6.2f} GB (input {row['input_rss_gb']:.2f})  index "
        f"{row['index_gb']:.3f} GB  paper model {row['paper_model_gb']:.3f} GB  "
        f"B_t {row['step_widths']}"
    )


if __name__ == "__main__":
    main()
