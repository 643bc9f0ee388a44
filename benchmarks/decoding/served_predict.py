"""The served path: an exported SavedModel's Predict beside the reference STATIC code.

    python -m benchmarks.decoding.served_predict --peer ../shared/peers/static-constraint-decoding
        [--sizes 1e5,1e6] [--configs "2x70 tpb30,1x1"] [--rounds 5] [--runs 20] [--xla]

What TF Serving users get: the same decode as `versus_reference` (same
semantic IDs, same logits table indexed by a hash of step, last token and
batch row) inside a Keras model (`ConstrainedBeamSearch` around a table
"decoder"), exported with `export_saved_model` (graph, XLA off), loaded and
run by `tensorflow::LoadSavedModel` + `Session::Run` in C++ (the C++ runner
of `static_keras.serving.cc_loader`: TF Serving's own load path, with XLA
compilation disabled as on a default server). No Python in the timed call.

Each round runs the C++ runner once (`--runs` timed Predicts after a first
one, each after 64 MiB of scratch writes: cold caches, as between requests)
and then `--runs` reference calls under `jax.jit` with the same eviction;
the table gives the median over rounds of ours / reference. Before timing,
the served tokens are checked equal to the reference's. Writes
`served_predict.csv` under `--out-dir`. `--xla` exports with `xla=True` and
runs with XLA compilation on (a server started with
`--xla_cpu_compilation_enabled=true`) into `served_predict_xla.csv`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

from benchmarks.decoding.common import write_csv
from benchmarks.decoding.versus_reference import CONFIGS
from benchmarks.decoding.versus_reference import DENSE
from benchmarks.decoding.versus_reference import REPO
from benchmarks.decoding.versus_reference import TABLE_ROWS
from benchmarks.decoding.versus_reference import VOCAB
from benchmarks.decoding.versus_reference import _hash
from benchmarks.decoding.versus_reference import _reference
from benchmarks.decoding.versus_reference import _sorted_ids
from benchmarks.strings.protocol import EVICT_BYTES
from benchmarks.strings.protocol import evict


def _parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peer", required=True, help="path of static-constraint-decoding")
    parser.add_argument("--sizes", default="1e5,1e6,1e7")
    parser.add_argument("--configs", default=",".join(c[0] for c in CONFIGS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=20, help="timed calls per round and side")
    parser.add_argument(
        "--xla",
        action="store_true",
        help="export with xla=True and run with XLA on (a server started with "
        "--xla_cpu_compilation_enabled=true); default: graph, XLA off",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", default=os.path.join(REPO, "benchmarks", "results"))
    return parser.parse_args(argv)


def _table_model(index, table, beam, per_beam):
    """A functional model: batch-row ids `[B, 1]` -> the constrained top beams.

    The decoder looks up the logits table by (step, last token, batch row);
    its state is the batch row (`[B, 1]`, reordered by parent beam from step 1 on).
    """
    import keras
    from keras import ops

    from static_keras import ConstrainedBeamSearch

    class TableDecoder(keras.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.table = self.add_weight(
                shape=table.shape, initializer="zeros", trainable=False, name="table"
            )
            self.table.assign(table)

        def call(self, prefix, state):
            rows, t = ops.shape(prefix)[0], ops.shape(prefix)[1]
            last = prefix[:, -1] if t else ops.zeros((rows,), "int32")
            code = _hash(ops, t, last, ops.cast(state[:, 0], "int32"))
            return ops.take(self.table, code, axis=0), state

    batch_row = keras.Input((1,), dtype="int32", name="batch_row")
    search = ConstrainedBeamSearch(
        index, TableDecoder(), beam_size=beam, num_results=beam, dense_top_k=per_beam
    )
    return keras.Model(batch_row, search(batch_row))


def main(argv=None):
    args = _parse(argv)
    os.environ["KERAS_BACKEND"] = "tensorflow"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if REPO not in sys.path:
        sys.path.insert(0, REPO)
    import numpy as np

    from static_keras import StaticIndex
    from static_keras.export import export_saved_model
    from static_keras.serving.cc_loader import build_runner
    from static_keras.serving.cc_loader import run_saved_model

    runner = build_runner()
    mode = "XLA on" if args.xla else "graph, XLA off"
    wanted = set(args.configs.split(","))
    table = np.random.default_rng(args.seed).normal(size=(TABLE_ROWS, VOCAB)).astype("float32")
    rows = []
    for size in [int(float(s)) for s in args.sizes.split(",")]:
        ids = _sorted_ids(size, args.seed)
        index = StaticIndex.build(ids, VOCAB, dense_levels=DENSE)
        for name, batch, beam, per_beam in CONFIGS:
            if name not in wanted:
                continue
            reference = _reference(args.peer, ids, table, batch, beam, per_beam)
            expected = np.asarray(reference())
            inputs = {"batch_row": np.arange(batch, dtype=np.int32)[:, None]}
            with tempfile.TemporaryDirectory() as folder:
                path = os.path.join(folder, "model")
                model = _table_model(index, table, beam, per_beam)
                export_saved_model(model, path, xla=args.xla, warmup_inputs=inputs)
                served = run_saved_model(path, inputs, xla=args.xla, binary=runner)
                got = served.outputs["tokens"]
                if not np.array_equal(got, expected):
                    differ = int((got != expected).any(axis=2).sum())
                    raise AssertionError(f"served, {name}, N={size}: {differ} beams differ")
                ours, theirs = [], []
                for _ in range(args.rounds):
                    result = run_saved_model(
                        path,
                        inputs,
                        xla=args.xla,
                        binary=runner,
                        repeat=args.runs,
                        evict_mib=EVICT_BYTES >> 20,
                    )
                    ours.append(statistics.median(result.repeat_ms))
                    calls = []
                    for _ in range(args.runs):
                        evict()
                        start = time.perf_counter()
                        reference()
                        calls.append((time.perf_counter() - start) * 1000)
                    theirs.append(statistics.median(calls))
            row = {
                "n": size,
                "config": name,
                "mode": f"served Predict (C++ Session::Run, {mode})",
                "ours_ms": statistics.median(ours),
                "reference_ms": statistics.median(theirs),
                "ratio_median": statistics.median(a / b for a, b in zip(ours, theirs)),
                "rounds": args.rounds,
                "runs": args.runs,
                "load_average": os.getloadavg()[0],
            }
            rows.append(row)
            print(
                f"N={size:>9,} {name:<12} served Predict ours {row['ours_ms']:8.2f} ms  "
                f"reference (JAX jit) {row['reference_ms']:8.2f} ms  "
                f"ratio {row['ratio_median']:.2f}",
                flush=True,
            )
    name = "served_predict_xla.csv" if args.xla else "served_predict.csv"
    path = os.path.join(args.out_dir, name)
    write_csv(path, rows)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
