"""Index build benchmark: time, peak RSS and index bytes against N.

Random semantic IDs as in the STATIC paper (L=8, V=2048, d=2). Each N runs
in a fresh subprocess so that its peak RSS is its own (input included: the
IDs are generated inside the measured process, as uint16, before the build).

    python benchmarks/build_index.py --sizes 1e6 1e7 2e7

Prints a table and writes benchmarks/results/build_index.csv.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import resource
import subprocess
import sys
import time

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", type=float, default=[1e6, 1e7, 2e7])
    parser.add_argument("--vocab-size", type=int, default=2048)
    parser.add_argument("--length", type=int, default=8)
    parser.add_argument("--dense-levels", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=os.path.join(RESULTS, "build_index.csv"))
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child is not None:
        row = _measure(args.child, args.vocab_size, args.length, args.dense_levels, args.seed)
        print(json.dumps(row))
        return

    rows = []
    for size in args.sizes:
        command = [
            sys.executable, __file__, "--child", str(int(size)),
            "--vocab-size", str(args.vocab_size), "--length", str(args.length),
            "--dense-levels", str(args.dense_levels), "--seed", str(args.seed),
        ]  # fmt: skip
        output = subprocess.run(command, check=True, capture_output=True, text=True)
        rows.append(json.loads(output.stdout.strip().splitlines()[-1]))
        print(_format(rows[-1]), flush=True)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cpus, python {platform.python_version()}"
    )
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
