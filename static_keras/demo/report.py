"""The demo's report: a Markdown summary and PNG plots."""

from __future__ import annotations

import os

import numpy as np


def write_report(out_dir: str, results: dict) -> list[str]:
    """Writes report.md and the plots; returns the files written."""
    os.makedirs(out_dir, exist_ok=True)
    files = _plots(out_dir, results)
    rows = results["decoding"]
    lines = [
        "# static-keras demo",
        "",
        f"Catalogue: {results['num_items']:,} items, semantic IDs of {results['length']} "
        f"tokens over {results['vocab_size']} codes (RQ-KMeans + disambiguation); "
        f"index {results['index_bytes']:,} bytes, built in {results['build_ms']:.1f} ms.",
        f"Decoder: {results['decoder_parameters']:,} parameters, trained "
        f"{results['train_seconds']:.0f} s ({results['epochs']} epochs); "
        f"{results['test_users']} held-out users, beam {results['beam_size']}.",
        "",
        "| decoding | valid items | eligible (fresh) | Recall@10 | Recall@10, fresh targets "
        "| ms per step: median (interquartile range) |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['name']} | {row['valid']:.1%} | {row['eligible']:.1%} | "
            f"{row['recall_at_10']:.1%} | {row['recall_at_10_fresh_targets']:.1%} | "
            f"{row['ms_per_step']:.2f} ({row['ms_per_step_p25']:.2f}-"
            f"{row['ms_per_step_p75']:.2f}) |"
        )
    lines += [
        "",
        f"Time per step: {results['timed_users']} users x beam {results['beam_size']}, "
        f"{results['timing_rounds']} rounds that each time the three decodings in turn "
        "(on a shared CPU the speed drifts: timing one after the other would let the drift "
        "order them).",
    ]
    cold = results["cold_start"]
    lines += [
        "",
        f"Cold start ({cold['items']:,} items uploaded after training, "
        f"{cold['users']} users whose next item is one of them): Recall@1 "
        f"unconstrained {cold['unconstrained_recall_at_1']:.1%}, constrained to the "
        f"cold-start pool {cold['constrained_recall_at_1']:.1%}.",
    ]
    regions = results.get("regions")
    if regions:
        lines += [
            "",
            f"Regions and histories (one index, one eligibility set per region, each "
            f"user's history excluded; {regions[0]['users']} users per region):",
            "",
            "| region | results in region | history hits | without the per-request "
            "constraints: in region, history hits |",
            "|---|---|---|---|",
        ]
        for row in regions:
            lines.append(
                f"| {row['region']} | {row['constrained_eligible']:.0%} | "
                f"{row['constrained_history_hits']} | {row['plain_eligible']:.0%}, "
                f"{row['plain_history_hits']} |"
            )
    swap = results.get("hot_swap")
    if swap:
        lines += [
            "",
            f"Serving: version 1 (fresh within {swap['v1_days']} days) then version 2 "
            f"(within {swap['v2_days']} days, index-only refresh) on the development "
            f"server: {swap['requests']} requests during the swap, {swap['failures']} "
            f"failed; answers changed for {swap['changed_share']:.0%} of users.",
        ]
    lines += ["", *(f"![{os.path.splitext(f)[0]}]({f})" for f in files)]
    with open(os.path.join(out_dir, "report.md"), "w") as file:
        file.write("\n".join(lines) + "\n")
    return ["report.md", *files]


def _plots(out_dir: str, results: dict) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results["decoding"]
    names = [row["name"].replace(": ", ":\n") for row in rows]  # two lines: no overlaps
    colors = ["#b0b0b0", "#4c72b0", "#55a868"][: len(rows)]
    fresh = rows[-1]["name"].split(": ", 1)[-1]
    files = []

    def bars(axis, values, labels, errors=None, digits=1, top=None):
        """Bars with their values above, and headroom so that no label meets
        the frame; `top`: the panels' shared scale (default: these bars')."""
        axis.bar(range(len(values)), values, color=colors, yerr=errors, capsize=4)
        axis.set_xticks(range(len(values)), names, fontsize=8)
        above = errors[1] if errors is not None else np.zeros(len(values))
        tops = [value + extra for value, extra in zip(values, above)]
        top = top or max(tops) or 1.0  # all zero: still an axis
        axis.set_ylim(0, top * 1.25)
        for x, (value, label) in enumerate(zip(tops, labels)):
            axis.text(x, value + top * 0.02, label, ha="center", va="bottom", fontsize=9)

    # What each constraint promises, as the share of results that break it.
    # One scale for both panels, labelled on each: a small share looks small.
    figure, (real, eligible) = plt.subplots(1, 2, figsize=(8.4, 3.6), sharey=True)
    invalid = [100 * (1 - row["valid"]) for row in rows]
    stale = [100 * (1 - row["eligible"]) for row in rows]
    top = max(invalid + stale) or 1.0
    bars(real, invalid, [_percent(v) for v in invalid], top=top)
    real.set_title("not a catalogue item", fontsize=10)
    bars(eligible, stale, [_percent(v) for v in stale], top=top)
    eligible.set_title(f"not {fresh}", fontsize=10)
    for axis in (real, eligible):
        axis.set_ylabel("% of returned results")
        axis.tick_params(labelleft=True)
    figure.suptitle("Results that break the rule (lower is better)")
    files.append(_save(figure, out_dir, "validity.png"))

    # Recall@10 over all users, and over those whose next item is fresh.
    figure, (overall, on_fresh) = plt.subplots(1, 2, figsize=(8.4, 3.6), sharey=True)
    for axis, key, title in (
        (overall, "recall_at_10", "all held-out users"),
        (on_fresh, "recall_at_10_fresh_targets", "users whose next item is fresh"),
    ):
        values = [100 * row[key] for row in rows]
        bars(axis, values, [f"{v:.1f}%" for v in values])
        axis.set_title(title, fontsize=10)
    top = max(100 * max(row[k] for k in ("recall_at_10", "recall_at_10_fresh_targets"))
              for row in rows)  # fmt: skip
    overall.set_ylim(0, top * 1.25)
    overall.set_ylabel("Recall@10 (%)")
    figure.suptitle("Recall@10: the fresh constraint trades overall recall for fresh items")
    files.append(_save(figure, out_dir, "recall.png"))

    figure, axis = plt.subplots(figsize=(6.4, 3.8))
    medians = [row["ms_per_step"] for row in rows]
    errors = np.array(
        [[m - row["ms_per_step_p25"] for m, row in zip(medians, rows)],
         [row["ms_per_step_p75"] - m for m, row in zip(medians, rows)]]
    )  # fmt: skip
    bars(axis, medians, [f"{m:.1f}" for m in medians], errors=errors)
    axis.set_ylabel("ms per decoding step")
    axis.set_title(
        f"Time per step: {results['timed_users']} users x beam {results['beam_size']}\n"
        f"median and interquartile range of {results['timing_rounds']} interleaved rounds",
        fontsize=10,
    )
    files.append(_save(figure, out_dir, "latency.png"))
    return files


def _percent(value: float) -> str:
    """A bar's label: two decimals below 1% (0.45%, not 0.4%), else one."""
    return f"{value:.2f}%" if 0 < value < 1 else f"{value:.1f}%"


def _save(figure, out_dir: str, filename: str) -> str:
    import matplotlib.pyplot as plt

    figure.tight_layout()
    figure.savefig(os.path.join(out_dir, filename), dpi=110)
    plt.close(figure)
    return filename
