"""Draws docs/img/index_layout.png, decoding_step.png and eligibility.png from a real index.

python docs/make_figures.py
"""

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from static_keras import ConstrainedDecoding  # noqa: E402
from static_keras import StaticIndex  # noqa: E402
from static_keras.index.eligibility import EligibilitySets  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "img")
SEQUENCES = [[0, 1, 2], [0, 1, 3], [0, 3, 1], [1, 0, 0], [1, 2, 2], [1, 2, 3], [3, 3, 0]]


def _strip(axis, y, values, label, colors=None, note=None):
    for x, value in enumerate(values):
        face = colors[x] if colors is not None else "#eef2f8"
        axis.add_patch(plt.Rectangle((x, y), 1, 0.8, facecolor=face, edgecolor="#445"))
        axis.text(x + 0.5, y + 0.4, str(value), ha="center", va="center", fontsize=9)
    axis.text(-0.3, y + 0.4, label, ha="right", va="center", fontsize=9, family="monospace")
    if note:
        axis.text(len(values) + 0.3, y + 0.4, note, ha="left", va="center", fontsize=8)


def index_layout(index: StaticIndex) -> None:
    arrays, layout = index.arrays, index.layout
    figure, axis = plt.subplots(figsize=(11, 4.2))
    bits = np.unpackbits(arrays["dense_masks"].view(np.uint8), axis=1, bitorder="little")
    v = index.vocab_size
    _strip(axis, 5, bits[0, :v], "mask step 0 (bits)", note="tokens allowed at the root")
    _strip(axis, 4, arrays["dense_states"], "state map V**d",
           note="prefix code -> tail state (-1: no such prefix)")  # fmt: skip
    level = np.repeat(np.arange(layout.dense_levels + 1, layout.length + 1),
                      [layout.level_sizes[t] for t in range(layout.dense_levels + 1,
                                                            layout.length + 1)])  # fmt: skip
    palette = {2: "#dbe9d8", 3: "#f6e3c8"}
    _strip(axis, 2.6, arrays["tokens"], "tokens (uint8)",
           colors=[palette.get(t, "#eef2f8") for t in level],
           note="child tokens, level by level; edge k -> tail state n_d + k")  # fmt: skip
    _strip(axis, 1.6, arrays["indptr"], "indptr",
           note="row pointers, branching levels only (B_t > 1)")  # fmt: skip
    axis.text(0, 0.7, f"B_t per step: {list(layout.step_widths)}   dense_levels d = "
              f"{layout.dense_levels}   level sizes {list(layout.level_sizes)}   "
              f"{index.nbytes} bytes", fontsize=9)  # fmt: skip
    axis.set_title(f"STATIC layout of {len(SEQUENCES)} sequences: {SEQUENCES}", fontsize=10)
    axis.set_xlim(-4.5, 26)
    axis.set_ylim(0.4, 6)
    axis.axis("off")
    figure.tight_layout()
    figure.savefig(os.path.join(OUT, "index_layout.png"), dpi=110)
    plt.close(figure)


def decoding_step(index: StaticIndex) -> None:
    layer = ConstrainedDecoding(index)
    prefixes = np.array([[0, 1], [1, 2], [3, 3], [2, 2]])
    states = np.zeros(len(prefixes), np.int32)
    for t in range(2):
        states = np.asarray(layer.advance(states, prefixes[:, t], step=t))
    logits = np.log(np.array([[0.1, 0.2, 0.3, 0.4]] * len(prefixes), "float32"))
    scores, tokens, next_states = (np.asarray(x) for x in layer(logits, states, step=2))
    figure, axis = plt.subplots(figsize=(10, 3.4))
    for row, prefix in enumerate(prefixes):
        y = 3 - row
        axis.text(0, y + 0.4, f"prefix {prefix.tolist()}  state {states[row]:>2}", fontsize=9,
                  family="monospace", va="center")  # fmt: skip
        for slot in range(tokens.shape[1]):
            ok = tokens[row, slot] >= 0
            face = "#dbe9d8" if ok else "#f3d6d6"
            axis.add_patch(plt.Rectangle((4.2 + 2.2 * slot, y), 2, 0.8, facecolor=face,
                                         edgecolor="#445"))  # fmt: skip
            text = "padding\n(-1, -inf)"
            if ok:
                text = f"tok {tokens[row, slot]}  s {scores[row, slot]:.2f}\n"
                text += f"next {next_states[row, slot]}"
            axis.text(5.2 + 2.2 * slot, y + 0.4, text, ha="center", va="center", fontsize=8)
    axis.set_title(
        "One tail step (t = 2, B_2 = %d): start = indptr[s], n = indptr[s+1] - start; gather "
        "B_t slots, mask slots >= n; invalid rows are padding" % index.step_widths[2],
        fontsize=9,
    )
    axis.set_xlim(0, 4.4 + 2.2 * tokens.shape[1])
    axis.set_ylim(-0.2, 4)
    axis.axis("off")
    figure.tight_layout()
    figure.savefig(os.path.join(OUT, "decoding_step.png"), dpi=110)
    plt.close(figure)


