"""Beam index build benchmark: wall time, peak RSS per process, output bytes.

Random semantic IDs (L = 8, V = 2048, d = 2 by default) are written as
Parquet shards (one uint16 column per position), then built into an index
with `build_index_beam` on Beam's local runner (multi-processing, one SDK
worker process per `--workers`), and, for N up to `--in-process-max`, with
the in-process `StaticIndex.build` of the same data read from the same
shards. Each build runs in a fresh process; this process samples the RSS of
that process and of all its children (the Beam workers) every 0.2 s with
psutil, and reports the peak of each process and of their sum.

    python benchmarks/beam_build.py --sizes 2e7 1e8 --in-process-max 2e7

Prints a table and writes benchmarks/results/beam_build.csv.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time

if __package__ in (None, ""):  # run as a script: python benchmarks/beam_build.py
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.decoding.common import write_csv  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def _generate(folder: str, n: int, vocab_size: int, length: int, shard_rows: int, seed: int):
    """Parquet shards of n random rows (reused when already there)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as parquet

    os.makedirs(folder, exist_ok=True)
    done = os.path.join(folder, "DONE")
    if os.path.exists(done):
        return
    rng = np.random.default_rng(seed)
    for shard, start in enumerate(range(0, n, shard_rows)):
        rows = rng.integers(
            0, vocab_size, size=(min(shard_rows, n - start), length), dtype=np.uint16
        )
        table = pa.table({f"t{t}": rows[:, t] for t in range(length)})
        parquet.write_table(table, os.path.join(folder, f"ids-{shard:05d}.parquet"))
    open(done, "w").close()


def _child_beam(args) -> dict:
    from static_keras.index.beam_build import build_index_beam

    options = [f"--direct_num_workers={args.workers}"]
    if args.workers > 1:
        options.append("--direct_running_mode=multi_processing")
    start = time.perf_counter()
    index = build_index_beam(
        os.path.join(args.data, "*.parquet"),
        args.vocab_size,
        args.out_file,
        dense_levels=args.dense_levels,
        pipeline_options=options,
    )
    seconds = time.perf_counter() - start
    return {
        "wall_s": round(seconds, 2),
        "index_bytes": index.nbytes,
        "dense_levels": index.dense_levels,
        "step_widths": " ".join(map(str, index.step_widths)),
        "checksum": index.checksum,
        "self_peak_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9,
    }


def _child_in_process(args) -> dict:
    import glob

    import numpy as np
    import pyarrow.parquet as parquet

    from static_keras import StaticIndex

    start = time.perf_counter()
    parts = []
    for path in sorted(glob.glob(os.path.join(args.data, "*.parquet"))):
        table = parquet.read_table(path)
        parts.append(np.stack([c.to_numpy() for c in table.columns], axis=1).astype(np.uint16))
    ids = np.concatenate(parts)
    del parts
    read_s = time.perf_counter() - start
    index = StaticIndex.build(ids, args.vocab_size, dense_levels=args.dense_levels)
    index.save(args.out_file)
    seconds = time.perf_counter() - start
    return {
        "wall_s": round(seconds, 2),
        "read_s": round(read_s, 2),
        "index_bytes": index.nbytes,
        "dense_levels": index.dense_levels,
        "step_widths": " ".join(map(str, index.step_widths)),
        "checksum": index.checksum,
        "self_peak_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9,
    }


