"""Two checkouts' development servers on one version, Predict through gRPC in interleaved rounds.

    python -m benchmarks.served_ab --model-base-path BASE --ids IDS.npy \\
        --tree-a BEFORE --tree-b AFTER [--rounds 20] [--per-round 10]

A before/after of the served path for a change to the server itself (how a
version is loaded and run), where a benchmark in one process cannot hold
both. `static-keras serve-dev` from each tree serves BASE (a lifecycle
catalogue: model `recs`, the README's decoder, one set); each round sends
`--per-round` requests of every kind (`serving_default` and
`serving_eligible`, batch 1 and 32) to A and to B in turn, the order of
the two servers and of the kinds flipped every round so that drift in the
machine's load falls on both alike. Both servers answer every request, and
their answers must be equal (same version, same inputs): a change to the
server changes no answer. Prints the p50 of each kind per server and B/A,
the median over rounds of each round's B/A p50 ratio, and writes a CSV.
`--ids`: item ids of the served catalogue (the excluded ids).
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import tempfile
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import lifecycle  # noqa: E402
from benchmarks.decoding import common  # noqa: E402

KINDS = (("serving_default", 1), ("serving_eligible", 1), ("serving_default", 32),
         ("serving_eligible", 32))  # fmt: skip


class TreeServer(lifecycle.ServerProcess):
    """`serve-dev` run by the code of another checkout (`_use_tree`)."""

    def __init__(self, tree: str, base: str, log_path: str):
        self.tree = os.path.abspath(tree)
        super().__init__(base, log_path)

    def _command(self, arguments: list[str]) -> list[str]:
        launcher = (
            "import sys; from benchmarks.decoding.served_ops import _use_tree; "
            f"_use_tree({self.tree!r}); from static_keras.cli import main; "
            "sys.exit(main(sys.argv[1:]))"
        )
        return [sys.executable, "-c", launcher, *arguments]


def _outputs(response) -> dict:
    import tensorflow as tf

    return {name: tf.make_ndarray(value) for name, value in response.outputs.items()}


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-base-path", required=True)
    parser.add_argument("--ids", required=True, help=".npy of served item ids")
    parser.add_argument("--tree-a", required=True, help="checkout serving as the baseline")
    parser.add_argument("--tree-b", required=True, help="checkout measured against it")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--per-round", type=int, default=10, help="requests per kind and server")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--csv", default=os.path.join(common.RESULTS_DIR, "served_ab.csv"))
    args = parser.parse_args(argv)
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    import numpy as np

    from static_keras.serving import GrpcClient

    requests = lifecycle.Requests(np.random.default_rng(0), np.load(args.ids))
    logs = tempfile.mkdtemp(prefix="served_ab_")
    base = os.path.abspath(args.model_base_path)
    servers = {}
    try:
        # One at a time: two loads at once would share the two cores.
        for name, tree in (("a", args.tree_a), ("b", args.tree_b)):
            servers[name] = TreeServer(tree, base, os.path.join(logs, f"{name}.log"))
            up = servers[name].wait_until_answering(
                requests.proto["serving_default", 1], args.timeout
            )
            print(f"{name}: {tree} up in {up:.1f} s", flush=True)
        clients = {name: GrpcClient(s.address, timeout=120) for name, s in servers.items()}
        times = {(name, kind): [] for name in servers for kind in KINDS}
        ratios = {kind: [] for kind in KINDS}
        for round_ in range(args.rounds + 1):  # round 0 warms both up, untimed
            order = ("a", "b") if round_ % 2 == 0 else ("b", "a")
            kinds = KINDS if round_ % 2 == 0 else KINDS[::-1]
            this_round = {}
            for kind in kinds:
                for name in order:
                    seconds = []
                    for _ in range(args.per_round):
                        start = time.perf_counter()
                        response = clients[name].predict_raw(
                            lifecycle.MODEL, requests.proto[kind], signature=kind[0]
                        )
                        seconds.append(time.perf_counter() - start)
                    # The same inputs every time: the last answer stands for all.
                    this_round[name, kind] = (seconds, _outputs(response))
            for kind in KINDS:
                (a_seconds, a_answer), (b_seconds, b_answer) = (
                    this_round["a", kind],
                    this_round["b", kind],
                )
                for output, value in a_answer.items():
                    if not np.array_equal(value, b_answer[output]):
                        raise SystemExit(f"round {round_}, {kind}: `{output}` differs")
                if round_ == 0:
                    continue
                times["a", kind] += a_seconds
                times["b", kind] += b_seconds
                ratios[kind].append(statistics.median(b_seconds) / statistics.median(a_seconds))
            print(f"round {round_}/{args.rounds}", flush=True)
        for client in clients.values():
            client.close()
        rows = []
        for kind in KINDS:
            a_p50 = statistics.median(times["a", kind])
            b_p50 = statistics.median(times["b", kind])
            rows.append({
                "signature": kind[0], "batch": kind[1],
                "a_p50_ms": round(1e3 * a_p50, 2), "b_p50_ms": round(1e3 * b_p50, 2),
                "b_over_a": round(b_p50 / a_p50, 3),
                "median_round_ratio": round(statistics.median(ratios[kind]), 3),
                "a_p90_ms": round(1e3 * float(np.percentile(times["a", kind], 90)), 2),
                "b_p90_ms": round(1e3 * float(np.percentile(times["b", kind], 90)), 2),
                "requests_each": len(times["a", kind]),
                "a_rss_mib": round(lifecycle.rss(servers["a"].pid) / 2**20),
                "b_rss_mib": round(lifecycle.rss(servers["b"].pid) / 2**20),
            })  # fmt: skip
        print(f"A = {args.tree_a}\nB = {args.tree_b}\nanswers equal in every round")
        for row in rows:
            print(
                f"{row['signature']:>16} b{row['batch']:<3} A {row['a_p50_ms']:7.2f} ms  "
                f"B {row['b_p50_ms']:7.2f} ms  B/A {row['b_over_a']:.3f}  "
                f"(median of rounds {row['median_round_ratio']:.3f}; p90 "
                f"{row['a_p90_ms']:.1f} / {row['b_p90_ms']:.1f} ms)"
            )
        print(common.machine_line())
        with open(args.csv, "w", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        return rows
    finally:
        for server in servers.values():
            server.stop()


if __name__ == "__main__":
    main()
