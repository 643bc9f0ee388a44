"""Compile time and peak memory with one long member added to a set.

    python -m benchmarks.strings.long_member [--vocab PATH ...] [--k 10000]

The set: K product paths (`string_sets.product_paths`, about 50 characters),
then the same set plus one member of 2,000, 20,000 and 50,000 characters
(product-path words joined, so real tokens of every length apply). Compile
time is the median of `--repeats` compiles after a warm-up, in this process;
peak memory is measured in a fresh process per set (resident-set high-water
mark of the compile, `ours_memory`). The claim checked: the compiler is
linear in the automaton, so one long member costs about its own edges, not
edges x longest member (which a step bitset per state as wide as the longest
member did: 30 s and 851 MiB at 20,000 characters before).

Writes `strings_long_member.csv` under `--out-dir`.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from benchmarks.strings import peers as peer_jobs  # noqa: E402
from benchmarks.strings import run as strings_run  # noqa: E402
from benchmarks.strings import string_sets  # noqa: E402

LENGTHS = (0, 2_000, 20_000, 50_000)


def long_member(chars: int, seed: int = 1) -> str:
    rng = random.Random(seed)
    parts, size = [], 0
    while size < chars:
        parts.append(rng.choice(string_sets._WORDS))
        size += len(parts[-1]) + 1
    return " ".join(parts)[:chars]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", action="append")
    parser.add_argument("--k", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out-dir", default=os.path.join(REPO, "benchmarks", "results"))
    parser.add_argument("--cache-dir", default=os.path.join(tempfile.gettempdir(), "sk_strings"))
    args = parser.parse_args(argv)
    vocabs = args.vocab or [
        os.path.join(strings_run.VOCAB_DIR, v) for v in strings_run.DEFAULT_VOCABS
    ]
    os.makedirs(args.cache_dir, exist_ok=True)
    os.makedirs(args.out_dir, exist_ok=True)
    rows = []
    for path in vocabs:
        label = os.path.basename(path)
        vocab, _, _ = strings_run._load_vocabulary(path)
        vocab_npz = os.path.join(args.cache_dir, f"{label}.npz")
        peer_jobs.save_vocabulary(vocab_npz, vocab.token_bytes, vocab.special, vocab.eos_token_id)
        base_strings = string_sets.product_paths(args.k, seed=0)
        base = None
        for chars in LENGTHS:
            strings = base_strings + ([long_member(chars)] if chars else [])
            index, times = strings_run._time_ours(strings, vocab, args.repeats)
            peak = strings_run._peak_ours(vocab_npz, strings, args.cache_dir)
            row = {
                "vocab": label,
                "k": args.k,
                "long_member_chars": chars,
                "compile_ms_median": statistics.median(times) * 1000,
                "peak_mib": peak / 2**20,
                "edges": index.layout.num_edges,
                "max_length": index.length,
            }
            if base is None:
                base = row
            row["time_vs_without"] = row["compile_ms_median"] / base["compile_ms_median"]
            row["memory_vs_without"] = row["peak_mib"] / base["peak_mib"]
            rows.append(row)
            print(strings_run._table([row], list(row)), flush=True)
    strings_run._write(os.path.join(args.out_dir, "strings_long_member.csv"), rows)
    print()
    print(strings_run._table(rows, list(rows[0])))


if __name__ == "__main__":
    main()
