"""Constraint overhead per decoding step: STATIC against its baselines.

Every method runs the same L-step beam search (`static_keras.beam_search`)
over the same random-logits model; only the constraint differs. Each whole
search is one `tf.function` (graph mode, what a stock TF Serving runs) and,
where XLA can compile it, a second one with `jit_compile=True`. After
warm-up, the functions run in interleaved rounds; the overhead per step of a
method is `(its run - the unconstrained run of the same round and mode) / L`,
median and p90 over rounds.

Sweeps (the STATIC paper's Table 1 / Table 4 set-up):

- `n`: constraint-set size N (batch 2, beam 70, V 2048, L 8, d 2)
- `vocab`: vocabulary V at a fixed N (d chosen by `dense_levels="auto"`)
- `rows`: batch x beam rows at a fixed N

Before timing, each method decodes once (salt 0) and is validated against
STATIC: the fraction of returned sequences in the valid set (`valid_frac`;
the hash bitmap's false positives lower it), the fraction of STATIC's results
it returns (`recall_vs_exact`) and whether its output is identical
(`exact_match`).

The CPU trie (Python dicts, about 1.9 GB per million IDs) is built up to
`--cpu-trie-max-n`; above it the table carries the value at the largest
measured N, marked `lower_bound` (the sets are nested, so every fan-out, and
with it the trie's per-row Python work, only grows with N). The hash bitmap
is skipped where rows x V exceeds `--hash-max-cells` (seconds per step).

    python -m benchmarks.decoding.decode_sweep --sweep n
    python -m benchmarks.decoding.decode_sweep --sweep vocab --quick

Prints a table and writes benchmarks/results/decoding_<sweep>.csv.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from benchmarks.decoding import common  # noqa: E402

COLUMNS = [
    "sweep", "device", "n", "vocab_size", "length", "dense_levels", "batch_size",
    "beam_size", "rows", "method", "xla", "measured", "repeats", "compile_s",
    "run_ms_median", "run_ms_p90", "step_ms_median", "overhead_ms_step_median",
    "overhead_ms_step_p10", "overhead_ms_step_p90", "excess_vs_static_ms_step",
    "step_ratio_vs_static", "overhead_ratio_vs_static", "host_ms_step", "valid_frac",
    "recall_vs_exact", "exact_match", "query_fp_rate", "build_s", "structure_mb",
    "step_widths", "note",
]  # fmt: skip

FULL = {
    "n": {"sizes": [10**5, 10**6, 10**7, 2 * 10**7]},
    "vocab": {"vocabs": [256, 1024, 2048, 4096, 16384, 32768], "n": 10**6},
    "rows": {"shapes": [(1, 1), (2, 70), (8, 128), (64, 128)], "n": 10**6},
}
QUICK = {
    "n": {"sizes": [1000, 5000]},
    "vocab": {"vocabs": [128], "n": 2000},
    "rows": {"shapes": [(4, 16)], "n": 2000},
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", choices=["n", "vocab", "rows"], default="n")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, few repeats (CI)")
    parser.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    parser.add_argument(
        "--out", help="CSV path (default benchmarks/results/decoding_[gpu_]<sweep>.csv)"
    )
    parser.add_argument("--sizes", nargs="+", type=float, help="N values (sweep n)")
    parser.add_argument("--vocabs", nargs="+", type=int, help="V values (sweep vocab)")
    parser.add_argument("--shapes", nargs="+", help="batch x beam, e.g. 2x70 (sweep rows)")
    parser.add_argument("--n", type=float, help="fixed N of the vocab and rows sweeps")
    parser.add_argument("--vocab-size", type=int, default=None, help="V (default 2048; quick 256)")
    parser.add_argument("--length", type=int, default=None, help="L (default 8; quick 4)")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--beam-size", type=int, default=None, help="default 70; quick 8")
    parser.add_argument("--methods", nargs="+", choices=common.METHODS, default=common.METHODS)
    parser.add_argument(
        "--xla",
        choices=["all", "static", "none"],
        default=None,
        help="XLA variants: every compilable method, only STATIC (+floor), or none "
        "(default: all for the n sweep, static for the others and for --quick)",
    )
    parser.add_argument("--cpu-trie-max-n", type=float, default=10**6)
    parser.add_argument(
        "--hash-max-cells",
        type=float,
        default=1.2e6,
        help="skip the hash bitmap where rows x V exceeds this (its graph-mode step "
        "takes seconds there)",
    )
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs after the first")
    parser.add_argument("--min-repeats", type=int, default=None, help="default 3; quick 2")
    parser.add_argument("--max-repeats", type=int, default=None, help="default 101; quick 3")
    parser.add_argument("--budget-s", type=float, default=6.0, help="timing seconds per method")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--isolate",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="one subprocess per point (default on; quick off)",
    )
    return parser


def main(argv=None) -> list[dict]:
    argv = sys.argv[1:] if argv is None else list(argv)
    if common.child_main(run_point, argv):
        return []
    args = build_parser().parse_args(argv)
    quick = args.quick
    vocab = args.vocab_size or (256 if quick else 2048)
    beam = args.beam_size or (8 if quick else 70)
    xla = args.xla or ("all" if args.sweep == "n" and not quick else "static")
    isolate = (not quick) if args.isolate is None else args.isolate
    base = {
        "sweep": args.sweep,
        "device": args.device,
        "length": args.length or (4 if quick else 8),
        "methods": list(args.methods),
        "xla": xla,
        "cpu_trie_max_n": int(args.cpu_trie_max_n),
        "hash_max_cells": int(args.hash_max_cells),
        "warmup": args.warmup,
        "min_repeats": args.min_repeats or (2 if quick else 3),
        "max_repeats": args.max_repeats or (3 if quick else 101),
        "budget_s": 0.2 if quick else args.budget_s,
        "seed": args.seed,
    }
    preset = (QUICK if quick else FULL)[args.sweep]
    dense = 2 if vocab <= 4096 else "auto"  # the paper's d = 2 (V**2 int32 state map)
    points = []
    if args.sweep == "n":
        sizes = [int(s) for s in (args.sizes or preset["sizes"])]
        for n in sizes:
            points.append(dict(base, n=n, vocab_size=vocab, dense_levels=dense,
                               batch_size=args.batch_size, beam_size=beam))  # fmt: skip
    elif args.sweep == "vocab":
        n = int(args.n or preset["n"])
        for v in args.vocabs or preset["vocabs"]:
            points.append(dict(base, n=n, vocab_size=v, dense_levels="auto",
                               batch_size=args.batch_size, beam_size=beam))  # fmt: skip
    else:
        n = int(args.n or preset["n"])
        shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes] if args.shapes else None
        for batch, beam_size in shapes or preset["shapes"]:
            points.append(dict(base, n=n, vocab_size=vocab, dense_levels=dense,
                               batch_size=batch, beam_size=beam_size))  # fmt: skip

    rows = []
    for point in points:
        label = (
            f"N={point['n']:,} V={point['vocab_size']} rows={point['batch_size']}x"
            f"{point['beam_size']}"
        )
        print(f"[decode {args.sweep}] {label}", flush=True)
        start = time.perf_counter()
        if isolate:
            point_rows = common.run_child("benchmarks.decoding.decode_sweep", point)
        else:
            point_rows = run_point(point)
        print(f"  done in {time.perf_counter() - start:.0f} s", flush=True)
        add_ratios(point_rows)
        print(format_table(point_rows), flush=True)
        rows += point_rows
    rows = add_lower_bounds(rows, args.sweep)
    add_ratios(rows)
    out = args.out or common.default_csv(args.sweep, args.device)
    common.write_csv(out, rows, COLUMNS)
    print(f"wrote {out}")
    return rows


def run_point(point: dict) -> list[dict]:
    """Builds every constraint for one point, validates, times; returns CSV rows."""
    device_name = common.configure_device(point["device"])
    import numpy as np
    import tensorflow as tf

    from static_keras import ConstrainedDecoding
    from static_keras import StaticIndex
    from static_keras import beam_search
    from static_keras.baselines import CpuTrie
    from static_keras.baselines import HashBitmap
    from static_keras.baselines import PPVApproximate
    from static_keras.baselines import PPVExact
    from static_keras.baselines import SortedPrefixKeys

    log = common.log
    n, vocab, length = point["n"], point["vocab_size"], point["length"]
    batch, beam = point["batch_size"], point["beam_size"]
    methods = [m for m in common.METHODS if m in point["methods"]]
    if "unconstrained" not in methods:
        methods.insert(0, "unconstrained")
    if "hash_bitmap" in methods and batch * beam * vocab > point.get("hash_max_cells", 1.2e6):
        methods.remove("hash_bitmap")
        log(f"    skipping the hash bitmap: {batch * beam} rows x V {vocab} > hash_max_cells")
    ids = common.random_ids(n, vocab, length, point["seed"])

    built = {}  # method -> (graph constraint, xla constraint, build_s, bytes, note)
    host_seconds = []  # the CPU trie's Python callback time, per call (one call per step)
    with tf.device(device_name):
        start = time.perf_counter()
        index = StaticIndex.build(ids, vocab, dense_levels=point["dense_levels"])
        static_build = time.perf_counter() - start
        del ids
        seqs = index.sequences()
        seqs = seqs.astype(np.uint16) if vocab <= 2**16 else seqs
        log(f"    N={n:,}: {index.num_sequences:,} distinct IDs, B_t {index.step_widths}")
        if "hash_bitmap" in methods:  # first: its build has the largest transient memory
            start = time.perf_counter()
            bitmap = HashBitmap(seqs, vocab)
            built["hash_bitmap"] = (bitmap, bitmap, time.perf_counter() - start, bitmap.nbytes, "")
        layer = ConstrainedDecoding(index)
        built["static"] = (layer, layer, static_build, index.nbytes, "")
        if "ppv_exact" in methods or "ppv_approx" in methods:
            start = time.perf_counter()
            keys = SortedPrefixKeys(seqs, vocab)
            seconds = time.perf_counter() - start
            built["ppv_exact"] = (
                PPVExact(keys=keys, search="native"),
                PPVExact(keys=keys, search="unrolled"),
                seconds,
                keys.nbytes,
                "graph: native searchsorted; XLA: unrolled binary search",
            )
            built["ppv_approx"] = (
                PPVApproximate(keys=keys, search="native"),
                PPVApproximate(keys=keys, search="unrolled"),
                seconds,
                keys.nbytes,
                "50 probes per row; keys shared with PPV exact",
            )
        if "cpu_trie" in methods and n <= point["cpu_trie_max_n"]:
            start = time.perf_counter()
            trie = CpuTrie(seqs, vocab)
            seconds = time.perf_counter() - start
            trie._host_step = _timed(trie._host_step, host_seconds)  # before tracing
            built["cpu_trie"] = (trie, None, seconds, trie.host_nbytes(), "host Python objects")
        built["unconstrained"] = (None, None, 0.0, 0, "")
        table = tf.Variable(common.logits_table(vocab, point["seed"]), trainable=False)

    xla_methods = {
        "all": common.XLA_METHODS,
        "static": ("unconstrained", "static"),
        "none": (),
    }[point["xla"]]

    def make(constraint, jit):
        @tf.function(jit_compile=jit)
        def decode(salt):
            step_fn = common.random_logits_step_fn(table, salt)
            out = beam_search(
                constraint,
                step_fn,
                batch,
                beam,
                length=length if constraint is None else None,
            )
            return out["tokens"], out["scores"]

        def call(salt: int):
            with tf.device(device_name):
                return decode(tf.constant(salt, tf.int32))

        return call

    functions = {}
    for method in methods:
        if method not in built:
            continue
        graph_constraint, xla_constraint, *_ = built[method]
        functions[(method, False)] = make(graph_constraint, False)
        if method in xla_methods and (xla_constraint is not None or method == "unconstrained"):
            functions[(method, True)] = make(xla_constraint, True)

    # Validation: one decode each with salt 0 (its first call: trace and
    # compile, timed as compile_s), against STATIC (exact).
    outputs, compile_s = {}, {}
    for key, function in functions.items():
        start = time.perf_counter()
        outputs[key] = [x.numpy() for x in function(0)]
        compile_s[key] = time.perf_counter() - start
        log(f"    first call {key[0]}{' (XLA)' if key[1] else ''}: {compile_s[key]:.1f} s")
    reference = outputs[("static", False)][0] if ("static", False) in outputs else None
    checks = {key: _validate(index, tokens, reference) for key, (tokens, _) in outputs.items()}
    query_fp = (
        _bloom_query_fp(built["hash_bitmap"][0], index, seqs) if "hash_bitmap" in built else ""
    )
    del seqs

    del host_seconds[:]  # keep the timed rounds only (and warm-up)
    timing = common.time_interleaved(
        functions,
        warmup=point["warmup"],
        min_repeats=point["min_repeats"],
        max_repeats=point["max_repeats"],
        budget_s=point["budget_s"],
        seed=point["seed"],
    )
    rows = []
    for (method, jit), result in timing.items():
        floor = timing[("unconstrained", jit)]["runs"]
        stats = common.summarize_runs(result["runs"], floor, length)
        _, _, build_s, nbytes, note = built[method]
        rows.append(
            {
                "sweep": point["sweep"],
                "device": point["device"],
                "n": n,
                "vocab_size": vocab,
                "length": length,
                "dense_levels": index.dense_levels,
                "batch_size": batch,
                "beam_size": beam,
                "rows": batch * beam,
                "method": method,
                "xla": jit,
                "measured": "yes",
                "compile_s": round(compile_s[(method, jit)], 2),
                **stats,
                **checks[(method, jit)],
                "query_fp_rate": query_fp if method == "hash_bitmap" else "",
                "host_ms_step": round(1e3 * sum(host_seconds) / len(host_seconds), 4)
                if method == "cpu_trie" and host_seconds
                else "",
                "build_s": round(build_s, 3),
                "structure_mb": round(nbytes / 2**20, 2),
                "step_widths": " ".join(map(str, index.step_widths)),
                "note": note,
            }
        )
    return rows


def _timed(function, seconds: list):
    """`function`, appending its wall time of each call to `seconds`."""

    def timed(*args):
        start = time.perf_counter()
        out = function(*args)
        seconds.append(time.perf_counter() - start)
        return out

    return timed


def _validate(index, tokens, reference) -> dict:
    """Validity of returned sequences, and agreement with the exact (STATIC) result."""
    import numpy as np

    batch, beam, length = tokens.shape
    flat = tokens.reshape(-1, length)
    live = np.all(flat >= 0, axis=1)
    valid = index.contains(flat[live]) if live.any() else np.zeros(0, bool)
    out = {
        "valid_frac": round(float(valid.mean()), 4) if valid.size else "",
        "recall_vs_exact": "",
        "exact_match": "",
    }
    if reference is not None:
        recalls = []
        for b in range(batch):
            expected = {tuple(row) for row in reference[b] if row[0] >= 0}
            found = {tuple(row) for row in tokens[b] if row[0] >= 0}
            recalls.append(len(expected & found) / max(1, len(expected)))
        out["recall_vs_exact"] = round(float(np.mean(recalls)), 4)
        out["exact_match"] = bool(np.array_equal(tokens, reference))
    return out


def _bloom_query_fp(bitmap, index, seqs, samples: int = 20000, seed: int = 0) -> float:
    """Measured per-query false-positive rate: valid prefix + random token, all levels."""
    import numpy as np

    rng = np.random.default_rng(seed)
    false_pos = negatives = 0
    for t in range(index.length):
        prefixes = seqs[rng.integers(0, len(seqs), samples), :t].astype(np.int64)
        tokens = rng.integers(0, index.vocab_size, samples)
        truth = index.allowed_tokens(prefixes)[np.arange(samples), tokens]
        answer = bitmap.contains_prefixes(np.concatenate([prefixes, tokens[:, None]], axis=1))
        if np.any(truth & ~answer):
            raise AssertionError("hash bitmap: false negative")
        false_pos += int(np.count_nonzero(answer & ~truth))
        negatives += int(np.count_nonzero(~truth))
    return round(false_pos / max(1, negatives), 7)


def add_lower_bounds(rows: list[dict], sweep: str) -> list[dict]:
    """CPU-trie rows above the largest measured N: lower bounds (sets are nested)."""
    if sweep != "n":
        return rows
    measured = [r for r in rows if r["method"] == "cpu_trie"]
    if not measured:
        return rows
    largest = max(measured, key=lambda r: r["n"])
    out = list(rows)
    for n in sorted({r["n"] for r in rows if r["n"] > largest["n"]}):
        template = next(r for r in rows if r["n"] == n and r["method"] == "static")
        bound = dict(largest)
        for key in ("n", "dense_levels", "step_widths"):
            bound[key] = template[key]
        bound.update(
            measured="lower_bound",
            repeats=0,
            compile_s="",
            valid_frac="",
            recall_vs_exact="",
            exact_match="",
            build_s="",
            structure_mb="",
            note=f"not built (Python dicts: ~1.9 GB per 1e6 IDs); value measured at "
            f"N={largest['n']:,}, a lower bound",
        )
        out.append(bound)
    return out


def add_ratios(rows: list[dict]) -> None:
    """Compares each method with STATIC at the same point and mode.

    The CPU trie (graph mode only) is compared with STATIC in graph mode.
    `overhead_ratio_vs_static` is left empty where STATIC's overhead is not
    positive (a ratio to a number at or below zero says nothing).
    """
    static = {}
    for row in rows:
        if row["method"] == "static":
            static[(row["n"], row["vocab_size"], row["rows"], row["xla"])] = row
    for row in rows:
        reference = static.get((row["n"], row["vocab_size"], row["rows"], row["xla"]))
        row["excess_vs_static_ms_step"] = row["step_ratio_vs_static"] = ""
        row["overhead_ratio_vs_static"] = ""
        if reference is None:
            continue
        row["excess_vs_static_ms_step"] = round(
            row["step_ms_median"] - reference["step_ms_median"], 4
        )
        row["step_ratio_vs_static"] = round(row["step_ms_median"] / reference["step_ms_median"], 2)
        if reference["overhead_ms_step_median"] > 0:
            row["overhead_ratio_vs_static"] = round(
                row["overhead_ms_step_median"] / reference["overhead_ms_step_median"], 1
            )


def format_table(rows: list[dict]) -> str:
    header = (
        f"  {'method':<22}{'XLA':<5}{'step ms':>9}{'overhead/step ms':>18}{'p90':>9}"
        f"{'vs STATIC':>10}{'valid':>7}{'recall':>8}{'build s':>9}{'MB':>9}"
    )
    lines = [header]
    for row in rows:
        lines.append(
            f"  {common.LABELS[row['method']]:<22}{'yes' if row['xla'] else 'no':<5}"
            f"{row['step_ms_median']:>9.3f}{row['overhead_ms_step_median']:>18.4f}"
            f"{row['overhead_ms_step_p90']:>9.3f}{_fmt(row.get('excess_vs_static_ms_step')):>10}"
            f"{_fmt(row['valid_frac']):>7}"
            f"{_fmt(row['recall_vs_exact']):>8}{_fmt(row['build_s']):>9}"
            f"{_fmt(row['structure_mb']):>9}"
        )
    return "\n".join(lines)


def _fmt(value) -> str:
    if value in ("", None):
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


if __name__ == "__main__":
    main()
