"""STATIC kernel time against the branch width B_t.

One VNTK step (`ConstrainedDecoding.candidates` at a CSR-tail step) gathers
`B_t` slots per row, so its cost should grow with `B_t` and nothing else. A
synthetic valid set pins `B_t` exactly: 256 distinct 2-token prefixes, each
followed by exactly `B` distinct third tokens (then random tokens), V 2048,
L 8, d 2, so step 2 is a tail step of width `B`. For reference, the table
also times a dense-head step (`t = 0`: unpack V bits, mask, top-k), the
unconstrained selection (`top_k` of V log-probs) and the same `top_k` once all
but 4 tokens per row are masked (`masked_topk`: on CPU its time depends on
the data), for the same rows.

Each timed call runs `--inner` kernel steps in one `tf.function`, each on its
own log-probs tensor and chained through the states (so no step can be
deduplicated); the time per kernel step is the call's time over `--inner`,
median and p90 over repeats.

    python -m benchmarks.decoding.kernel [--quick] [--device gpu]

Prints a table and writes benchmarks/results/decoding_kernel.csv.
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
    "device", "kind", "b_t", "step", "rows", "vocab_size", "xla", "inner", "repeats",
    "us_median", "us_p90",
]  # fmt: skip
PREFIXES = 256


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    parser.add_argument("--out", help="default benchmarks/results/decoding_[gpu_]kernel.csv")
    parser.add_argument("--widths", nargs="+", type=int, help="B values (default 1 .. 2048)")
    parser.add_argument("--vocab-size", type=int, default=None, help="default 2048; quick 256")
    parser.add_argument("--rows", type=int, default=140, help="batch x beam rows (default 140)")
    parser.add_argument("--inner", type=int, default=None, help="kernel steps per call (20)")
    parser.add_argument("--repeats", type=int, default=None, help="default 50; quick 3")
    parser.add_argument("--seed", type=int, default=0)
    return parser


def synthetic_ids(width: int, vocab_size: int, length: int, seed: int):
    """IDs whose 2-token prefixes (PREFIXES of them) have exactly `width` children."""
    import numpy as np

    rng = np.random.default_rng([seed, width])
    codes = rng.choice(vocab_size * vocab_size, size=PREFIXES, replace=False)
    third = np.argsort(rng.random((PREFIXES, vocab_size)), axis=1)[:, :width]
    n = PREFIXES * width
    ids = rng.integers(0, vocab_size, size=(n, length))
    ids[:, 0] = np.repeat(codes // vocab_size, width)
    ids[:, 1] = np.repeat(codes % vocab_size, width)
    ids[:, 2] = third.reshape(-1)
    return ids


def main(argv=None) -> list[dict]:
    args = build_parser().parse_args(argv)
    device_name = common.configure_device(args.device)
    import numpy as np
    import tensorflow as tf
    from keras import ops

    from static_keras import ConstrainedDecoding
    from static_keras import StaticIndex

    vocab = args.vocab_size or (256 if args.quick else 2048)
    widths = args.widths or ([1, 4, 16] if args.quick else [2**i for i in range(12)])
    widths = [w for w in widths if w <= vocab]
    inner = args.inner or (4 if args.quick else 20)
    repeats = args.repeats or (3 if args.quick else 50)
    rows_count = args.rows
    rng = np.random.default_rng(args.seed)
    log_probs_np = rng.normal(size=(inner, rows_count, vocab)).astype(np.float32)

    def timed(kernel, jit: bool, states0):
        @tf.function(jit_compile=jit)
        def run(log_probs, states):
            total = ops.zeros((), "float32")
            for step_log_probs in log_probs:
                scores, tokens, _ = kernel(step_log_probs, states)
                states = ops.mod(states + ops.maximum(tokens[:, 0], 0) + 1, PREFIXES)
                total = total + ops.max(scores[:, 0])
            return total

        with tf.device(device_name):
            log_probs = [tf.constant(x) for x in log_probs_np]
            states = tf.constant(states0, tf.int32)
            for _ in range(3):
                run(log_probs, states).numpy()
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                run(log_probs, states).numpy()
                times.append((time.perf_counter() - start) / inner * 1e6)
        return {
            "repeats": repeats,
            "us_median": round(common.percentile(times, 0.5), 2),
            "us_p90": round(common.percentile(times, 0.9), 2),
        }

    base = {"device": args.device, "rows": rows_count, "vocab_size": vocab, "inner": inner}
    results = []
    states0 = rng.integers(0, PREFIXES, rows_count)
    for width in widths:
        with tf.device(device_name):
            index = StaticIndex.build(
                synthetic_ids(width, vocab, 8, args.seed), vocab, dense_levels=2
            )
            layer = ConstrainedDecoding(index)
        assert index.step_widths[2] == width, index.step_widths
        for jit in (False, True):
            row = dict(base, kind="vntk", b_t=width, step=2, xla=jit)
            # The loop's states are local to depth 2; decoding states number
            # the dense head first (layout.tail_state_offsets).
            first = layer.layout.dense_head_states + layer.layout.tail_state_offsets[2]
            row.update(timed(lambda lp, s: layer.candidates(lp, s + first, 2), jit, states0))
            results.append(row)
            print(_format(row), flush=True)
    # References at the same rows: a dense-head step and the unconstrained top-k.
    beam = 70 if vocab >= 70 else vocab
    for jit in (False, True):
        row = dict(base, kind="dense_step", b_t=index.step_widths[0], step=0, xla=jit)
        zeros = np.zeros(rows_count, np.int64)
        row.update(
            timed(lambda lp, s: layer.candidates(lp, s * 0, 0, dense_top_k=beam), jit, zeros)
        )
        # (s * 0: the root state; the steps differ by their log-probs)
        results.append(row)
        print(_format(row), flush=True)

        def top_k(lp, s):
            scores, tokens = ops.top_k(lp, beam)
            return scores, ops.cast(tokens, "int32"), s

        row = dict(base, kind="unconstrained_topk", b_t=vocab, step=-1, xla=jit)
        row.update(timed(top_k, jit, zeros))
        results.append(row)
        print(_format(row), flush=True)

        def masked_top_k(lp, s):  # the same top-k once all but 4 tokens per row are masked
            keep = ops.less(ops.mod(ops.arange(vocab)[None, :] + s[:, None], vocab // 4 or 1), 1)
            return top_k(ops.where(keep, lp, -np.inf), s)

        row = dict(base, kind="masked_topk", b_t=4, step=-1, xla=jit)
        row.update(timed(masked_top_k, jit, zeros))
        results.append(row)
        print(_format(row), flush=True)
    out = args.out or common.default_csv("kernel", args.device)
    common.write_csv(out, results, COLUMNS)
    print(f"wrote {out}")
    return results


def _format(row: dict) -> str:
    return (
        f"  {row['kind']:<20} B_t={row['b_t']:>6}  XLA {'yes' if row['xla'] else 'no ':<3}  "
        f"{row['us_median']:>9.1f} us  (p90 {row['us_p90']:.1f})"
    )


if __name__ == "__main__":
    main()