def _measure(command: list[str]) -> tuple[dict, dict]:
    """Runs `command`, sampling the RSS of it and its children; (result, rss)."""
    import psutil

    load_before = os.getloadavg()[0]
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    root = psutil.Process(process.pid)
    peaks: dict[int, tuple[float, str]] = {}
    total = 0.0
    while process.poll() is None:
        try:
            members = [root] + root.children(recursive=True)
        except psutil.NoSuchProcess:
            break
        now = 0.0
        for member in members:
            try:
                rss = member.memory_info().rss / 1e9
                role = "driver" if member.pid == root.pid else "worker"
            except psutil.Error:
                continue
            now += rss
            if rss > peaks.get(member.pid, (0.0, role))[0]:
                peaks[member.pid] = (rss, role)
        total = max(total, now)
        time.sleep(0.2)
    output = process.stdout.read()
    if process.wait() != 0:
        raise SystemExit(f"{command} failed")
    result = json.loads(output.strip().splitlines()[-1])
    # CPU of the whole tree: workers are reaped by the build, the build by us.
    cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = cpu.ru_utime + cpu.ru_stime - cpu_before.ru_utime - cpu_before.ru_stime
    # Short-lived helpers (a shell, a pip check) are not workers.
    workers = [rss for rss, role in peaks.values() if role == "worker" and rss > 0.05]
    rss = {
        "driver_peak_gb": round(max(result.pop("self_peak_gb"), peaks[root.pid][0]), 3),
        "worker_peak_gb": round(max(workers), 3) if workers else 0.0,
        "worker_peaks_gb": " ".join(f"{w:.2f}" for w in sorted(workers, reverse=True)),
        "total_peak_gb": round(total, 3),
        "cpu_s": round(cpu_s, 1),
        "load_before": round(load_before, 2),
        "load_after": round(os.getloadavg()[0], 2),
    }
    return result, rss


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", type=float, default=[2e7])
    parser.add_argument("--vocab-size", type=int, default=2048)
    parser.add_argument("--length", type=int, default=8)
    parser.add_argument("--dense-levels", type=int, default=2)
    parser.add_argument("--shard-rows", type=float, default=1e6, help="rows per Parquet shard")
    parser.add_argument("--workers", type=int, default=2, help="Beam SDK worker processes")
    parser.add_argument("--in-process-max", type=float, default=2e7, help="largest in-process N")
    parser.add_argument("--data-root", default=os.path.join(tempfile.gettempdir(), "sk-beam-bench"))
    parser.add_argument("--keep-data", action="store_true", help="keep the shards afterwards")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=os.path.join(RESULTS, "beam_build.csv"))
    parser.add_argument("--child", choices=["beam", "in-process"], help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--out-file", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:
        run = _child_beam if args.child == "beam" else _child_in_process
        print(json.dumps(run(args)))
        return

    rows = []
    for size in args.sizes:
        n = int(size)
        data = os.path.join(args.data_root, f"n{n}-v{args.vocab_size}-l{args.length}")
        start = time.perf_counter()
        _generate(data, n, args.vocab_size, args.length, int(args.shard_rows), args.seed)
        print(f"N={n:,}: shards ready in {time.perf_counter() - start:.0f} s", flush=True)
        input_bytes = sum(
            os.path.getsize(os.path.join(data, f))
            for f in os.listdir(data)
            if f.endswith(".parquet")
        )
        runners = ["beam"] + (["in-process"] if n <= args.in_process_max else [])
        for runner in runners:
            out_file = os.path.join(args.data_root, f"index-{runner}-{n}.npz")
            command = [
                sys.executable, __file__, "--child", runner, "--data", data,
                "--out-file", out_file, "--vocab-size", str(args.vocab_size),
                "--dense-levels", str(args.dense_levels), "--workers", str(args.workers),
            ]  # fmt: skip
            result, rss = _measure(command)
            row = {
                "runner": runner if runner == "in-process" else f"beam local x{args.workers}",
                "n": n,
                "shards": len([f for f in os.listdir(data) if f.endswith(".parquet")]),
                "input_bytes": input_bytes,
                **result,
                "file_bytes": os.path.getsize(out_file),
                **rss,
            }
            if runner == "in-process":
                row["same_as_beam"] = row["checksum"] == rows[-1]["checksum"]
            rows.append(row)
            os.unlink(out_file)
            print(_format(row), flush=True)
        if not args.keep_data:
            for name in os.listdir(data):
                os.unlink(os.path.join(data, name))
            os.rmdir(data)
    write_csv(args.out, rows)
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cpus, python {platform.python_version()}"
    )
    print(f"wrote {args.out}")


def _format(row: dict) -> str:
    return (
        f"{row['runner']:<14} N={row['n']:>12,}  wall {row['wall_s']:8.1f} s  peak RSS: driver "
        f"{row['driver_peak_gb']:5.2f} GB, worker max {row['worker_peak_gb']:5.2f} GB "
        f"({row['worker_peaks_gb'] or '-'}), total {row['total_peak_gb']:5.2f} GB  output "
        f"{row['file_bytes'] / 1e9:.3f} GB  cpu {row['cpu_s']:.0f} s  load "
        f"{row['load_before']}->{row['load_after']}"
        + (f"  same index: {row['same_as_beam']}" if "same_as_beam" in row else "")
    )


if __name__ == "__main__":
    main()
