"""Build time, peak RSS and bytes of each constraint structure against N.

For each N and structure, a fresh process draws the random semantic IDs
(V 2048, L 8, the same nested sets as the decoding sweep), builds the
structure and uploads it to TensorFlow variables, as the decode benchmark
does: STATIC (`StaticIndex.build` + `ConstrainedDecoding`), the PPV sorted
prefix keys (shared by PPV exact and approximate), the hash bitmap, and the
CPU trie (Python dicts, up to `--cpu-trie-max-n`). Peak RSS is the process
peak (input IDs and the TensorFlow runtime included); `input_rss_gb` is the
RSS before the build. STATIC's bytes sit next to the paper's memory model:
12 bytes per trie node plus the dense tables.

    python -m benchmarks.decoding.build_cost [--quick] [--sizes 1e5 1e6 1e7 2e7]

Prints a table and writes benchmarks/results/decoding_build.csv.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from benchmarks.decoding import common  # noqa: E402

STRUCTURES = ("static", "ppv", "hash_bitmap", "cpu_trie")
COLUMNS = [
    "n", "structure", "vocab_size", "length", "build_s", "peak_rss_gb", "input_rss_gb",
    "structure_gb", "num_states", "paper_model_gb", "isolated", "note",
]  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    parser.add_argument("--out", help="default benchmarks/results/decoding_[gpu_]build.csv")
    parser.add_argument("--sizes", nargs="+", type=float)
    parser.add_argument("--structures", nargs="+", choices=STRUCTURES, default=STRUCTURES)
    parser.add_argument("--vocab-size", type=int, default=None, help="default 2048; quick 256")
    parser.add_argument("--length", type=int, default=8)
    parser.add_argument("--cpu-trie-max-n", type=float, default=10**6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--isolate", action=argparse.BooleanOptionalAction, default=None)
    return parser


def main(argv=None) -> list[dict]:
    argv = sys.argv[1:] if argv is None else list(argv)
    if common.child_main(measure, argv):
        return []
    args = build_parser().parse_args(argv)
    sizes = [int(s) for s in (args.sizes or ([1000, 5000] if args.quick else [1e5, 1e6, 1e7, 2e7]))]
    vocab = args.vocab_size or (256 if args.quick else 2048)
    isolate = (not args.quick) if args.isolate is None else args.isolate
    rows = []
    for n in sizes:
        for structure in args.structures:
            if structure == "cpu_trie" and n > args.cpu_trie_max_n:
                continue
            config = {
                "n": n,
                "structure": structure,
                "vocab_size": vocab,
                "length": args.length,
                "device": args.device,
                "seed": args.seed,
                "isolated": isolate,
            }
            if isolate:
                row = common.run_child("benchmarks.decoding.build_cost", config)[0]
            else:
                row = measure(config)[0]
            print(_format(row), flush=True)
            rows.append(row)
    out = args.out or common.default_csv("build", args.device)
    common.write_csv(out, rows, COLUMNS)
    print(f"wrote {out}")
    return rows


def measure(config: dict) -> list[dict]:
    device_name = common.configure_device(config["device"])
    import tensorflow as tf

    from static_keras import ConstrainedDecoding
    from static_keras import StaticIndex
    from static_keras.baselines import CpuTrie
    from static_keras.baselines import HashBitmap
    from static_keras.baselines import SortedPrefixKeys

    n, vocab, structure = config["n"], config["vocab_size"], config["structure"]
    ids = common.random_ids(n, vocab, config["length"], config["seed"])
    input_rss = common.peak_rss_bytes()
    row = {
        "n": n,
        "structure": structure,
        "vocab_size": vocab,
        "length": config["length"],
        "num_states": "",
        "paper_model_gb": "",
        "isolated": config["isolated"],
        "note": "",
    }
    with tf.device(device_name):
        start = time.perf_counter()
        if structure == "static":
            index = StaticIndex.build(ids, vocab, dense_levels=2 if vocab <= 4096 else "auto")
            ConstrainedDecoding(index)
            nbytes = index.nbytes
            arrays = index.arrays
            dense = arrays["dense_states"].nbytes + arrays["dense_masks"].nbytes
            row["num_states"] = index.num_states
            row["paper_model_gb"] = round((12 * index.num_states + dense) / 1e9, 4)
            row["note"] = f"d={index.dense_levels}, B_t {' '.join(map(str, index.step_widths))}"
        elif structure == "ppv":
            keys = SortedPrefixKeys(ids, vocab)
            nbytes = keys.nbytes
            row["num_states"] = 1 + sum(keys.level_sizes)
            row["note"] = f"{keys.dtype} keys"
        elif structure == "hash_bitmap":
            bitmap = HashBitmap(ids, vocab)
            nbytes = bitmap.nbytes
            row["note"] = f"{bitmap.num_hashes} hashes, expected FP {bitmap.expected_fp_rate():.1e}"
        else:
            trie = CpuTrie(ids, vocab)
            seconds = time.perf_counter() - start
            nbytes = trie.host_nbytes()
            row["num_states"] = trie.num_nodes
            row["note"] = "host Python dicts; bytes from sys.getsizeof"
        if structure != "cpu_trie":
            seconds = time.perf_counter() - start
    row.update(
        build_s=round(seconds, 3),
        peak_rss_gb=round(common.peak_rss_bytes() / 1e9, 3),
        input_rss_gb=round(input_rss / 1e9, 3),
        structure_gb=round(nbytes / 1e9, 4),
    )
    return [row]


def _format(row: dict) -> str:
    return (
        f"  N={row['n']:>11,}  {row['structure']:<12} build {row['build_s']:8.2f} s  peak RSS "
        f"{row['peak_rss_gb']:6.2f} GB (input {row['input_rss_gb']:.2f})  size "
        f"{row['structure_gb']:.3f} GB  paper model {row['paper_model_gb'] or '-'}"
    )


if __name__ == "__main__":
    main()
