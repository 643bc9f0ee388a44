"""Member ranges: the members below a decoding state, as one `[lo, hi)` range.

Eligibility sets ("in stock", "allowed in FR") are bit vectors over member
numbers. A beam may enter a state only if some eligible member lies below
it; when the members below every state are one contiguous range of member
numbers, that question is a rank difference over the bit vector (see
`static_keras.index.eligibility`), fixed-width and branch-free.

Semantic IDs (a tree numbered level by level, leaves sorted): the leaves
below a state are contiguous, and consecutive states of one depth own
consecutive leaf ranges. So `lo(s)` is the leaf reached by always taking the
first child, and `hi(s) = lo(s + 1)` at the same depth, where the state one
past the last of a depth maps to `num_members`. Following the first child
needs no per-state array: at a level without row pointers (every state has
one child) it is arithmetic, at a branching level it is one `indptr` gather
(the row start *is* the first child's edge; the row pointer one past the last
row is the level's end, which descends to one past the end again). The dense
head has no rows, so a small table gives, for each dense state, the first
member at or after its code block (`dense_first_members`: `V**t + 1` ints per
dense depth t < d; the `+ 1` is the end). A dense code that no member starts
with gets `lo == hi` (its block is empty).

String sets (a DAG, explicit next states): members are accept states, numbered
in sorted order of the distinct strings, which is the preorder of their byte
trie, and trie states are byte-trie nodes. When every suffix of a member can
be spelled from every node (any vocabulary with all single-byte tokens:
byte-level BPE, SentencePiece with byte fallback) the members reachable from
a state are its byte subtree, a contiguous range. A vocabulary that lacks
some byte can strand members: from the node after token `"a"`, member `"ac"`
may be unreachable while `"ab"` and `"ad"` are not. `automaton_member_bounds`
therefore returns the smallest covering range per state plus a flag per
state that proves the range exact.

NumPy only.
"""

from __future__ import annotations

import numpy as np


def dense_first_members(layout, arrays: dict[str, np.ndarray]) -> list[np.ndarray]:
    """int64 `[V**t + 1]` per dense depth t < d: the first member of each code block.

    Entry c of depth t is the first member whose first t tokens, read as a
    base-V number, are `>= c`; entry `V**t` is `num_members`. Dense codes map
    to depth-d tail states in code order (`dense_states`), so the first depth-d
    state at or after a block is a count of the valid codes before it.
    """
    d, vocab = layout.dense_levels, layout.vocab_size
    if d == 0:
        return []
    valid = arrays["dense_states"] >= 0
    tables = []
    for t in range(d):
        per_block = np.count_nonzero(valid.reshape(vocab**t, vocab ** (d - t)), axis=1)
        first_state = np.zeros(vocab**t + 1, np.int64)
        np.cumsum(per_block, out=first_state[1:])
        depth = np.full(first_state.size, d, np.int64)
        tables.append(first_tail_members(layout, arrays, first_state, depth))
    return tables


def first_tail_members(layout, arrays, tail_states: np.ndarray, depths: np.ndarray) -> np.ndarray:
    """int64: the first member below each tail state (tail-local ids at `depths`).

    A tail state one past the last of its depth gives `num_members`, which
    is what makes `hi(s) = lo(s + 1)` hold at the end of a depth too.
    """
    d = layout.dense_levels
    tail = tail_states.astype(np.int64, copy=True)
    indptr = arrays["indptr"]
    for u in range(d, layout.length):
        # Rows that started at depth <= u have walked down to depth u by now.
        rows = np.flatnonzero(depths <= u)
        if rows.size == 0:
            continue
        local = tail[rows] - layout.tail_state_offsets[u]
        if u in layout.indptr_offsets:
            edge = indptr[layout.indptr_offsets[u] + local].astype(np.int64)
        else:
            edge = layout.edge_offsets[u] + local
        tail[rows] = layout.level_sizes[d] + edge
    return tail - layout.leaf_offset


