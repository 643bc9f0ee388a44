"""Peak memory of a static-keras job: any CLI command, in a fresh process.

    python -m benchmarks.job_memory [--tree PATH] [--runs 3] [--csv FILE] \\
        -- publish model.keras --index new.npz --model-base-path BASE --progress

Each run is a fresh process (the job as an operator starts it) whose peak
RSS is read from the kernel (`os.wait4`: that process's own `ru_maxrss`,
forked from a small launcher so that no larger parent's RSS is counted),
with the job's output (its stage lines with `--progress`).
`--tree` runs another checkout's code (its `static_keras`, `export/` and
`serving/`, as `served_ops` does), for a before/after on the same inputs.
A publishing command adds one version to its base path per run.
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


#: Forks the job from a fresh small interpreter and prints its peak: Linux
#: keeps a process's peak RSS across fork and exec, so a job started straight
#: from a large benchmark process (one holding TensorFlow) would report at
#: least that process's RSS (704 MiB for a 342 MiB rules job, measured).
_LAUNCH = """
import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.executable, [sys.executable, "-c", sys.argv[1]])
_, status, usage = os.wait4(pid, 0)
print("{mark}%d" % usage.ru_maxrss, flush=True)
sys.exit(os.waitstatus_to_exitcode(status))
"""
_MARK = "job peak RSS KiB: "


def run_once(tree: str | None, argv: list[str]) -> tuple[float, float, str]:
    """`(peak MiB, seconds, output)` of one job in a fresh process (its
    stdout and stderr together)."""
    start = time.perf_counter()
    run = _RUN.format(tree=tree and os.path.abspath(tree), argv=argv)
    child = subprocess.run(
        [sys.executable, "-c", _LAUNCH.format(mark=_MARK), run],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )  # fmt: skip
    seconds = time.perf_counter() - start
    output, _, peak = child.stdout.rpartition(_MARK)
    if child.returncode:
        raise SystemExit(f"the job failed:\n{output[-3000:]}")
    return int(peak) / 1024, seconds, output


def measure(job: list[str], tree: str | None, runs: int, csv_path: str | None) -> list[float]:
    """Runs `job` `runs` times; prints each run and a summary; returns the peaks."""
    peaks, times = [], []
    for run in range(runs):
        peak, seconds, stages = run_once(tree, job)
        peaks.append(peak)
        times.append(seconds)
        print(f"run {run + 1}: peak {peak:.0f} MiB, {seconds:.2f} s (process)\n{stages}")
        if csv_path:
            new = not os.path.exists(csv_path)
            with open(csv_path, "a", newline="") as file:
                writer = csv.writer(file)
                if new:
                    writer.writerow(["tree", "run", "peak_mib", "seconds", "load_average"])
                writer.writerow([tree or ".", run + 1, round(peak), round(seconds, 2),
                                 round(os.getloadavg()[0], 2)])  # fmt: skip
    print(f"peak {max(peaks):.0f} MiB (max of {runs}), {statistics.median(times):.2f} s p50")
    return peaks


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", help="checkout whose code runs the job (default: this one)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--csv", help="append one row per run")
    parser.add_argument("job", nargs=argparse.REMAINDER, help="-- then the static-keras command")
    args = parser.parse_args(argv)
    job = args.job[1:] if args.job[:1] == ["--"] else args.job
    if not job:
        parser.error("give the static-keras command after --")
    measure(job, args.tree, args.runs, args.csv)


if __name__ == "__main__":
    main()
