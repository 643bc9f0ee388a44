"""The issue's goals, evaluated on one run's decoding_n.csv.

1. STATIC's overhead per step is flat in N: at the largest N at most 1.5x
   the overhead at the smallest. Where STATIC's overhead at the smallest N
   is at or below zero (faster than the unconstrained floor), "1.5x" has no
   meaning; the whole decode step is judged instead ("met (step time)": at
   most 1.5x, and still below the floor).
2. At the largest N, STATIC's overhead is at least 100x lower than PPV
   exact's and the CPU trie's: `static <= baseline / 100`, with a positive
   baseline overhead. (The CPU trie above its build cap is a lower bound.)
   Where STATIC's overhead is negative the ratio is undefined ("undefined";
   the table gives the ratio of whole step times, `step_ratio`, instead).
3. STATIC's overhead is lower than PPV approximate's at every N.

Each goal is checked for STATIC in graph mode (no XLA, what a stock TF
Serving runs) against the baseline in graph mode, and for STATIC with XLA
against the baseline with XLA (the CPU trie has no XLA mode: against its
graph mode).

    python -m benchmarks.decoding.goals [--csv benchmarks/results/decoding_n.csv]

Prints a table and writes benchmarks/results/decoding_goals.csv.
"""

from __future__ import annotations

import argparse
import os
import sys

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from benchmarks.decoding import common  # noqa: E402

COLUMNS = [
    "goal", "mode", "n", "static_ms", "baseline", "baseline_ms", "value", "step_ratio", "met",
    "detail",
]  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", default=os.path.join(common.RESULTS_DIR, "decoding_n.csv"))
    parser.add_argument("--out", default=os.path.join(common.RESULTS_DIR, "decoding_goals.csv"))
    return parser


def main(argv=None) -> list[dict]:
    args = build_parser().parse_args(argv)
    rows = evaluate(common.read_csv(args.csv))
    for row in rows:
        print(
            f"  goal {row['goal']} [{row['mode']}] N={int(row['n']):,}: "
            f"{row['met'].upper()}: {row['detail']}"
        )
    common.write_csv(args.out, rows, COLUMNS)
    print(f"wrote {args.out}")
    return rows


def evaluate(rows: list[dict]) -> list[dict]:
    table = {}
    for row in rows:
        key = (row["method"], row["xla"] == "True", int(row["n"]))
        table[key] = row
    sizes = sorted({int(r["n"]) for r in rows})
    smallest, largest = sizes[0], sizes[-1]
    out = []

    def overhead(method, xla, n):
        row = table.get((method, xla, n))
        return (None, None) if row is None else (float(row["overhead_ms_step_median"]), row)

    def step_ratio(row, reference):
        """Whole-step time of `row` over `reference` (both medians)."""
        return round(float(row["step_ms_median"]) / float(reference["step_ms_median"]), 3)

    for xla in (False, True):
        mode = "XLA" if xla else "graph"
        low, low_row = overhead("static", xla, smallest)
        high, high_row = overhead("static", xla, largest)
        if low is None or high is None:
            continue
        flat_steps = step_ratio(high_row, low_row)
        # Goal 1: flat in N.
        if low > 0:
            value = high / low
            met = "met" if high <= 1.5 * low else "missed"
            detail = f"{high:.4f} / {low:.4f} ms = {value:.2f}x (limit 1.5x)"
        else:
            value = high - low
            met = "met (step time)" if flat_steps <= 1.5 and high <= 0 else "missed"
            detail = (
                f"STATIC is below the floor at every N ({low:.4f} ms at N={smallest:,}, "
                f"{high:.4f} ms at N={largest:,}: {value:+.4f} ms), so 1.5x of the overhead "
                "is undefined; judged on the whole step (limit 1.5x)"
            )
        detail += f"; step time {flat_steps:.2f}x"
        out.append(_row(1, mode, largest, high, "static", low, value, flat_steps, met, detail))
        # Goal 2: >= 100x lower than PPV exact and the CPU trie at the largest N.
        for baseline in ("ppv_exact", "cpu_trie"):
            base, base_row = overhead(baseline, xla and baseline != "cpu_trie", largest)
            if base is None:
                continue
            bound = " (lower bound)" if base_row["measured"] == "lower_bound" else ""
            steps = step_ratio(base_row, high_row)
            if base <= 0:
                value, met = "", "missed"
                detail = f"{baseline}{bound} is not above the floor ({base:.4f} ms)"
            elif high > 0:
                value = base / high
                met = "met" if value >= 100 else "missed"
                detail = f"{baseline}{bound} {base:.4f} ms vs STATIC {high:.4f} ms: {value:.0f}x"
            else:
                value, met = "", "undefined"
                detail = (
                    f"{baseline}{bound} +{base:.4f} ms vs STATIC {high:.4f} ms: STATIC is "
                    "faster than the unconstrained floor, so the overhead ratio is undefined"
                )
            detail += f"; whole step {steps:.1f}x STATIC's"
            out.append(_row(2, mode, largest, high, baseline, base, value, steps, met, detail))
        # Goal 3: below PPV approximate at every N.
        for n in sizes:
            ours, ours_row = overhead("static", xla, n)
            base, base_row = overhead("ppv_approx", xla, n)
            if ours is None or base is None:
                continue
            steps = step_ratio(base_row, ours_row)
            detail = f"STATIC {ours:.4f} ms vs PPV approx {base:.4f} ms; whole step {steps:.2f}x"
            met = "met" if ours < base else "missed"
            out.append(_row(3, mode, n, ours, "ppv_approx", base, base - ours, steps, met, detail))
    return out


def _row(goal, mode, n, static_ms, baseline, baseline_ms, value, steps, met, detail) -> dict:
    return {
        "goal": goal,
        "mode": mode,
        "n": n,
        "static_ms": round(static_ms, 5),
        "baseline": baseline,
        "baseline_ms": round(baseline_ms, 5),
        "value": round(value, 4) if isinstance(value, float) else value,
        "step_ratio": steps,
        "met": met,
        "detail": detail,
    }


if __name__ == "__main__":
    main()