def eligibility(index: StaticIndex) -> None:
    """The trie with each state's member range, one set's bits and its rank
    directory, and the enterable test of each state for one request."""
    item_ids = index.lookup_item_ids(SEQUENCES)  # member m is SEQUENCES[m] (sorted)
    sets = EligibilitySets.build(index, {"region": item_ids[[1, 2, 5]]})
    excluded = sets.catalogue.exclusion_members([[item_ids[5]]])
    prefixes = [()] + sorted({tuple(s[:t]) for s in SEQUENCES for t in range(1, 4)})
    states = np.array([index.walk([list(p)])[0] for p in prefixes[1:]])
    lo, hi = index.member_ranges(states)
    lo, hi = np.r_[0, lo], np.r_[index.num_members, hi]
    ok = sets.enterable(np.zeros(len(prefixes), np.int64), lo[:, None], hi[:, None],
                        np.repeat(excluded, len(prefixes), axis=0))[:, 0]  # fmt: skip

    figure, axis = plt.subplots(figsize=(9, 5.6))
    by_depth = {t: [i for i, p in enumerate(prefixes) if len(p) == t] for t in range(4)}
    place = {}
    for t, nodes in by_depth.items():
        for i in nodes:  # leaves sit over their member number, parents over their range
            place[i] = ((lo[i] + hi[i]) / 2, 4.6 - 1.1 * t) if t < 3 else (lo[i] + 0.5, 1.3)
    for i, prefix in enumerate(prefixes):
        x, y = place[i]
        if prefix:
            parent = prefixes.index(prefix[:-1])
            px, py = place[parent]
            axis.plot([px, x], [py - 0.15, y + 0.15], color="#889", lw=1)
            axis.text((px + x) / 2 - 0.1, (py + y) / 2, str(prefix[-1]), fontsize=8,
                      color="#556", ha="right")  # fmt: skip
        face = "#dbe9d8" if ok[i] else "#f3d6d6"
        axis.add_patch(plt.Rectangle((x - 0.42, y - 0.15), 0.84, 0.3, facecolor=face,
                                     edgecolor="#445"))  # fmt: skip
        label = f"[{lo[i]},{hi[i]})" if len(prefix) < 3 else f"m{lo[i]}"
        axis.text(x, y, label, ha="center", va="center", fontsize=7.5, family="monospace")
    member = np.arange(index.num_members)
    bits = sets.contains(0, member).astype(int)
    colors = ["#f6e3c8" if m == excluded[0, 0] else "#eef2f8" for m in member]
    note = f"word 0 = {int(sets.words[0, 0])}; member {int(excluded[0, 0])} excluded (orange)"
    _strip(axis, 0.2, bits.tolist(), "set bits", colors=colors, note=note)
    _strip(axis, -0.8, sets.directory[0].tolist(), "directory",
           note="eligible members before each pair of 32-bit words (one here)")  # fmt: skip
    formula = (
        "rank(i) = directory[i >> 6] + popcount(word[w - 1] if w = i >> 5 is odd)\n"
        "          + popcount(word[w] & ((1 << (i & 31)) - 1))\n"
        "enterable(s) = rank(hi) - rank(lo) - #{excluded m in [lo, hi), m in set} > 0"
    )
    axis.text(0, -2.0, formula, fontsize=8.5, family="monospace", va="center")
    axis.set_title("Members below each state: one range [lo, hi) of sorted leaves. One set: "
                   "bits + rank directory.\nRequest: set {m1, m2, m5}, m5 excluded "
                   "(green: enterable)", fontsize=10)  # fmt: skip
    axis.set_xlim(-2.2, index.num_members + 6.5)
    axis.set_ylim(-2.4, 5)
    axis.axis("off")
    figure.tight_layout()
    figure.savefig(os.path.join(OUT, "eligibility.png"), dpi=110)
    plt.close(figure)


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    index = StaticIndex.build(SEQUENCES, vocab_size=4, dense_levels=1)
    index_layout(index)
    decoding_step(index)
    eligibility(StaticIndex.build(SEQUENCES, vocab_size=4, dense_levels=1,
                                  item_ids=100 + np.arange(len(SEQUENCES))))  # fmt: skip
    print(f"wrote {OUT}/index_layout.png, decoding_step.png and eligibility.png")
