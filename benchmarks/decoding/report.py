"""Markdown tables of the decoding benchmark CSVs (for docs/benchmarks.md).

python -m benchmarks.decoding.report [--results benchmarks/results]
"""

from __future__ import annotations

import argparse
import os
import sys

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from benchmarks.decoding import common  # noqa: E402

ORDER = [
    ("unconstrained", False),
    ("unconstrained", True),
    ("static", False),
    ("static", True),
    ("cpu_trie", False),
    ("ppv_exact", False),
    ("ppv_exact", True),
    ("ppv_approx", False),
    ("ppv_approx", True),
    ("hash_bitmap", False),
    ("hash_bitmap", True),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default=common.RESULTS_DIR)
    parser.add_argument("--prefix", default="decoding_", help="CSV name prefix")
    return parser


def main(argv=None) -> str:
    args = build_parser().parse_args(argv)
    parts = []
    for sweep, key, title in (
        ("n", "n", "N"),
        ("vocab", "vocab_size", "V"),
        ("rows", "rows", "rows"),
    ):
        path = os.path.join(args.results, f"{args.prefix}{sweep}.csv")
        if os.path.exists(path):
            rows = common.read_csv(path)
            parts.append(f"### Sweep `{sweep}`: time per step, ms (median)\n")
            parts.append(_pivot(rows, key, title, _step_cell))
            parts.append(
                f"### Sweep `{sweep}`: overhead per step vs unconstrained, ms (median / p90)\n"
            )
            parts.append(_pivot(rows, key, title, _overhead_cell, skip_floor=True))
            parts.append(f"### Sweep `{sweep}`: validation against STATIC\n")
            parts.append(_validation(rows, key, title))
    for name, builder in (("kernel", _kernel), ("build", _build), ("goals", _goals)):
        path = os.path.join(args.results, f"{args.prefix}{name}.csv")
        if os.path.exists(path):
            parts.append(builder(common.read_csv(path)))
    text = "\n".join(parts)
    print(text)
    return text


def _label(method, xla):
    return common.LABELS[method] + (" XLA" if xla else "")


def _present(rows):
    keys = {(r["method"], r["xla"] == "True") for r in rows}
    return [k for k in ORDER if k in keys]


def _pivot(rows, key, title, cell, skip_floor=False):
    columns = [k for k in _present(rows) if not (skip_floor and k[0] == "unconstrained")]
    values = sorted({int(r[key]) for r in rows})
    lines = [
        "| " + title + " | " + " | ".join(_label(*c) for c in columns) + " |",
        "|---:|" + "---:|" * len(columns),
    ]
    index = {(int(r[key]), r["method"], r["xla"] == "True"): r for r in rows}
    for value in values:
        cells = []
        for method, xla in columns:
            row = index.get((value, method, xla))
            cells.append(cell(row) if row else "-")
        lines.append(f"| {value:,} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _step_cell(row):
    text = f"{float(row['step_ms_median']):.3f}"
    return text + " (lb)" if row["measured"] == "lower_bound" else text


def _overhead_cell(row):
    text = (
        f"{float(row['overhead_ms_step_median']):+.3f} / {float(row['overhead_ms_step_p90']):+.3f}"
    )
    return "&ge; " + text + " (lb)" if row["measured"] == "lower_bound" else text


def _validation(rows, key, title):
    lines = [
        f"| {title} | method | valid returned | recall vs exact | identical | query FP | "
        "build s | MB | CPU-trie host ms/step |",
        "|---:|---|---:|---:|---|---:|---:|---:|---:|",
    ]
    for row in sorted(rows, key=lambda r: (int(r[key]), r["method"])):
        if row["xla"] == "True" or row["measured"] != "yes" or row["method"] == "unconstrained":
            continue
        lines.append(
            f"| {int(row[key]):,} | {common.LABELS[row['method']]} | {row['valid_frac'] or '-'} | "
            f"{row['recall_vs_exact']} | {row['exact_match']} | {row['query_fp_rate'] or '-'} | "
            f"{row['build_s']} | {row['structure_mb']} | {row['host_ms_step'] or '-'} |"
        )
    return "\n".join(lines) + "\n"


def _kernel(rows):
    lines = [
        "### Kernel time per step, us (median / p90)\n",
        "| kind | B_t | graph | XLA |",
        "|---|---:|---:|---:|",
    ]
    index = {(r["kind"], int(r["b_t"]), r["xla"] == "True"): r for r in rows}
    for kind, width in sorted({(k, b) for k, b, _ in index}, key=lambda x: (x[0] != "vntk", x)):
        cells = []
        for xla in (False, True):
            row = index.get((kind, width, xla))
            cells.append(
                f"{float(row['us_median']):.1f} / {float(row['us_p90']):.1f}" if row else "-"
            )
        lines.append(f"| {kind} | {width} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _build(rows):
    lines = [
        "### Build cost\n",
        "| N | structure | build s | peak RSS GB | input RSS GB | size GB | paper model GB "
        "| note |",
        "|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        lines.append(
            f"| {int(row['n']):,} | {row['structure']} | {row['build_s']} | {row['peak_rss_gb']} | "
            f"{row['input_rss_gb']} | {row['structure_gb']} | {row['paper_model_gb'] or '-'} | "
            f"{row['note']} |"
        )
    return "\n".join(lines) + "\n"


def _goals(rows):
    lines = ["### Goals\n", "| goal | mode | N | met | detail |", "|---|---|---:|---|---|"]
    for row in rows:
        met = "**missed**" if row["met"] == "missed" else row["met"]
        lines.append(
            f"| {row['goal']} | {row['mode']} | {int(row['n']):,} | {met} | {row['detail']} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
