"""Index build benchmark: time, peak RSS and index bytes against N.

Random semantic IDs as in the STATIC paper (L=8, V=2048, d=2). Each N runs
in a fresh subprocess so that its peak RSS is its own (input included: the
IDs are generated inside the measured process, as uint16, before the build).

    python -m benchmarks.build_index --sizes 1e6 1e7 2e7

Prints a table and writes benchmarks/results/build_index.csv.
"""

from __future__ import annotations

import resource
import time

from benchmarks.decoding.common import index_size_sweep


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


def main(argv=None) -> None:
    index_size_sweep(
        "benchmarks.build_index",
        __doc__,
        _measure,
        _format,
        (1e6, 1e7, 2e7),
        "build_index.csv",
        argv,
    )


def _format(row: dict) -> str:
    return (
        f"N={row['n']:>10,}  build {row['build_s']:7.2f} s  peak RSS "
        f"{row['peak_rss_gb']:6.2f} GB (input {row['input_rss_gb']:.2f})  index "
        f"{row['index_gb']:.3f} GB  paper model {row['paper_model_gb']:.3f} GB  "
        f"B_t {row['step_widths']}"
    )


if __name__ == "__main__":
    main()
