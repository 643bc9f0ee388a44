"""The paper's whole range on one machine: the lifecycle and the decode from 10^5 to 10^8.

    python benchmarks/paper_range.py [--sizes 1e5 1e6 1e7 2e7 1e8]
        [--peer ../shared/peers/static-constraint-decoding] [--out-dir DIR]
    python benchmarks/paper_range.py --report-only     # the table and plot from what ran

Per N, two parts, each a fresh process, each written to its own CSV under
`--out-dir` (default benchmarks/results/paper_range/) and skipped when that
CSV is already there (resumable: the top sizes take most of an hour, so run
them by hand, one at a time, alone, under a memory watchdog):

- `lifecycle_<N>.csv`: `benchmarks/lifecycle.py --sizes N` (build, publish,
  the C++ load, Predict p50 through `serve-dev`, eligible cost through the
  development server and C++ `Session::Run`, rules change, catalogue delta
  and full catalogue change, each from outside). A run that failed (its
  `run` row says FAIL) is run again next time.
- `decode_<N>.csv`: `benchmarks/decoding/versus_reference.py --backend
  tensorflow --configs "2x70 tpb30"` (the reference's own benchmark shape):
  whole 8-step decodes, interleaved with the reference STATIC code where it
  fits in memory, with our floor (the same search with no index read).
  The reference's build needs about 0.44 GB per 10^6 items (8.8 GB measured
  at 2x10^7, `build_versus_reference.csv`), so at 10^8 (about 44 GB) it
  cannot run on a 24 GB machine: there, ours alone (`--ours-only`), and the
  table says why.

Then `paper_range.csv` (one row per N) and `docs/img/paper_range.png`: step
time and served Predict p50 against N, beside the paper's Table 4a (TPU,
0.023 ms per step at 10^5 to 0.039 ms at 10^8, its two ends as the issue
quotes them: the middle rows are not in this repository).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.decoding import common  # noqa: E402

OUT_DIR = os.path.join(common.RESULTS_DIR, "paper_range")
FIGURE = os.path.join(common.REPO, "docs", "img", "paper_range.png")
SIZES = ("1e5", "1e6", "1e7", "2e7", "1e8")
CONFIG = "2x70 tpb30"
REFERENCE_GB_PER_MILLION = 0.44  # its build's peak: 8.8 GB at 2x10^7
PAPER_STEP_MS = {100_000: 0.023, 100_000_000: 0.039}  # Table 4a, TPU, its two ends
LIFECYCLE = {  # column: (stage, field) of lifecycle.py's CSV
    "build_s": ("index_build", "seconds"),
    "publish_s": ("publish_v1", "seconds"),
    "publish_peak_mib": ("publish_v1", "peak_rss_mib"),
    "cc_load_s": ("cc_load", "seconds"),
    "p50_plain_b1_ms": ("predict_default_b1", "p50_ms"),
    "p50_plain_b32_ms": ("predict_default_b32", "p50_ms"),
    "p50_eligible_b1_ms": ("predict_eligible_b1", "p50_ms"),
    "p50_eligible_b32_ms": ("predict_eligible_b32", "p50_ms"),
    "eligible_cost_b1": ("eligible_cost_b1", "ratio"),
    "eligible_cost_b32": ("eligible_cost_b32", "ratio"),
    "eligible_cost_b1_cc": ("eligible_cost_b1_cc", "ratio"),
    "eligible_cost_b32_cc": ("eligible_cost_b32_cc", "ratio"),
    "server_rss_mib": ("server_rss_one_version", "peak_rss_mib"),
    "rules_s": ("rules_change", "seconds"),
    "delta_1pct_s": ("catalogue_delta", "seconds"),
    "add_1000_s": ("catalogue_add_1000", "seconds"),
    "full_change_s": ("catalogue_change", "seconds"),
}
DECODE = {  # column: mode of versus_reference.py's CSV (whole 8-step decodes)
    "decode_graph_ms": "TF graph, no XLA",
    "decode_xla_ms": "TF jit_compile",
    "floor_graph_ms": "floor: TF graph, no XLA",
    "floor_xla_ms": "floor: TF jit_compile",
}


def memory_gb() -> float:
    with open("/proc/meminfo") as meminfo:
        total_kb = int(next(line for line in meminfo if line.startswith("MemTotal")).split()[1])
    return total_kb / 2**20


def reference_fits(n: int, total_gb: float | None = None) -> tuple[bool, str]:
    """Whether the reference's build fits in this machine's memory, and why not."""
    total_gb = memory_gb() if total_gb is None else total_gb
    need = REFERENCE_GB_PER_MILLION * n / 1e6
    if need > 0.6 * total_gb:  # our side and the ids need the rest
        return False, f"reference build needs about {need:.0f} GB, machine has {total_gb:.0f} GB"
    return True, ""


def done(path: str) -> bool:
    if not os.path.exists(path):
        return False
    return not any(row.get("status") == "FAIL" and row.get("stage") == "run"
                   for row in common.read_csv(path))  # fmt: skip


def run_lifecycle(n: int, out_dir: str, extra: list[str]) -> None:
    path = os.path.join(out_dir, f"lifecycle_{n}.csv")
    if done(path):
        print(f"N = {n:,}: lifecycle already in {path}", flush=True)
        return
    command = [sys.executable, os.path.join(common.REPO, "benchmarks", "lifecycle.py"),
               "--sizes", str(n), "--csv", path, *extra]  # fmt: skip
    print(f"N = {n:,}: lifecycle", flush=True)
    subprocess.run(command, cwd=common.REPO, check=False)


def run_decode(n: int, out_dir: str, peer: str | None, rounds: int) -> None:
    path = os.path.join(out_dir, f"decode_{n}.csv")
    if os.path.exists(path):
        print(f"N = {n:,}: decode already in {path}", flush=True)
        return
    fits, why = reference_fits(n)
    ours_only = not (peer and fits)
    scratch = os.path.join(out_dir, f"decode_{n}.tmp")
    command = [sys.executable, "-m", "benchmarks.decoding.versus_reference", "--backend",
               "tensorflow", "--sizes", str(n), "--configs", CONFIG, "--rounds", str(rounds),
               "--out-dir", scratch]  # fmt: skip
    command += ["--ours-only"] if ours_only else ["--peer", peer]
    print(f"N = {n:,}: decode" + (f" (ours only: {why or 'no --peer'})" if ours_only else ""),
          flush=True)  # fmt: skip
    if subprocess.run(command, cwd=common.REPO, check=False).returncode != 0:
        print(f"N = {n:,}: decode failed", flush=True)
        return
    rows = common.read_csv(os.path.join(scratch, "versus_reference_tensorflow.csv"))
    for row in rows:
        row["reference_note"] = why or ("" if peer else "no --peer given")
    common.write_csv(path + ".part", rows)
    os.replace(path + ".part", path)  # a half-written CSV is never read as done
    shutil.rmtree(scratch)


def _number(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def summary_row(n: int, out_dir: str) -> dict | None:
    """One N's figures from its two CSVs (None where neither ran)."""
    row: dict = {"n": n}
    lifecycle = os.path.join(out_dir, f"lifecycle_{n}.csv")
    decode = os.path.join(out_dir, f"decode_{n}.csv")
    if not (os.path.exists(lifecycle) or os.path.exists(decode)):
        return None
    if os.path.exists(lifecycle):
        stages = {r["stage"]: r for r in common.read_csv(lifecycle)}
        for column, (stage, field) in LIFECYCLE.items():
            row[column] = _number(stages.get(stage, {}).get(field))
    if os.path.exists(decode):
        modes = {r["mode"]: r for r in common.read_csv(decode)}
        for column, mode in DECODE.items():
            row[column] = _number(modes.get(mode, {}).get("ours_ms"))
        first = next(iter(modes.values()), {})
        row["reference_ms"] = _number(first.get("reference_ms"))
        row["ratio_graph"] = _number(modes.get(DECODE["decode_graph_ms"], {}).get("ratio_median"))
        row["ratio_xla"] = _number(modes.get(DECODE["decode_xla_ms"], {}).get("ratio_median"))
        row["reference_note"] = first.get("reference_note", "")
    for mode in ("graph", "xla"):  # what the index adds per step over the floor
        decode_ms, floor_ms = row.get(f"decode_{mode}_ms"), row.get(f"floor_{mode}_ms")
        if decode_ms is not None and floor_ms is not None:
            row[f"index_step_{mode}_ms"] = (decode_ms - floor_ms) / 8
    row["paper_step_ms"] = PAPER_STEP_MS.get(n)
    return row


