"""One constraint step with a Python int step against a tensor step.

    python -m benchmarks.decoding.step_forms [--n 1e5] [--rows 140] [--repeats 200]

The int step is the fast path (each step its own static width B_t; what the
unrolled beam search runs); a scalar tensor step (a `while_loop`, a sampler)
uses the widest step's shapes and computes the dense head and the CSR tail
for every row. Both in TF graph mode without XLA (TF Serving's default), on
a StaticIndex of random IDs (L = 8, V = 2048, d = 2) and the rows' real
states at each step; candidates with 30 per row at dense steps. Median of
`--repeats` calls, result fetched. Prints a table and writes
`step_forms.csv` under `--out-dir`.
"""

from __future__ import annotations

import argparse
import os
import time

from benchmarks.decoding.common import RESULTS_DIR
from benchmarks.decoding.common import write_csv


def _median_us(fn, repeats: int) -> float:
    import numpy as np

    fn()  # trace and warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times) * 1e6)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=float, default=1e5)
    parser.add_argument("--rows", type=int, default=140)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--out-dir", default=RESULTS_DIR)
    args = parser.parse_args(argv)

    import numpy as np
    import tensorflow as tf

    from static_keras import StaticIndex
    from static_keras import constraint_for

    rng = np.random.default_rng(0)
    index = StaticIndex.build(rng.integers(0, 2048, (int(args.n), 8)), 2048, dense_levels=2)
    layer = constraint_for(index)
    logits = tf.constant(rng.normal(size=(args.rows, 2048)).astype("float32"))
    members = index.sequences()[rng.integers(0, index.num_sequences, args.rows)]
    print(f"{index}\nstep   int step (us)   tensor step (us)   ratio")
    rows = []
    for t in range(index.length):
        states = tf.constant(index.walk(members[:, :t]).astype("int32"))
        fixed = tf.function(lambda s, t=t: layer(logits, s, step=t, dense_top_k=30))
        anywhere = tf.function(lambda s, k: layer(logits, s, step=k, dense_top_k=30))
        step = tf.constant(t)
        a = _median_us(lambda: [x.numpy() for x in fixed(states)], args.repeats)
        b = _median_us(lambda: [x.numpy() for x in anywhere(states, step)], args.repeats)
        rows.append({"step": t, "int_us": round(a, 1), "tensor_us": round(b, 1)})
        print(f"{t:4d} {a:15.0f} {b:18.0f} {b / a:7.2f}")
    path = os.path.join(args.out_dir, "step_forms.csv")
    write_csv(path, rows)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
