"""What headroom costs: bytes and the served step, side by side with the exact layout.

Per N (each in its own process): the lifecycle benchmark's catalogue (8 tokens
over 2048, random distinct rows, sparse item ids, one set `in_stock` of a
random half), built exact and with `--headroom` (default 0.1); the README's
`CachedTransformerDecoder` in `ConstrainedBeamSearch(beam_size=20)`, one
decoder shared by both models; each model's search traced once as a
`tf.function` without XLA (TF Serving's default graph mode). Timed in
interleaved rounds (shuffled order per round): the plain call and the call
with a set and 8 excluded ids, batch 1 and 32. Reports index bytes, p50 per
layout and the ratio headroom / exact.

    python benchmarks/headroom_cost.py --sizes 1e6 2e7 [--headroom 0.1]
"""

from __future__ import annotations

import argparse
import os
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.decoding import common  # noqa: E402
from benchmarks.lifecycle import distinct_ids  # noqa: E402

VOCAB, LENGTH, BEAM, HISTORY, CONTEXT = 2048, 8, 20, 20, 1000
COLUMNS = ["n", "headroom", "batch", "request", "exact_ms", "headroom_ms", "ratio",
           "exact_mib", "headroom_mib", "rounds"]  # fmt: skip


def measure(config: dict) -> list[dict]:
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    import keras
    import numpy as np
    import tensorflow as tf

    from static_keras import CachedTransformerDecoder
    from static_keras import ConstrainedBeamSearch
    from static_keras import ConstrainedDecoding
    from static_keras import StaticIndex
    from static_keras.index.eligibility import EligibilitySets
    from static_keras.index.eligibility import MemberCatalogue

    n, room = config["n"], config["headroom"]
    rng = np.random.default_rng([0, n])
    rows, _ = distinct_ids(n, 0)
    ids = 10**9 + 2 * rng.permutation(n).astype(np.int64)
    stock = ids[rng.permutation(n)[: n // 2]]
    keras.utils.set_random_seed(0)
    decoder = CachedTransformerDecoder(VOCAB, LENGTH, context_vocab_size=CONTEXT)
    searches, sizes, catalogues = {}, {}, {}
    for name, headroom in (("exact", 0.0), ("headroom", room)):
        index = StaticIndex.build(rows, VOCAB, item_ids=ids, headroom=headroom)
        sizes[name] = index.nbytes / 2**20
        layer = ConstrainedDecoding(index, eligibility=EligibilitySets.build(index, {"s": stock}))
        searches[name] = ConstrainedBeamSearch(constraint=layer, decoder=decoder, beam_size=BEAM)
        catalogues[name] = MemberCatalogue.from_index(index)
        del index
    out = []
    for batch in (1, 32):
        history = rng.integers(0, CONTEXT, (batch, HISTORY)).astype("int32")
        excluded = rng.choice(ids, (batch, 8))
        functions = {}
        for name, search in searches.items():
            members = catalogues[name].exclusion_members(excluded)
            plain = tf.function(lambda h, s=search: s(h))
            eligible = tf.function(lambda h, m, s=search: s(h, tf.zeros([batch], tf.int32), m))
            # `time_interleaved` syncs on the last output: the item ids.
            functions[("plain", name)] = lambda salt, f=plain: [f(history)["item_ids"]]
            functions[("eligible", name)] = lambda salt, f=eligible, m=members: [
                f(history, m)["item_ids"]
            ]
        for function in functions.values():
            function(0)
        runs = common.time_interleaved(functions, warmup=3, min_repeats=config["rounds"],
                                       max_repeats=config["rounds"], budget_s=0)  # fmt: skip
        for request in ("plain", "eligible"):
            p50 = {name: common.percentile([r for r in runs[(request, name)]["runs"] if r], 0.5)
                   for name in searches}  # fmt: skip
            out.append({
                "n": n, "headroom": room, "batch": batch, "request": request,
                "exact_ms": round(1e3 * p50["exact"], 2),
                "headroom_ms": round(1e3 * p50["headroom"], 2),
                "ratio": round(p50["headroom"] / p50["exact"], 3),
                "exact_mib": round(sizes["exact"], 1), "headroom_mib": round(sizes["headroom"], 1),
                "rounds": config["rounds"],
            })  # fmt: skip
    return out


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if common.child_main(measure, argv):
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["1e6"])
    parser.add_argument("--headroom", type=float, default=0.1)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--csv", default=os.path.join(common.RESULTS_DIR, "headroom_cost.csv"))
    args = parser.parse_args(argv)
    sizes = [int(float(s)) for text in args.sizes for s in text.split(",")]
    rows = common.size_sweep(
        "benchmarks.headroom_cost",
        sizes,
        {"headroom": args.headroom, "rounds": args.rounds},
        lambda r: (f"N={r['n']:>11,} b{r['batch']:<3} {r['request']:<8} exact "
                   f"{r['exact_ms']:7.2f} ms  headroom {r['headroom_ms']:7.2f} ms  "
                   f"{r['ratio']:.3f}x  ({r['exact_mib']:.0f} -> {r['headroom_mib']:.0f} MiB)"),
    )  # fmt: skip
    common.write_csv(args.csv, rows, COLUMNS)
    print(common.machine_line())
    print(f"wrote {args.csv}")


if __name__ == "__main__":
    main()
