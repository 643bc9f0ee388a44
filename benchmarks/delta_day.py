"""A day of catalogue deltas against a running server, then one full rebuild.

At N (default 10^6; the lifecycle catalogue: 8 tokens over 2048, random
distinct rows, sparse item ids, one set `in_stock` of a random half), v1 is
published with `--headroom` (default 0.1) and served by `serve-dev`
(polling every second). Then `--deltas` (default 50) times: 0.1 % of the
items are replaced (as many removed as added, new item ids; a third of the
new items join `in_stock`), `update_catalogue` publishes the delta in this
process (NumPy only), and the time until the server answers from the new
version is taken. After the first and the last swap the server's RSS is
read. At the end the catalogue is built in full (`StaticIndex.build`,
exact layout) and the last version's answers, through gRPC, are compared
with the Keras search over the full build with the same decoder and the
same sets, plain and restricted requests: they must be equal.

    python benchmarks/delta_day.py [--n 1e6] [--deltas 50] [--share 0.001]

Prints one line per delta and a summary; writes benchmarks/results/delta_day.csv.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.decoding import common  # noqa: E402
from benchmarks.lifecycle import BEAM  # noqa: E402
from benchmarks.lifecycle import CONTEXT_VOCAB  # noqa: E402
from benchmarks.lifecycle import HISTORY  # noqa: E402
from benchmarks.lifecycle import LENGTH  # noqa: E402
from benchmarks.lifecycle import MODEL  # noqa: E402
from benchmarks.lifecycle import RESULTS  # noqa: E402
from benchmarks.lifecycle import VOCAB  # noqa: E402
from benchmarks.lifecycle import ServerProcess  # noqa: E402
from benchmarks.lifecycle import distinct_ids  # noqa: E402
from benchmarks.lifecycle import rss  # noqa: E402

COLUMNS = ["delta", "items", "job_s", "swap_s", "server_rss_mib", "notes"]


def run(args) -> list[dict]:
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    import keras
    import numpy as np

    from static_keras import CachedTransformerDecoder
    from static_keras import ConstrainedBeamSearch
    from static_keras import ConstrainedDecoding
    from static_keras import Eligibility
    from static_keras import StaticIndex
    from static_keras.export import publish
    from static_keras.export import read_eligibility
    from static_keras.export import update_catalogue
    from static_keras.index.eligibility import EligibilitySets
    from static_keras.index.eligibility import MemberCatalogue
    from static_keras.serving import GrpcClient
    from static_keras.serving import ServingError

    n = int(float(args.n))
    rng = np.random.default_rng(args.seed)
    rows, keys = distinct_ids(n, args.seed)
    ids = 10**9 + 2 * rng.permutation(n).astype(np.int64)
    stock = ids[rng.permutation(n)[: n // 2]]
    index = StaticIndex.build(rows, VOCAB, item_ids=ids, headroom=args.headroom)
    keras.utils.set_random_seed(args.seed)
    decoder = CachedTransformerDecoder(VOCAB, LENGTH, context_vocab_size=CONTEXT_VOCAB)
    sets = EligibilitySets.build(index, {"in_stock": stock})
    layer = ConstrainedDecoding(index, eligibility=sets, name="constraint")
    search = ConstrainedBeamSearch(constraint=layer, decoder=decoder, beam_size=BEAM,
                                   num_results=RESULTS)  # fmt: skip
    history = keras.Input((HISTORY,), dtype="int32", name="history")
    workdir = tempfile.mkdtemp(prefix="delta_day_")
    base = os.path.join(workdir, MODEL)
    publish(keras.Model(history, search(history)), base, warmup_batch_sizes=(1, 32),
            model_name=MODEL)  # fmt: skip
    del index, layer
    server = ServerProcess(base, os.path.join(workdir, "server.log"))
    client = GrpcClient(server.address, timeout=120)
    probe = {"history": rng.integers(0, CONTEXT_VOCAB, (1, HISTORY)).astype("int32")}

    def serving(version: int, deadline: float = 300) -> float:
        start = time.perf_counter()
        while time.perf_counter() - start < deadline:
            server.check_alive()
            try:
                if client.predict(MODEL, probe)["model_version"] == version:
                    return time.perf_counter() - start
            except ServingError:
                pass
            time.sleep(0.02)
        raise RuntimeError(f"v{version} never answered")

    out = []
    try:
        serving(1)
        first_rss = None
        change = max(1, int(args.share * n))
        next_id = int(ids.max()) + 1
        for delta in range(1, args.deltas + 1):
            gone = rng.choice(len(ids), change, replace=False)
            kept = np.setdiff1d(np.arange(len(ids)), gone)
            added, added_keys = distinct_ids(change, args.seed + delta,
                                             taken=np.sort(keys[kept]))  # fmt: skip
            new_ids = next_id + 2 * np.arange(change, dtype=np.int64)
            next_id += 2 * change
            joining = new_ids[: change // 3]
            start = time.perf_counter()
            info = update_catalogue(base, add_sequences=added, add_item_ids=new_ids,
                                    remove_item_ids=ids[gone], add_to_sets={"in_stock": joining},
                                    keep=2)  # fmt: skip
            job = time.perf_counter() - start
            swap = serving(info.version)
            rows = np.concatenate([rows[kept], added])
            keys = np.concatenate([keys[kept], added_keys])
            ids = np.concatenate([ids[kept], new_ids])
            stock = np.concatenate([np.intersect1d(stock, ids), joining])
            time.sleep(1.5)  # the old version unloaded
            server_rss = rss(server.pid) / 2**20
            first_rss = first_rss or server_rss
            row = {"delta": delta, "items": info.num_items, "job_s": round(job, 3),
                   "swap_s": round(swap, 3), "server_rss_mib": round(server_rss),
                   "notes": f"v{info.version}"}  # fmt: skip
            out.append(row)
            print(f"delta {delta:3d}: {row['items']:,} items, job {job:.2f} s, then served in "
                  f"{swap:.2f} s; server RSS {server_rss:.0f} MiB", flush=True)  # fmt: skip
            assert info.sizes["in_stock"] == len(stock), (info.sizes, len(stock))

        # The full build of the day's catalogue answers as the last delta's version.
        full = StaticIndex.build(rows, VOCAB, item_ids=ids)
        sets = EligibilitySets.build(full, {"in_stock": stock})
        assert read_eligibility(os.path.join(base, str(info.version))).sizes() == sets.sizes()
        oracle = ConstrainedBeamSearch(constraint=ConstrainedDecoding(full, eligibility=sets),
                                       decoder=decoder, beam_size=BEAM,
                                       num_results=RESULTS)  # fmt: skip
        contexts = rng.integers(0, CONTEXT_VOCAB, (16, HISTORY)).astype("int32")
        set_ids = np.zeros(16, np.int32)
        excluded = rng.choice(ids, (16, 4)).astype(np.int64)
        members = MemberCatalogue.from_index(full).exclusion_members(excluded)
        restricted = Eligibility(set_ids, members)
        want_plain = np.asarray(oracle(contexts)["item_ids"])
        want_restricted = np.asarray(oracle(contexts, eligibility=restricted)["item_ids"])
        got_plain = client.predict(MODEL, {"history": contexts})["item_ids"]
        got_restricted = client.predict(
            MODEL, {"history": contexts, "set_id": set_ids, "excluded_item_ids": excluded},
            signature="serving_eligible",
        )["item_ids"]  # fmt: skip
        equal = np.array_equal(got_plain, want_plain) and np.array_equal(
            got_restricted, want_restricted
        )
        last_rss = out[-1]["server_rss_mib"]
        out.append({"delta": "full_build_equal", "items": len(ids), "job_s": None,
                    "swap_s": None, "server_rss_mib": None,
                    "notes": "ok" if equal else "FAIL: answers differ"})  # fmt: skip
        out.append({"delta": "rss_growth", "items": None, "job_s": None, "swap_s": None,
                    "server_rss_mib": last_rss,
                    "notes": f"{last_rss / first_rss:.3f}x the RSS after the first swap "
                             f"({first_rss:.0f} MiB)"})  # fmt: skip
        jobs = [r["job_s"] for r in out if isinstance(r["delta"], int)]
        swaps = [r["swap_s"] for r in out if isinstance(r["delta"], int)]
        job_p50, swap_p50 = common.percentile(jobs, 0.5), common.percentile(swaps, 0.5)
        print(f"{args.deltas} deltas of {change:,} items at N = {n:,}: job p50 {job_p50:.2f} s, "
              f"swap p50 {swap_p50:.2f} s; server RSS {first_rss:.0f} -> {last_rss:.0f} MiB "
              f"({last_rss / first_rss:.3f}x); the last version equals the full build: "
              f"{equal}")  # fmt: skip
        if not equal:
            raise SystemExit("the last delta's answers differ from the full build's")
    finally:
        client.close()
        server.stop()
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", default="1e6")
    parser.add_argument("--deltas", type=int, default=50)
    parser.add_argument("--share", type=float, default=0.001)
    parser.add_argument("--headroom", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--csv", default=os.path.join(common.RESULTS_DIR, "delta_day.csv"))
    args = parser.parse_args(argv)
    rows = run(args)
    common.write_csv(args.csv, rows, COLUMNS)
    print(common.machine_line())
    print(f"wrote {args.csv}")


if __name__ == "__main__":
    main()
