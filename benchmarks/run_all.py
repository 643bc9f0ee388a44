"""Runs the decoding benchmark suite: STATIC against its baselines, in one run.

Parts, in order: `build` (build time, peak RSS, bytes against N), `n`,
`vocab` and `rows` (constraint overhead per decoding step; see
benchmarks/decoding/decode_sweep.py), `kernel` (STATIC's step kernel against
B_t), then `goals` (the issue's goals on the `n` sweep), `plots` (PNGs) and
`report` (the tables as Markdown, on stdout).
Every point of the full run gets its own process. Results are CSVs named
decoding_<part>.csv (decoding_gpu_<part>.csv with `--device gpu`, so GPU
figures sit next to the CPU ones), plots decoding_<part>.png likewise.

    python benchmarks/run_all.py                 # full run, CPU, ~30 min
    python benchmarks/run_all.py --quick         # tiny sizes, about a minute
    python benchmarks/run_all.py --device gpu    # the same on a CUDA GPU

The full run writes benchmarks/results/ and docs/img/; `--quick` writes to a
fresh temporary directory unless `--results-dir` is given, so a smoke run
never overwrites recorded results.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.decoding import common  # noqa: E402

PARTS = ("build", "n", "vocab", "rows", "kernel", "goals", "plots", "report")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="static-keras bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes for CI (no timing claims)")
    parser.add_argument(
        "--device", choices=["cpu", "gpu"], default="cpu", help="where to decode (default cpu)"
    )
    parser.add_argument(
        "--results-dir",
        "--out",
        dest="results_dir",
        help="CSV directory (default benchmarks/results; quick: a temporary directory)",
    )
    parser.add_argument("--img-dir", help="PNG directory (default docs/img; quick: results dir)")
    parser.add_argument("--only", nargs="+", choices=PARTS, help="run only these parts")
    parser.add_argument("--skip", nargs="+", choices=PARTS, default=[], help="skip these parts")
    parser.add_argument("--sizes", nargs="+", type=float, help="N values of the build and n parts")
    return parser


def main(argv=None) -> int:
    """Entry point of `static-keras bench`; returns an exit code."""
    args = build_parser().parse_args(argv)
    from benchmarks.decoding import build_cost
    from benchmarks.decoding import decode_sweep
    from benchmarks.decoding import goals
    from benchmarks.decoding import kernel
    from benchmarks.decoding import plots
    from benchmarks.decoding import report

    if args.results_dir:
        results = args.results_dir
    elif args.quick:
        results = tempfile.mkdtemp(prefix="static_keras_bench_")
    else:
        results = common.RESULTS_DIR
    images = args.img_dir or (results if args.quick else common.IMG_DIR)
    os.makedirs(results, exist_ok=True)
    parts = [p for p in (args.only or PARTS) if p not in args.skip]
    common_flags = ["--device", args.device] + (["--quick"] if args.quick else [])
    sizes = ["--sizes", *map(str, args.sizes)] if args.sizes else []

    # GPU results sit next to the CPU ones: decoding_gpu_<part>.csv / .png.
    prefix = "decoding_" if args.device == "cpu" else f"decoding_{args.device}_"

    def path(part: str) -> str:
        return os.path.join(results, f"{prefix}{part}.csv")

    started = time.perf_counter()
    print(f"static-keras bench: device {args.device}, quick {args.quick}, results {results}")
    if not args.quick:
        # The machine and versions, next to the numbers.
        common.configure_device(args.device)
        info = common.machine_info(args.device)
        common.write_csv(path("machine"), [info])
        print("machine: " + ", ".join(f"{k}={v}" for k, v in info.items()))
    for part in parts:
        part_start = time.perf_counter()
        print(f"== {part}", flush=True)
        if part == "build":
            build_cost.main(common_flags + sizes + ["--out", path("build")])
        elif part in ("n", "vocab", "rows"):
            extra = sizes if part == "n" else []
            decode_sweep.main(common_flags + extra + ["--sweep", part, "--out", path(part)])
        elif part == "kernel":
            kernel.main(common_flags + ["--out", path("kernel")])
        elif part == "goals" and os.path.exists(path("n")):
            goals.main(["--csv", path("n"), "--out", path("goals")])
        elif part == "plots":
            plots.main(["--results", results, "--img", images, "--prefix", prefix])
        elif part == "report":
            report.main(["--results", results, "--prefix", prefix])
        print(f"== {part} done in {time.perf_counter() - part_start:.0f} s", flush=True)
    if not args.quick:
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        print(f"load average (1 min) at the end: {load:.2f}")
    print(f"all done in {time.perf_counter() - started:.0f} s; results in {results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