def _n_label(n: int) -> str:
    """10^5, 2x10^7: N as the paper writes it."""
    exponent = len(str(n)) - 1
    lead = n // 10**exponent
    return f"{lead}x10^{exponent}" if lead != 1 else f"10^{exponent}"


def _cell(value, digits=2, suffix=""):
    return "-" if value is None else f"{value:.{digits}f}{suffix}"


def report(sizes: list[int], out_dir: str, figure: str | None) -> list[dict]:
    rows = [row for n in sizes if (row := summary_row(n, out_dir))]
    if not rows:
        print("nothing measured yet")
        return rows
    common.write_csv(os.path.join(out_dir, "paper_range.csv"), rows)
    print("| N | build s | publish s (process peak GiB) | Predict p50 b1 / b32 ms | "
          "eligible/plain b1, b32 (dev server; C++) | rules s | 1 % delta s | full change s | "
          "decode ms graph / XLA (floor) | reference ms | "
          "index per step ms graph / XLA |")  # fmt: skip
    print("|" + "---|" * 11)
    for r in rows:
        peak = r.get("publish_peak_mib")
        reference = r.get("reference_ms")
        reference = _cell(reference) if reference else r.get("reference_note") or "-"
        print(
            f"| {_n_label(r['n'])} | {_cell(r.get('build_s'), 1)} | {_cell(r.get('publish_s'), 1)} "
            f"({_cell(peak and peak / 1024, 1)}) | {_cell(r.get('p50_plain_b1_ms'), 1)} / "
            f"{_cell(r.get('p50_plain_b32_ms'), 1)} | {_cell(r.get('eligible_cost_b1'))}x, "
            f"{_cell(r.get('eligible_cost_b32'))}x; {_cell(r.get('eligible_cost_b1_cc'))}x, "
            f"{_cell(r.get('eligible_cost_b32_cc'))}x | {_cell(r.get('rules_s'), 1)} | "
            f"{_cell(r.get('delta_1pct_s'), 1)} | {_cell(r.get('full_change_s'), 1)} | "
            f"{_cell(r.get('decode_graph_ms'))} / {_cell(r.get('decode_xla_ms'))} "
            f"({_cell(r.get('floor_graph_ms'))} / {_cell(r.get('floor_xla_ms'))}) | "
            f"{reference} | "
            f"{_cell(r.get('index_step_graph_ms'), 3)} / {_cell(r.get('index_step_xla_ms'), 3)} |"
        )  # fmt: skip
    if figure:
        plot(rows, figure)
        print(f"wrote {figure}")
    return rows


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (steps, share, served) = plt.subplots(1, 3, figsize=(15, 4.2))

    def line(axis, column, label, scale=1.0, **style):
        points = [(r["n"], r[column] * scale) for r in rows if r.get(column) is not None]
        if points:
            axis.plot(*zip(*points), marker="o", label=label, **style)

    line(steps, "decode_graph_ms", "ours, TF graph (TF Serving's default)", 1 / 8)
    line(steps, "decode_xla_ms", "ours, TF XLA", 1 / 8)
    line(steps, "floor_graph_ms", "floor (no index read), TF graph", 1 / 8, linestyle=":")
    line(steps, "reference_ms", "reference STATIC, JAX jit", 1 / 8)
    steps.set(xscale="log", yscale="log", xlabel="items N", ylabel="ms per decode step",
              title=f"Whole decode step, batch 2 x beam 70 ({CONFIG})")  # fmt: skip
    # What the index adds per step: the quantity the paper's Table 4a
    # reports. It is a difference of two medians, so it can read below 0.
    line(share, "index_step_graph_ms", "ours, TF graph")
    line(share, "index_step_xla_ms", "ours, TF XLA")
    paper = sorted(PAPER_STEP_MS.items())
    share.plot(*zip(*paper), "k--", marker="s", label="paper Table 4a (TPU v6e), its ends")
    share.axhline(0, color="grey", linewidth=0.8)
    share.set(xscale="log", xlabel="items N", ylabel="ms per step over the floor",
              title="The constraint's cost per step")  # fmt: skip
    line(served, "p50_plain_b1_ms", "serving_default, batch 1")
    line(served, "p50_eligible_b1_ms", "serving_eligible, batch 1")
    line(served, "p50_plain_b32_ms", "serving_default, batch 32")
    line(served, "p50_eligible_b32_ms", "serving_eligible, batch 32")
    served.set(xscale="log", yscale="log", xlabel="items N", ylabel="Predict p50 (ms)",
               title="Served Predict through serve-dev (beam 20)")  # fmt: skip
    for axis in (steps, share, served):
        axis.grid(True, which="both", alpha=0.3)
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize=7)
    fig.suptitle("static-keras on a 2-core CPU against N, beside the STATIC paper's Table 4a",
                 fontsize=10)  # fmt: skip
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path + ".part.png", dpi=110)
    os.replace(path + ".part.png", path)


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=list(SIZES))
    parser.add_argument("--peer", help="path of static-constraint-decoding (else ours only)")
    parser.add_argument("--out-dir", default=OUT_DIR)
    parser.add_argument("--rounds", type=int, default=15, help="decode rounds per N")
    parser.add_argument("--figure", default=FIGURE, help="the plot ('' for none)")
    parser.add_argument("--skip", choices=("lifecycle", "decode"), action="append", default=[])
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--lifecycle-args", default="", help="extra lifecycle.py flags")
    args = parser.parse_args(argv)
    sizes = [int(float(size)) for size in args.sizes]
    os.makedirs(args.out_dir, exist_ok=True)
    if not args.report_only:
        for n in sizes:
            if "lifecycle" not in args.skip:
                run_lifecycle(n, args.out_dir, args.lifecycle_args.split())
            if "decode" not in args.skip:
                run_decode(n, args.out_dir, args.peer, args.rounds)
    rows = report(sizes, args.out_dir, args.figure or None)
    print(common.machine_line())
    return rows


if __name__ == "__main__":
    main()
