"""Op histograms of the compiled decode of `versus_reference`, for one tree.

    python -m benchmarks.decoding.program_ops --backend jax [--tree PATH] > a.json
    python -m benchmarks.decoding.program_ops --compare a.json b.json

A refactor of the core should change what runs at trace time (Python) and
not what the backend runs. This prints, per `versus_reference` config, the
instruction histogram of the optimized HLO (JAX, `jax.jit`) or the op
histogram of the TF graph (`tf.function`, no XLA) of our 8-step decode at
N = 10^5, built by `--tree`'s own code (a checkout or `git worktree` of any
commit: its `static_keras` and its `versus_reference`); `--compare` lists
the ops whose counts differ between two such files.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys


def histograms(tree: str, backend: str, size: int) -> dict:
    os.environ["KERAS_BACKEND"] = backend
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    # The tree's own `benchmarks` and `static_keras`, not this checkout's.
    sys.path.insert(0, os.path.abspath(tree))
    for name in [m for m in sys.modules if m.split(".")[0] in ("benchmarks", "static_keras")]:
        del sys.modules[name]
    import numpy as np

    from benchmarks.decoding import versus_reference as vr
    from static_keras import ConstrainedDecoding
    from static_keras import StaticIndex

    index = StaticIndex.build(vr._sorted_ids(size, 0), vr.VOCAB, dense_levels=vr.DENSE)
    layer = ConstrainedDecoding(index)
    table = np.random.default_rng(0).normal(size=(vr.TABLE_ROWS, vr.VOCAB)).astype("float32")
    out = {}
    for name, batch, beam, per_beam in vr.CONFIGS:
        calls = vr._ours(layer, table, batch, beam, per_beam, backend)
        call = calls["JAX jit" if backend == "jax" else "TF graph, no XLA"]
        cells = [c.cell_contents for c in call.__closure__]
        if backend == "jax":  # the jitted function and its arguments
            jitted = next(c for c in cells if hasattr(c, "lower"))
            values = next(c for c in cells if isinstance(c, list))
            table_arg = next(c for c in cells if hasattr(c, "dtype"))
            text = jitted.lower(values, table_arg).compile().as_text()
            ops = re.findall(r"= \S+ (\w[\w-]*)\(", text)
        else:
            function = next(c for c in cells if hasattr(c, "get_concrete_function"))
            graph = function.get_concrete_function().graph.as_graph_def()
            ops = [n.op for n in graph.node]
            ops += [n.op for f in graph.library.function for n in f.node_def]
        out[name] = dict(collections.Counter(ops))
    return out


def compare(a: dict, b: dict) -> None:
    for config in a:
        x, y = a[config], b[config]
        diff = {k: (x.get(k, 0), y.get(k, 0)) for k in sorted(set(x) | set(y))
                if x.get(k, 0) != y.get(k, 0)}  # fmt: skip
        print(f"{config}: {sum(x.values())} -> {sum(y.values())} ops; differing: {diff or 'none'}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["jax", "tensorflow"], default="jax")
    parser.add_argument("--tree", default=".", help="checkout whose code builds the decode")
    parser.add_argument("--size", type=float, default=1e5)
    parser.add_argument("--compare", nargs=2, metavar="JSON")
    args = parser.parse_args(argv)
    if args.compare:
        compare(*(json.load(open(path)) for path in args.compare))
        return
    print(json.dumps(histograms(args.tree, args.backend, int(args.size))))


if __name__ == "__main__":
    main()
