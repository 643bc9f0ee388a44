"""Merges partition tails (`partitions.py`) into the arrays of one `StaticIndex`.

The layout comes first, from global counts alone: levels up to the key
length `p` are the trie of the distinct keys (built by `build_arrays` on
the keys as rows of length p), deeper levels add up the partitions' node
counts and take the widest of their fan-outs; `dense_levels="auto"` then
applies the builder's rule to those level sizes. With the layout fixed,
every array is allocated once at its final size, and the tails are read one
at a time, in key order, and copied to their offsets: partition j's nodes
at depth t start at the sum of the depth-t counts of partitions before it.
Memory is the output plus one partition (plus the key trie, at most one row
per partition).

The dense head: steps below `min(d, p)` and the state map when `d <= p`
come from the key trie; when `d > p`, each tail also sets the mask bits of
steps p..d-1 and its slice of the state map, from the prefix codes that its
levels spell.

NumPy only.
"""

from __future__ import annotations

import numpy as np

from static_keras.index.beam_build.partitions import key_rows
from static_keras.index.beam_build.partitions import tail_levels
from static_keras.index.builder import build_arrays
from static_keras.index.builder import resolve_dense_levels
from static_keras.index.layout import IndexLayout


def plan_layout(
    keys: np.ndarray,
    counts: np.ndarray,
    widths: np.ndarray,
    *,
    vocab_size: int,
    p: int,
    dense_levels,
    dense_budget_bytes: int,
    has_item_ids: bool,
) -> IndexLayout:
    """The layout of the merged index.

    Args:
        keys: int64 `[P]`, the partition keys, sorted.
        counts: int64 `[P, L + 1]`, each partition's `counts`.
        widths: int64 `[P, L]`, each partition's `widths`.
    """
    length = widths.shape[1]
    head, _ = build_arrays(key_rows(keys, vocab_size, p), vocab_size, dense_levels=0)
    level_sizes = list(head.level_sizes) + [int(x) for x in counts[:, p + 1 :].sum(axis=0)]
    step_widths = list(head.step_widths) + [int(x) for x in widths[:, p:].max(axis=0)]
    d = resolve_dense_levels(dense_levels, vocab_size, level_sizes, dense_budget_bytes)
    return IndexLayout.create(
        vocab_size=vocab_size,
        length=length,
        dense_levels=d,
        level_sizes=level_sizes,
        step_widths=step_widths,
        has_item_ids=has_item_ids,
    )


def merge_tails(
    layout: IndexLayout, keys: np.ndarray, counts: np.ndarray, read_tail, p: int, progress=None
) -> dict[str, np.ndarray]:
    """The arrays of the index, reading tail j with `read_tail(j)` in key order.

    `progress(j)`, if given, is called after each tail.
    """
    vocab, length, d = layout.vocab_size, layout.length, layout.dense_levels
    arrays = {
        name: np.zeros(shape, dtype) for name, (shape, dtype) in layout.array_shapes().items()
    }
    # The key trie: the dense head below min(d, p) and the tail levels d..p-1.
    head_layout, head = build_arrays(
        key_rows(keys, vocab, p), vocab, dense_levels=min(d, p)
    )  # fmt: skip
    if d <= p:
        arrays["dense_masks"][...] = head["dense_masks"]
        arrays["dense_states"][...] = head["dense_states"]
    else:
        rows = head_layout.dense_mask_rows
        arrays["dense_masks"][:rows] = head["dense_masks"]
        arrays["dense_states"][...] = -1  # codes that are no prefix
    if d < p:
        arrays["tokens"][: head_layout.num_tail_edges] = head["tokens"][
            : head_layout.num_tail_edges
        ]
        arrays["indptr"][: head_layout.num_indptr] = head["indptr"][: head_layout.num_indptr]
    del head

    # Where partition j starts on each level: exclusive prefix sums of counts.
    offsets = np.zeros_like(counts)
    np.cumsum(counts[:-1], axis=0, out=offsets[1:])
    masks = arrays["dense_masks"].view(np.uint32).reshape(-1)
    words = layout.mask_words
    mask_offsets = layout.dense_mask_offsets
    tokens, indptr = arrays["tokens"], arrays["indptr"]
    for j in range(len(keys)):
        tail = read_tail(j)
        code = np.array([keys[j]], dtype=np.int64)  # prefix codes, while t < d
        for t, level_tokens, starts in tail_levels(tail, p):
            if t < d:
                fan_out = np.diff(starts, append=counts[j, t + 1])
                parents = np.repeat(code, fan_out)
                level_tokens = level_tokens.astype(np.int64)
                bit_rows = (mask_offsets[t] + parents) * words + (level_tokens >> 5)
                bits = np.left_shift(1, level_tokens & 31).astype(np.uint32)
                np.bitwise_or.at(masks, bit_rows, bits)
                code = parents * vocab + level_tokens
                continue
            edge0 = layout.edge_offsets[t] + offsets[j, t + 1]
            tokens[edge0 : edge0 + counts[j, t + 1]] = level_tokens
            if t in layout.indptr_offsets:
                row0 = layout.indptr_offsets[t] + offsets[j, t]
                indptr[row0 : row0 + counts[j, t]] = starts + edge0
        if d > p:
            states = offsets[j, d] + np.arange(counts[j, d])
            arrays["dense_states"][code] = states
        if layout.has_item_ids:
            leaf0 = offsets[j, length]
            arrays["leaf_item_ids"][leaf0 : leaf0 + counts[j, length]] = tail["leaf_item_ids"]
        del tail
        if progress is not None:
            progress(j)
    # The closing row pointer of each branching level at or below max(d, p).
    for t, row0 in layout.indptr_offsets.items():
        if t >= max(d, p):
            indptr[row0 + layout.level_sizes[t]] = (
                layout.edge_offsets[t] + layout.level_sizes[t + 1]
            )
    return arrays
