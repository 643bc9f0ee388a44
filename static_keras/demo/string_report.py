"""The strings demo's report: a Markdown table and one plot."""

from __future__ import annotations

import os

PLOT = "accuracy.png"
# The trie-automaton paper (arXiv:2608.12574), Banking77, a weak model
# unconstrained and constrained to the 77 labels.
PAPER_BANKING77 = (0.048, 0.248)
EXAMPLES = 6


def write_strings_report(out_dir: str, results: dict) -> list[str]:
    """Writes report.md and the plot; returns the files written."""
    os.makedirs(out_dir, exist_ok=True)
    _plot(os.path.join(out_dir, PLOT), results)
    lines = [
        "# static-keras demo --strings: a weak model constrained to its answer set",
        "",
        f"Questions: the first documentation sentence of an AWS API operation "
        f"({results['source']}); answer: the operation's name. {results['num_train']:,} "
        f"questions to train on, {results['num_held_out']:,} held out "
        f"({results['unseen_share']:.0%} of them have an answer that no training question "
        f"has); the answer set (the constraint) holds all {results['num_answers']:,} names, "
        f"held-out ones included.",
        f"Tokenizer: byte-level BPE of {results['vocab_size']:,} tokens trained here on the "
        f"training text; answers take up to {results['canonical_tokens']} tokens; the "
        f"`StringIndex` ({results['index_states']:,} states, {results['index_bytes']:,} "
        f"bytes) compiled in {results['compile_ms']:.0f} ms, {results['max_length']} steps.",
        f"Model: a `CachedTransformerDecoder` of {results['parameters']:,} parameters, "
        f"trained {results['train_seconds']:.0f} s ({results['epochs_trained']:.2f} epochs, "
        f"budget {results['train_budget_seconds']} s).",
        "",
        "| decoding | beam | valid (a member) | accuracy (exact match) | accuracy, unseen "
        "answers | no answer | ms per answer (median) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in results["decoding"]:
        lines.append(
            f"| {row['name']} | {row['beam']} | {row['validity']:.1%} | {row['accuracy']:.1%} | "
            f"{row['accuracy_unseen']:.1%} | {row['no_answer']:.1%} | "
            f"{row['ms_per_answer']:.2f} |"
        )
    before, after = PAPER_BANKING77
    lines += [
        "",
        f"Time per answer: batches of {results['batch']} questions, batch time / "
        f"{results['batch']}, median over the batches; the decodings take turns batch by "
        "batch. Both searches run all steps (the unconstrained one has no EOS stop; its "
        "answer is cut at the first EOS). A constrained beam that runs out of steps is "
        "dropped: 'no answer'.",
        "",
        *_examples(results),
        f"For comparison, the trie-automaton paper (arXiv:2608.12574): on Banking77, "
        f"constraining a weak model to the 77 labels raised its accuracy from "
        f"{before:.1%} to {after:.1%}.",
        "",
        f"![validity and accuracy]({PLOT})",
    ]
    with open(os.path.join(out_dir, "report.md"), "w") as file:
        file.write("\n".join(lines) + "\n")
    return ["report.md", PLOT]


def _examples(results: dict, count: int = EXAMPLES) -> list[str]:
    """Table lines: held-out questions whose unconstrained answer (widest beam) is no name."""
    *_, free, constrained = results["decoding"]
    members = set(results["data"].answers)
    lines = [
        f"Held-out questions where the unconstrained answer (beam {free['beam']}) is no "
        "operation name, the first few:",
        "",
        "| question | answer | unconstrained | constrained |",
        "|---|---|---|---|",
    ]
    picked = [i for i, answer in enumerate(free["answers"]) if answer not in members][:count]
    for i in picked:
        question = results["data"].held_out[i][0]
        question = question if len(question) <= 90 else question[:87] + "..."
        cells = (question, results["gold"][i], free["answers"][i], constrained["answers"][i])
        lines.append("| " + " | ".join((c or "(none)").replace("|", "\\|") for c in cells) + " |")
    return [*lines, ""] if picked else []


def _plot(path: str, results: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rows = results["decoding"]
    labels = [
        f"{'constrained' if r['constrained'] else 'unconstrained'}\nbeam {r['beam']}" for r in rows
    ]
    x = np.arange(len(rows))
    width = 0.38
    figure, axes = plt.subplots(figsize=(7.5, 4))
    for offset, key, label, color in (
        (-width / 2, "validity", "valid (a member)", "#9ab"),
        (width / 2, "accuracy", "accuracy (exact match)", "#c53"),
    ):
        values = [100 * r[key] for r in rows]
        bars = axes.bar(x + offset, values, width, label=label, color=color)
        axes.bar_label(bars, fmt="%.1f", fontsize=8)
    axes.set_xticks(x, labels)
    axes.set_ylim(0, 118)
    axes.set_ylabel("% of held-out questions")
    axes.set_title(
        f"{results['num_held_out']:,} held-out questions, answer set of "
        f"{results['num_answers']:,} names",
        fontsize=10,
    )
    axes.legend(loc="upper center", ncol=2, fontsize=8, frameon=False)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
