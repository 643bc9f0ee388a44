"""Peak memory of a rules job: `static-keras refresh-eligibility` on a served version.

    python -m benchmarks.rules_job_memory --model-base-path BASE --set in_stock=ids.npy \\
        [--tree PATH [--no-stage-lines]] [--runs 3] [--csv FILE]

Each run is a fresh process (the job as an operator starts it) whose peak
RSS is read from the kernel (`ru_maxrss` of the finished child), with the
job's own stage lines (`--progress`). `--tree` runs another checkout's code
(its `static_keras`, `export/` and `serving/`, as `served_ops` does), for a
before/after on the same version. The base path gains one version per run.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import time

_RUN = """
import sys
tree = {tree!r}
if tree:
    from benchmarks.decoding.served_ops import _use_tree
    _use_tree(tree)
from static_keras.cli import main
sys.exit(main({argv!r}))
"""


def run_once(tree: str | None, argv: list[str]) -> tuple[float, float, str]:
    """`(peak MiB, seconds, stderr)` of one job in a fresh process; the peak
    is that child's own (`os.wait4`), not the maximum over earlier runs."""
    start = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-c", _RUN.format(tree=tree and os.path.abspath(tree), argv=argv)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )  # fmt: skip
    stderr = child.stderr.read()
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"the job failed:\n{stderr[-3000:]}")
    return usage.ru_maxrss / 1024, seconds, stderr


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-base-path", required=True)
    parser.add_argument("--set", action="append", required=True, metavar="NAME=FILE")
    parser.add_argument("--tree", help="checkout whose code runs the job (default: this one)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--csv", help="append one row per run")
    parser.add_argument(
        "--no-stage-lines", action="store_true", help="for trees older than `--progress`"
    )
    args = parser.parse_args(argv)
    job = ["refresh-eligibility", "--model-base-path", args.model_base_path]
    job += [] if args.no_stage_lines else ["--progress"]
    for spec in args.set:
        job += ["--set", spec]
    peaks, times = [], []
    for run in range(args.runs):
        peak, seconds, stages = run_once(args.tree, job)
        peaks.append(peak)
        times.append(seconds)
        print(f"run {run + 1}: peak {peak:.0f} MiB, {seconds:.2f} s (process)\n{stages}")
        if args.csv:
            new = not os.path.exists(args.csv)
            with open(args.csv, "a", newline="") as file:
                writer = csv.writer(file)
                if new:
                    writer.writerow(["tree", "run", "peak_mib", "seconds", "load_average"])
                writer.writerow([args.tree or ".", run + 1, round(peak), round(seconds, 2),
                                 round(os.getloadavg()[0], 2)])  # fmt: skip
    print(f"peak {max(peaks):.0f} MiB (max of {args.runs}), {statistics.median(times):.2f} s p50")


if __name__ == "__main__":
    main()
