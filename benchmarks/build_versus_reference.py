"""Index build, side by side with the reference STATIC code, in one run.

    python -m benchmarks.build_versus_reference --peer ../shared/peers/static-constraint-decoding \\
        [--sizes 1e6 2e7] [--rounds 3]

The same random semantic IDs (L=8, V=2048, d=2, generated in each child
from the seed) built by `StaticIndex.build` and by the reference's
`csr_utils.build_static_index`, each in a fresh process (its peak RSS its
own), the order alternating from round to round. The reference takes sorted
distinct rows: its child runs `np.unique` first, timed apart (`prepare_s`)
and left out of its build time; STATIC's build sorts its raw input itself.
Speedup = the reference's median build over STATIC's. Prints a table and
writes benchmarks/results/build_versus_reference.csv.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.decoding import common  # noqa: E402

VOCAB, LENGTH, DENSE = 2048, 8, 2
STRUCTURES = ("static-keras", "reference")


def measure(config: dict) -> list[dict]:
    """One build in this (child) process."""
    import numpy as np

    n, structure = config["n"], config["structure"]
    rng = np.random.default_rng(config["seed"])
    ids = rng.integers(0, VOCAB, size=(n, LENGTH), dtype=np.uint16)
    prepare = 0.0
    if structure == "reference":
        sys.path.insert(0, os.path.abspath(config["peer"]))
        from static_decoding.csr_utils import build_static_index

        start = time.perf_counter()
        ids = np.unique(ids.astype(np.int32), axis=0)  # the reference's input: sorted, distinct
        prepare = time.perf_counter() - start
        start = time.perf_counter()
        build_static_index(ids, VOCAB, DENSE)
    else:
        from static_keras import StaticIndex

        start = time.perf_counter()
        StaticIndex.build(ids, VOCAB, dense_levels=DENSE)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return [{
        "n": n, "structure": structure, "round": config["round"],
        "build_s": round(seconds, 3), "prepare_s": round(prepare, 3),
        "peak_rss_gb": round(peak / 1e9, 3),
    }]  # fmt: skip


def main(argv=None) -> list[dict]:
    argv = sys.argv[1:] if argv is None else argv
    if common.child_main(measure, argv):
        return []
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer", required=True, help="path of static-constraint-decoding")
    parser.add_argument("--sizes", nargs="+", type=float, default=[1e6, 2e7])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--out", default=os.path.join(common.RESULTS_DIR, "build_versus_reference.csv")
    )
    args = parser.parse_args(argv)
    rows = []
    for n in (int(x) for x in args.sizes):
        for round_ in range(args.rounds):
            order = STRUCTURES if round_ % 2 == 0 else STRUCTURES[::-1]
            for structure in order:
                config = {"n": n, "structure": structure, "round": round_ + 1,
                          "seed": args.seed, "peer": args.peer}  # fmt: skip
                row = common.run_child("benchmarks.build_versus_reference", config)[0]
                rows.append(row)
                print(f"N={n:>11,}  round {round_ + 1}  {structure:<13} build "
                      f"{row['build_s']:8.2f} s  (+ unique {row['prepare_s']:.2f} s)  "
                      f"peak RSS {row['peak_rss_gb']:.2f} GB", flush=True)  # fmt: skip
        medians = {
            s: statistics.median(r["build_s"] for r in rows if r["n"] == n and r["structure"] == s)
            for s in STRUCTURES
        }
        print(f"N={n:>11,}  median build: static-keras {medians['static-keras']:.2f} s, "
              f"reference {medians['reference']:.2f} s: "
              f"{medians['reference'] / medians['static-keras']:.1f}x", flush=True)  # fmt: skip
    common.write_csv(args.out, rows)
    print(common.machine_line())
    print(f"wrote {args.out}")
    return rows


if __name__ == "__main__":
    main()
