"""PNG plots of the decoding benchmark CSVs (matplotlib, Agg backend).

    python -m benchmarks.decoding.plots [--results benchmarks/results] [--img docs/img]

Reads decoding_{n,vocab,rows,kernel,build}.csv where present and writes
docs/img/decoding_*.png.
"""

from __future__ import annotations

import argparse
import os
import sys

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from benchmarks.decoding import common  # noqa: E402

STYLE = {
    "unconstrained": ("black", "o"),
    "static": ("tab:red", "s"),
    "cpu_trie": ("tab:brown", "v"),
    "ppv_exact": ("tab:blue", "^"),
    "ppv_approx": ("tab:cyan", "D"),
    "hash_bitmap": ("tab:green", "P"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default=common.RESULTS_DIR)
    parser.add_argument("--img", default=common.IMG_DIR)
    parser.add_argument("--prefix", default="decoding_", help="CSV and PNG name prefix")
    return parser


def main(argv=None) -> list[str]:
    args = build_parser().parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    os.makedirs(args.img, exist_ok=True)
    written = []
    for sweep, x_key, x_label in (
        ("n", "n", "constraint-set size N"),
        ("vocab", "vocab_size", "vocabulary V"),
        ("rows", "rows", "rows (batch x beam)"),
    ):
        path = os.path.join(args.results, f"{args.prefix}{sweep}.csv")
        if os.path.exists(path):
            out = os.path.join(args.img, f"{args.prefix}{sweep}.png")
            _plot_sweep(common.read_csv(path), x_key, x_label, out)
            written.append(out)
    path = os.path.join(args.results, f"{args.prefix}kernel.csv")
    if os.path.exists(path):
        out = os.path.join(args.img, f"{args.prefix}kernel.png")
        _plot_kernel(common.read_csv(path), out)
        written.append(out)
    path = os.path.join(args.results, f"{args.prefix}build.csv")
    if os.path.exists(path):
        out = os.path.join(args.img, f"{args.prefix}build.png")
        _plot_build(common.read_csv(path), out)
        written.append(out)
    for out in written:
        print(f"wrote {out}")
    return written


def _series(rows, x_key):
    """{(method, xla, measured): sorted [(x, row)]}."""
    series = {}
    for row in rows:
        key = (row["method"], row["xla"] == "True", row["measured"])
        series.setdefault(key, []).append((float(row[x_key]), row))
    return {key: sorted(points, key=lambda p: p[0]) for key, points in series.items()}


def _label(method, xla, measured):
    text = common.LABELS[method] + (" XLA" if xla else "")
    return text + (" (lower bound)" if measured == "lower_bound" else "")


def _plot_sweep(rows, x_key, x_label, out):
    import matplotlib.pyplot as plt

    device = rows[0]["device"].upper() if rows else ""
    figure, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    for (method, xla, measured), points in _series(rows, x_key).items():
        color, marker = STYLE[method]
        style = {
            "color": color,
            "marker": marker,
            "linestyle": ":" if measured == "lower_bound" else ("--" if xla else "-"),
            "markerfacecolor": "none" if xla else color,
            "label": _label(method, xla, measured),
        }
        xs = [x for x, _ in points]
        if measured != "lower_bound":
            left.plot(xs, [float(r["step_ms_median"]) for _, r in points], **style)
        if method != "unconstrained":
            right.plot(xs, [float(r["overhead_ms_step_median"]) for _, r in points], **style)
    left.set_yscale("log")
    left.set_ylabel("decode time per step, ms (median)")
    left.set_title(f"Time per step ({device})")
    right.set_yscale("symlog", linthresh=0.1)
    right.axhline(0, color="black", linewidth=0.8)
    right.set_ylabel("overhead per step vs unconstrained, ms (median; symlog)")
    right.set_title(f"Constraint overhead per step ({device})")
    for axis in (left, right):
        axis.set_xscale("log", base=2 if x_key != "n" else 10)
        axis.set_xlabel(x_label)
        axis.grid(True, which="both", alpha=0.3)
    handles, labels = left.get_legend_handles_labels()
    for handle, label in zip(*right.get_legend_handles_labels()):
        if label not in labels:
            handles.append(handle)
            labels.append(label)
    figure.legend(handles, labels, loc="lower center", ncol=5, fontsize=8)
    figure.tight_layout(rect=(0, 0.1, 1, 1))
    figure.savefig(out, dpi=110)
    plt.close(figure)


def _plot_kernel(rows, out):
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4.5))
    device = rows[0]["device"].upper() if rows else ""
    for xla in (False, True):
        vntk = [r for r in rows if r["kind"] == "vntk" and (r["xla"] == "True") == xla]
        vntk.sort(key=lambda r: int(r["b_t"]))
        suffix = " XLA" if xla else " graph"
        style = "--" if xla else "-"
        axis.plot(
            [int(r["b_t"]) for r in vntk],
            [float(r["us_median"]) for r in vntk],
            marker="s",
            linestyle=style,
            color="tab:red",
            label="STATIC VNTK step" + suffix,
        )
        for kind, color, label in (
            ("dense_step", "tab:orange", "STATIC dense step (t=0)"),
            ("unconstrained_topk", "black", "unconstrained top-k over V"),
            ("masked_topk", "tab:gray", "top-k over V, all but 4 masked"),
        ):
            match = [r for r in rows if r["kind"] == kind and (r["xla"] == "True") == xla]
            if match:
                axis.axhline(
                    float(match[0]["us_median"]),
                    color=color,
                    linestyle=style,
                    linewidth=1,
                    label=label + suffix,
                )
    axis.set_xscale("log", base=2)
    axis.set_yscale("log")
    axis.set_xlabel("branch width B_t")
    axis.set_ylabel("time per kernel step, us (median)")
    rows_count = rows[0]["rows"] if rows else "?"
    axis.set_title(f"Kernel time against B_t ({rows_count} rows, {device})")
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(out, dpi=110)
    plt.close(figure)


def _plot_build(rows, out):
    import matplotlib.pyplot as plt

    figure, (left, middle, right) = plt.subplots(1, 3, figsize=(15, 4.5))
    colors = {
        "static": "tab:red",
        "ppv": "tab:blue",
        "hash_bitmap": "tab:green",
        "cpu_trie": "tab:brown",
    }
    labels = {
        "static": "STATIC",
        "ppv": "PPV keys",
        "hash_bitmap": "Hash bitmap",
        "cpu_trie": "CPU trie",
    }
    for structure, color in colors.items():
        points = sorted(
            (int(r["n"]), r) for r in rows if r["structure"] == structure and r["build_s"]
        )
        if not points:
            continue
        xs = [x for x, _ in points]
        label = labels[structure]
        left.plot(xs, [float(r["build_s"]) for _, r in points], "o-", color=color, label=label)
        middle.plot(
            xs, [float(r["structure_gb"]) for _, r in points], "o-", color=color, label=label
        )
        right.plot(xs, [float(r["peak_rss_gb"]) for _, r in points], "o-", color=color, label=label)
        if structure == "static":
            middle.plot(
                xs,
                [float(r["paper_model_gb"]) for _, r in points],
                "s:",
                color=color,
                label="paper model (12 B/node + dense)",
            )
    for axis, title, ylabel in (
        (left, "Build time", "seconds"),
        (middle, "Structure size", "GB"),
        (right, "Peak RSS of the build process", "GB"),
    ):
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_xlabel("constraint-set size N")
        axis.set_ylabel(ylabel)
        axis.set_title(title)
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(out, dpi=110)
    plt.close(figure)


if __name__ == "__main__":
    main()
