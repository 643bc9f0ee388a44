"""Peak memory of a rules job: `static-keras refresh-eligibility` on a served version.

    python -m benchmarks.rules_job_memory --model-base-path BASE --set in_stock=ids.npy \\
        [--tree PATH [--no-stage-lines]] [--runs 3] [--csv FILE]

Each run is a fresh process (`benchmarks/job_memory.py`, which measures any
command) whose peak RSS is read from the kernel, with the job's own stage
lines (`--progress`). `--tree` runs another checkout's code
(its `static_keras`, `export/` and `serving/`, as `served_ops` does), for a
before/after on the same version. The base path gains one version per run.
"""

from __future__ import annotations

import argparse

from benchmarks import job_memory


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
    job_memory.measure(job, args.tree, args.runs, args.csv)


if __name__ == "__main__":
    main()
