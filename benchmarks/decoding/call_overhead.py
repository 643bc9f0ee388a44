"""What one call costs before any decoding: `tf.function` against `jax.jit`.

    python -m benchmarks.decoding.call_overhead [--rounds 50]

Each engine calls a compiled function that only reads one element of each
of the arrays a decode reads (a `ConstrainedDecoding` layer's index weights
at 10^5 semantic IDs, and `versus_reference`'s logits table), after the
same 64 MiB eviction as `versus_reference`'s serving loop, interleaved round
by round. The result bounds what a decode called from Python can reach in
each mode: a TensorFlow decode pays this before its first kernel, and at
1 x 1 the reference's whole jitted decode takes about as long (0.4-0.6 ms
on the machine of docs/benchmarks.md). `--no-index` reads the table alone
(the count of variables does not change the cost). Writes
`call_overhead.csv` under `--out-dir`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from benchmarks.decoding.common import write_csv
from benchmarks.decoding.versus_reference import REPO
from benchmarks.strings.protocol import evict


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--no-index", action="store_true")
    parser.add_argument("--out-dir", default=os.path.join(REPO, "benchmarks", "results"))
    args = parser.parse_args(argv)
    os.environ["KERAS_BACKEND"] = "tensorflow"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if REPO not in sys.path:
        sys.path.insert(0, REPO)
    import jax
    import jax.numpy as jnp
    import numpy as np
    import tensorflow as tf

    from benchmarks.decoding import versus_reference as vr
    from static_keras import ConstrainedDecoding
    from static_keras import StaticIndex

    table = np.zeros((vr.TABLE_ROWS, vr.VOCAB), "float32")
    arrays = [table]
    if not args.no_index:
        ids = vr._sorted_ids(10**5, 0)
        layer = ConstrainedDecoding(StaticIndex.build(ids, vr.VOCAB, dense_levels=vr.DENSE))
        arrays += [np.asarray(v) for v in layer.non_trainable_variables]
    variables = [tf.Variable(a, trainable=False) for a in arrays]

    def touch():  # one element of each: the call, not the work
        return tf.add_n([tf.cast(tf.reshape(v, [-1])[0], "float32") for v in variables])

    xla = tf.function(touch, jit_compile=True)
    graph = tf.function(touch)
    jitted = jax.jit(lambda *xs: sum(x.reshape(-1)[0].astype("float32") for x in xs))
    device_arrays = [jnp.asarray(a) for a in arrays]
    calls = {
        "tf.function, jit_compile": lambda: xla().numpy(),
        "tf.function, graph": lambda: graph().numpy(),
        "jax.jit": lambda: jax.block_until_ready(jitted(*device_arrays)),
    }
    times = {name: [] for name in calls}
    for call in calls.values():
        call()  # compiles
    engines = list(calls.items())
    for round_ in range(args.rounds):
        turn = round_ % len(engines)
        for name, call in engines[turn:] + engines[:turn]:
            evict()
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    rows = []
    for name, values in times.items():
        ms = statistics.median(values) * 1000
        rows.append({"engine": name, "arrays": len(arrays), "call_ms": ms, "rounds": args.rounds})
        print(f"{name:<26} {len(arrays)} arrays  {ms:.3f} ms a call after the eviction")
    write_csv(os.path.join(args.out_dir, "call_overhead.csv"), rows)


if __name__ == "__main__":
    main()