def tree_member_ranges(
    layout, arrays, states: np.ndarray, dense_tables: list[np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """`(lo, hi)` int64 of decoding `states` of a semantic-ID index; `(0, 0)`
    for states outside `[0, state_space)`. `dense_tables`: `dense_first_members`."""
    states = np.asarray(states, np.int64).reshape(-1)
    lo = np.zeros(states.size, np.int64)
    hi = np.zeros(states.size, np.int64)
    starts = np.asarray(layout.depth_starts, np.int64)
    inside = (states >= 0) & (states < layout.state_space)
    depth = np.searchsorted(starts, states, side="right") - 1
    d = layout.dense_levels
    for t in range(d):
        rows = np.flatnonzero(inside & (depth == t))
        code = states[rows] - layout.dense_mask_offsets[t]
        lo[rows] = dense_tables[t][code]
        hi[rows] = dense_tables[t][code + 1]
    rows = np.flatnonzero(inside & (depth >= d))
    if rows.size:
        tail = states[rows] - layout.dense_head_states
        both = first_tail_members(
            layout, arrays, np.concatenate([tail, tail + 1]), np.tile(depth[rows], 2)
        )
        lo[rows], hi[rows] = both[: rows.size], both[rows.size :]
    return lo, hi


def automaton_member_bounds(
    indptr: np.ndarray, next_states: np.ndarray, first_member_state: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per state of a CSR automaton: `(lo, hi, exact)` of the reachable members.

    Members are the states from `first_member_state` on (member m is state
    `first_member_state + m`), and every edge leads to a larger state or to
    itself, so a fixed point over the edges converges in as many passes as
    the longest path. `[lo, hi)` is the smallest range holding every member
    reachable from the state (empty, `lo == hi == 0`, when none is);
    `exact` proves that every member of the range is reachable: the
    children's ranges are exact and leave no gap between them.

    Returns:
        `(lo int64 [S], hi int64 [S], exact bool [S])`.
    """
    num_states = indptr.size - 1
    num_members = num_states - first_member_state
    counts = np.diff(indptr).astype(np.int64)
    sources = np.flatnonzero(counts)
    segment_starts = indptr[:-1][sources].astype(np.int64)
    targets = next_states.astype(np.int64)

    lo = np.full(num_states, num_members, np.int64)
    hi = np.zeros(num_states, np.int64)
    lo[first_member_state:] = np.arange(num_members)
    hi[first_member_state:] = np.arange(1, num_members + 1)
    while sources.size:
        new_lo = lo.copy()
        new_hi = hi.copy()
        new_lo[sources] = np.minimum(lo[sources], np.minimum.reduceat(lo[targets], segment_starts))
        new_hi[sources] = np.maximum(hi[sources], np.maximum.reduceat(hi[targets], segment_starts))
        if np.array_equal(new_lo, lo) and np.array_equal(new_hi, hi):
            break
        lo, hi = new_lo, new_hi
    empty = lo >= hi
    lo[empty] = 0
    hi[empty] = 0

    # A gap: sorted by start, a child's range begins after every earlier one ended.
    source = np.repeat(np.arange(num_states, dtype=np.int64), counts)
    child_lo, child_hi = lo[targets], hi[targets]
    nonempty = child_lo < child_hi
    source, child_lo, child_hi = source[nonempty], child_lo[nonempty], child_hi[nonempty]
    order = np.lexsort((child_lo, source))
    source, child_lo, child_hi = source[order], child_lo[order], child_hi[order]
    # Offsetting each source's values by source * (K + 1) lets one running
    # maximum over all edges act as a per-source one.
    stride = num_members + 1
    reach = np.maximum.accumulate(child_hi + source * stride) if source.size else child_hi
    same_source = np.zeros(source.size, bool)
    same_source[1:] = source[1:] == source[:-1]
    gap = np.zeros(source.size, bool)
    gap[1:] = same_source[1:] & (child_lo[1:] + source[1:] * stride > reach[:-1])
    exact = np.ones(num_states, bool)
    exact[source[gap]] = False
    while sources.size:
        children_exact = np.minimum.reduceat(exact[targets].astype(np.int8), segment_starts)
        new_exact = exact.copy()
        new_exact[sources] &= children_exact.astype(bool)
        if np.array_equal(new_exact, exact):
            break
        exact = new_exact
    return lo, hi, exact
