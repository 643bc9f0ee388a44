"""Host walks of a semantic-ID index's arrays (NumPy, vectorised over rows).

`StaticIndex` answers its queries with these: `walk` follows prefixes down
the dense masks and the CSR rows, `expand` lists every edge out of a set of
states at one depth. The first `dense_levels` depths are codes (the prefix
as a base-V number, a mask row each); the later ones are tail states (a
CSR row each; a level where no state branches has no row pointers, so its
row is the edge with the state's own number).
"""

from __future__ import annotations

import numpy as np


def walk(layout, arrays: dict, prefixes: np.ndarray) -> np.ndarray:
    """int64 `[n]`: the decoding state after each prefix (int64 `[n, t]`), -1
    where it leaves the set or holds a token outside the vocabulary."""
    vocab = layout.vocab_size
    n, t_end = prefixes.shape
    code = np.zeros(n, dtype=np.int64)  # the prefix as a base-V number (t < d)
    state = np.zeros(n, dtype=np.int64)  # tail state (t >= d); -1: left the set
    masks = arrays["dense_masks"]
    tokens = arrays["tokens"]
    in_range = (prefixes >= 0) & (prefixes < vocab)
    for t in range(t_end):
        ok = (state >= 0) & in_range[:, t]
        token = np.where(ok, prefixes[:, t], 0)
        if t < layout.dense_levels:
            row = layout.dense_mask_offsets[t] + np.where(ok, code, 0)
            word = masks[row, token >> 5].view(np.uint32) if n else masks[:0, 0]
            ok &= ((word >> (token & 31).astype(np.uint32)) & 1).astype(bool)
            code = np.where(ok, code * vocab + token, 0)
            state = np.where(ok, 0, -1)
            if t + 1 == layout.dense_levels:
                dense = arrays["dense_states"]
                state = np.where(ok, dense[code], -1)
        else:
            # Rows that left the set look up the level's first state instead.
            first = layout.tail_state_offsets[t]
            start, end = row_bounds(layout, arrays, np.where(ok, state, first), t)
            edge = search_rows(tokens, start, end, token)
            ok &= edge >= 0
            state = np.where(ok, edge + layout.level_sizes[layout.dense_levels], -1)
    if t_end < layout.dense_levels:
        offset = layout.dense_mask_offsets[t_end]
        return np.where(state >= 0, offset + code, -1)
    return np.where(state >= 0, layout.dense_head_states + state, -1)


def expand(layout, arrays: dict, state: np.ndarray, t: int):
    """All edges out of codes (t < d) or tail states at depth t:
    `(row, token, next code or tail state)`."""
    vocab = layout.vocab_size
    if t < layout.dense_levels:
        packed = arrays["dense_masks"][layout.dense_mask_offsets[t] + state]
        bits = np.unpackbits(packed.view(np.uint8), axis=1, bitorder="little")
        row, token = np.nonzero(bits[:, :vocab])
        next_state = state[row] * vocab + token
        if t + 1 == layout.dense_levels:
            next_state = arrays["dense_states"][next_state].astype(np.int64)
        return row, token.astype(np.int32), next_state
    start, end = row_bounds(layout, arrays, state, t)
    counts = end - start
    row = np.repeat(np.arange(state.size), counts)
    first = np.cumsum(counts) - counts  # position of each row's first edge
    edge = np.arange(counts.sum()) - np.repeat(first - start, counts)
    token = arrays["tokens"][edge].astype(np.int32)
    return row, token, edge + layout.level_sizes[layout.dense_levels]


def row_bounds(layout, arrays: dict, states: np.ndarray, t: int) -> tuple[np.ndarray, np.ndarray]:
    """CSR row [start, end) of tail states at depth t."""
    local = states - layout.tail_state_offsets[t]
    if t in layout.indptr_offsets:
        indptr = arrays["indptr"]
        row = layout.indptr_offsets[t] + local
        return indptr[row].astype(np.int64), indptr[row + 1].astype(np.int64)
    start = layout.edge_offsets[t] + local
    return start, start + 1


def search_rows(
    tokens: np.ndarray, start: np.ndarray, end: np.ndarray, target: np.ndarray
) -> np.ndarray:
    """Edge in `tokens[start:end]` (sorted per row) equal to target, else -1."""
    lo = lower_bound(tokens, start, end, target)
    found = (lo < end) & (tokens[np.minimum(lo, tokens.size - 1)].astype(np.int64) == target)
    return np.where(found, lo, -1)


def lower_bound(tokens: np.ndarray, start, end, target) -> np.ndarray:
    """int64: the first edge in `tokens[start:end]` (sorted per row) that is
    `>= target`, else `end`; a binary search vectorised over rows."""
    lo, hi = np.asarray(start, np.int64).copy(), np.asarray(end, np.int64).copy()
    while True:
        active = lo < hi
        if not active.any():
            return lo
        mid = (lo + hi) // 2
        value = tokens[np.where(active, mid, 0)].astype(np.int64)
        right = active & (value < target)
        lo = np.where(right, mid + 1, lo)
        hi = np.where(active & ~right, mid, hi)
