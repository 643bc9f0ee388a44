"""Export and serving benchmark: a 10^6-item index behind a small decoder.

Measures export + publish time, SavedModel size against `index.nbytes` plus
the decoder's weights, the C++ `LoadSavedModel` load time (TF Serving's load
path, XLA off), and Predict latency (p50/p99) and throughput over gRPC and
REST on the development server at batch 1 and 32.

    python benchmarks/serving.py [--items 1000000] [--requests 200]

Prints a table and writes benchmarks/results/serving.csv.
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import tempfile
import time

import numpy as np

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def _directory_bytes(path: str) -> int:
    return sum(
        os.path.getsize(os.path.join(folder, name))
        for folder, _, files in os.walk(path)
        for name in files
    )


def _latencies(call, requests: int, warmup: int = 5) -> np.ndarray:
    for _ in range(warmup):
        call()
    times = np.empty(requests)
    for i in range(requests):
        start = time.perf_counter()
        call()
        times[i] = time.perf_counter() - start
    return times


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--vocab-size", type=int, default=1024)
    parser.add_argument("--length", type=int, default=4)
    parser.add_argument("--beam-size", type=int, default=10)
    parser.add_argument("--requests", type=int, default=200, help="requests per measurement")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--out", default=os.path.join(RESULTS, "serving.csv"))
    args = parser.parse_args(argv)

    import keras

    from static_keras import CachedTransformerDecoder
    from static_keras import ConstrainedBeamSearch
    from static_keras import StaticIndex
    from static_keras.export import publish
    from static_keras.serving import GrpcClient
    from static_keras.serving import RestClient
    from static_keras.serving import ServedModel
    from static_keras.serving.cc_loader import build_runner
    from static_keras.serving.cc_loader import compiler
    from static_keras.serving.cc_loader import run_saved_model
    from static_keras.serving.dev_server import DevServer

    rng = np.random.default_rng(0)
    rows = rng.integers(0, args.vocab_size, size=(args.items, args.length))
    index = StaticIndex.build(
        rows, args.vocab_size, item_ids=np.arange(args.items), on_duplicate_item="first"
    )
    keras.utils.set_random_seed(0)
    history_len, context_vocab = 20, 10_000
    decoder = CachedTransformerDecoder(
        args.vocab_size, args.length, context_vocab_size=context_vocab, hidden_dim=64
    )
    history = keras.Input((history_len,), dtype="int32", name="history")
    search = ConstrainedBeamSearch(index, decoder, beam_size=args.beam_size, num_results=10)
    model = keras.Model(history, search(history))
    decoder_bytes = sum(int(np.prod(w.shape)) * np.dtype(w.dtype).itemsize for w in decoder.weights)

    results = []

    def record(metric, value, unit, **extra):
        row = {"metric": metric, "value": round(float(value), 3), "unit": unit, **extra}
        results.append(row)
        detail = " ".join(f"{k}={v}" for k, v in extra.items())
        print(f"{metric:<34}{row['value']:>14,.3f} {unit:<8} {detail}", flush=True)

    with tempfile.TemporaryDirectory() as workdir:
        base = os.path.join(workdir, "recs")
        info = publish(model, base, warmup_batch_sizes=tuple(args.batch_sizes), model_name="recs")
        size = _directory_bytes(info.path)
        expected = index.nbytes + decoder_bytes
        record("index_items", index.num_sequences, "items")
        record("export_publish_time", info.seconds, "s")
        record("savedmodel_bytes", size, "bytes")
        record("index_plus_decoder_bytes", expected, "bytes",
               index_bytes=index.nbytes, decoder_bytes=decoder_bytes)  # fmt: skip
        record("savedmodel_overhead", 100 * (size - expected) / expected, "%")

        batch = {"history": rng.integers(1, context_vocab, (1, history_len)).astype("int32")}
        if compiler() is not None:
            runner = build_runner()
            loads = [run_saved_model(info.path, batch, binary=runner).load_ms for _ in range(3)]
            record("cc_load_savedmodel_median", np.median(loads), "ms", runs=3)

        with DevServer([ServedModel("recs", base)]) as server:
            grpc_client = GrpcClient(server.grpc_address, timeout=60)
            rest = RestClient(server.rest_url, timeout=60)
            for batch_size in args.batch_sizes:
                inputs = {
                    "history": rng.integers(1, context_vocab, (batch_size, history_len)).astype(
                        "int32"
                    )
                }
                for protocol, client in (("grpc", grpc_client), ("rest", rest)):
                    times = _latencies(lambda: client.predict("recs", inputs), args.requests)
                    extra = {"protocol": protocol, "batch": batch_size, "requests": args.requests}
                    record("predict_p50", 1e3 * np.percentile(times, 50), "ms", **extra)
                    record("predict_p99", 1e3 * np.percentile(times, 99), "ms", **extra)
                    record("throughput", batch_size * len(times) / times.sum(), "rows/s", **extra)
            grpc_client.close()

    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    fields = ["metric", "value", "unit", "protocol", "batch", "requests", "runs",
              "index_bytes", "decoder_bytes"]  # fmt: skip
    with open(args.out, "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=fields)
        writer.writeheader()
        writer.writerows(results)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cpus; wrote {args.out}")
    return results


if __name__ == "__main__":
    main()
