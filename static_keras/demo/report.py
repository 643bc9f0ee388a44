"""The demo's report: a Markdown summary and PNG plots."""

from __future__ import annotations

import os


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
        "| ms per step (median of 5 passes) |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['name']} | {row['valid']:.1%} | {row['eligible']:.1%} | "
            f"{row['recall_at_10']:.1%} | {row['recall_at_10_fresh_targets']:.1%} | "
            f"{row['ms_per_step']:.2f} |"
        )
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
    names = [row["name"] for row in rows]
    colors = ["#b0b0b0", "#4c72b0", "#55a868"][: len(rows)]
    files = []
    for key, title, filename, percent in (
        ("valid", "Share of results that are real items", "validity.png", True),
        ("recall_at_10", "Recall@10 on held-out users", "recall.png", True),
        ("ms_per_step", "Decoding time per step (ms, 128 users x beam)", "latency.png", False),
    ):
        figure, axis = plt.subplots(figsize=(6.4, 3.6))
        values = [row[key] * (100 if percent else 1) for row in rows]
        axis.bar(range(len(names)), values, color=colors)
        # Long names on two lines, so that the labels never overlap.
        axis.set_xticks(range(len(names)), [n.replace(": ", ":\n") for n in names], fontsize=9)
        axis.set_title(title)
        if percent:
            axis.set_ylim(0, 105 if key == "valid" else max(values) * 1.3 + 1)
            axis.set_ylabel("%")
        for x, value in enumerate(values):
            axis.text(x, value, f"{value:.1f}", ha="center", va="bottom")
        figure.tight_layout()
        figure.savefig(os.path.join(out_dir, filename), dpi=110)
        plt.close(figure)
        files.append(filename)
    return files
