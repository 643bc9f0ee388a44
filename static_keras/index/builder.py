"""Compiles a set of token sequences into STATIC's arrays, with NumPy only.

The trie is never materialised as Python objects. Rows are sorted once
(packed into 64-bit keys), and every level of the trie falls out of one
number per row: the length of the common prefix it shares with the previous
sorted row (`lcp`). A row opens a new node at depth `t + 1` exactly when
`lcp <= t`, so node counts, child tokens and CSR row pointers of a level are
a comparison, a compress and a `flatnonzero` over the columns.

States are numbered level by level and children of one parent are sorted by
token, so in a tree the child reached by tail edge `k` is tail state
`n_d + k` (no next-state array is stored), and row pointers are stored only
for levels where some state has more than one child.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from static_keras.index import aligned_arrays
from static_keras.index import headroom as headroom_layouts
from static_keras.index.input_checks import check_duplicate_policy
from static_keras.index.input_checks import validate_item_ids
from static_keras.index.input_checks import validate_sequences
from static_keras.index.layout import IndexLayout
from static_keras.index.layout import dense_mask_words
from static_keras.index.layout import token_dtype

#: Default memory budget of the dense head chosen by `dense_levels="auto"`.
DEFAULT_DENSE_BUDGET_BYTES = 64 * 2**20
#: A dense head at most this large is always taken: it costs nothing.
_FREE_DENSE_BYTES = 2**20
#: "auto" takes a dense level only while at least 1/_MIN_DENSE_FILL of the
#: `V**d` entries of its state map are real states.
_MIN_DENSE_FILL = 64
#: Rows per step where the build fills an N-long array piecewise.
_ROW_CHUNK = 1 << 20


def _sorted_rows(seqs: np.ndarray, vocab_size: int):
    """`(order, sorted columns)`: the rows in lexicographic order, ties
    (duplicate rows) in input order.

    One `np.sort` of uint64 keys, each the row's first tokens then its row
    number, orders the rows by those tokens and keeps input order among
    ties (2.5x faster than an argsort at 2 x 10^7, which NumPy runs as a
    stable merge sort); the sorted keys are the first columns. Rows tied on
    those tokens (few, for random semantic IDs) are ordered by the rest
    with a `lexsort` of just them. The rest of every row is packed into
    words and gathered once in the final order, where gathering each
    column through the permutation read the rows at random once per column.
    """
    n, length = seqs.shape
    bits = max(1, (vocab_size - 1).bit_length())
    index_bits = max(1, int(n - 1).bit_length())
    # Tokens are int32 (bits <= 31) and rows fewer than 2^33: one token fits.
    head = min(length, (64 - index_bits) // bits)
    keys = np.zeros(n, dtype=np.uint64)
    for column in range(head):
        keys <<= np.uint64(bits)
        keys |= seqs[:, column].astype(np.uint64, copy=False)
    keys <<= np.uint64(index_bits)
    for start in range(0, n, _ROW_CHUNK):  # the row numbers, a chunk at a time
        keys[start : start + _ROW_CHUNK] |= np.arange(
            start, min(start + _ROW_CHUNK, n), dtype=np.uint64
        )
    keys.sort()
    order = (keys & np.uint64((1 << index_bits) - 1)).astype(np.int64)
    keys >>= np.uint64(index_bits)  # the first tokens of each row, sorted
    if head < length:
        tied = np.flatnonzero(keys[1:] == keys[:-1])  # row i + 1 ties row i
        if tied.size:
            rows = np.unique(np.concatenate([tied, tied + 1]))
            starts = (np.diff(rows) > 1) | (keys[rows[1:]] != keys[rows[:-1]])
            run = np.cumsum(np.r_[True, starts])  # one id per run of tied rows
            tail = seqs[order[rows], head:]
            local = np.lexsort([tail[:, t] for t in range(tail.shape[1] - 1, -1, -1)] + [run])
            order[rows] = order[rows][local]
    columns = [None] * length
    mask = np.uint64((1 << bits) - 1)
    for column in range(head - 1, -1, -1):
        columns[column] = _low_bits(keys, mask, seqs.dtype)
        keys >>= np.uint64(bits)
    del keys
    per_word = 64 // bits
    for start in range(head, length, per_word):
        stop = min(length, start + per_word)
        word = np.zeros(n, dtype=np.uint64)
        for column in range(start, stop):
            word <<= np.uint64(bits)
            word |= seqs[:, column].astype(np.uint64, copy=False)
        word = word[order]
        for column in range(stop - 1, start - 1, -1):
            columns[column] = _low_bits(word, mask, seqs.dtype)
            word >>= np.uint64(bits)
    return order, columns


def _low_bits(words: np.ndarray, mask: np.uint64, dtype) -> np.ndarray:
    """`words & mask` as `dtype`, written straight into the result (no
    uint64 temporary of N entries)."""
    out = np.empty(words.shape, dtype)
    np.bitwise_and(words, mask, out=out, casting="unsafe")
    return out


def _common_prefix_lengths(columns: list[np.ndarray]) -> np.ndarray:
    """lcp[i] = tokens row i shares with row i-1 (sorted, unique); lcp[0] = -1."""
    n = columns[0].size
    lcp = np.zeros(n, dtype=np.int8 if len(columns) < 127 else np.int32)
    same = np.ones(n - 1, dtype=bool)
    for column in columns:
        same &= column[1:] == column[:-1]
        lcp[1:] += same
    lcp[0] = -1
    return lcp


def _dense_bytes(vocab_size: int, levels: int) -> int:
    words = dense_mask_words(vocab_size)
    masks = sum(vocab_size**t for t in range(levels)) * words * 4
    return masks + (vocab_size**levels * 4 if levels else 0)


def choose_dense_levels(vocab_size: int, level_sizes: list[int], budget_bytes: int) -> int:
    """The `dense_levels="auto"` rule.

    The largest `d <= L` whose dense tables (bit masks for steps `< d` plus
    the `V**d` int32 state map) fit in `budget_bytes`, and that are either
    tiny (at most 1 MiB) or at least 1/64 full (`V**d <= 64 * n_d`, with `n_d`
    the number of distinct length-`d` prefixes). Dense steps are the wide ones
    near the root where a CSR row would be long; a mostly empty map wastes
    memory that the CSR tail would not.
    """
    length = len(level_sizes) - 1
    best = 0
    for d in range(1, length + 1):
        if vocab_size**d > np.iinfo(np.int32).max:
            break
        size = _dense_bytes(vocab_size, d)
        if size > budget_bytes:
            break
        if size <= _FREE_DENSE_BYTES or vocab_size**d <= _MIN_DENSE_FILL * level_sizes[d]:
            best = d
    return best


def build_arrays(
    sequences,
    vocab_size,
    *,
    item_ids=None,
    dense_levels="auto",
    on_duplicate_item: str = "error",
    dense_budget_bytes: int = DEFAULT_DENSE_BUDGET_BYTES,
    progress=None,
    headroom: float = 0.0,
) -> tuple[IndexLayout, dict[str, np.ndarray]]:
    """Builds the layout and arrays of a `StaticIndex` (see its `build`).

    `progress(stage, fraction)`, if given, is called as the build advances.
    """
    report = progress or (lambda stage, fraction: None)
    check_duplicate_policy(on_duplicate_item)
    seqs = validate_sequences(sequences, vocab_size)
    vocab_size = int(vocab_size)
    num_rows, length = seqs.shape
    if item_ids is not None:
        item_ids = validate_item_ids(item_ids, num_rows)

    report("validated", 0.05)
    sorted_cols, lcp, leaf_item_ids = sort_unique(
        seqs, vocab_size, item_ids, on_duplicate_item, progress=report
    )
    del seqs
    # The child tokens of each level: the rows that open a node there.
    level_tokens = [column[lcp <= t] for t, column in enumerate(sorted_cols)]
    del sorted_cols
    return arrays_from_levels(
        level_tokens, functools.partial(_parent_starts, lcp), leaf_item_ids, vocab_size,
        dense_levels, dense_budget_bytes, report, headroom=headroom,
    )  # fmt: skip


def arrays_from_levels(
    level_tokens,
    first_children,
    leaf_item_ids,
    vocab_size: int,
    dense_levels,
    dense_budget_bytes: int,
    progress=None,
    *,
    headroom: float = 0.0,
    capacity: IndexLayout | None = None,
    indptr=None,
) -> tuple[IndexLayout, dict[str, np.ndarray]]:
    """The layout and arrays of a trie given level by level:
    `level_tokens[t]`, the last token of each node of depth `t + 1` in
    order, and `first_children(t, out=None)`, where the children of each
    node of depth `t` start among them (ascending; a childless node's
    children start where the next node's do), written into `out` if
    given. The build after its sort (starts from the rows' common
    prefixes: `_parent_starts`), which a catalogue delta reuses with starts
    it shifts from the served ones (`catalogue_delta`). The tail levels of
    `level_tokens` are dropped from the list as they are copied.

    The arrays are written straight into a layout with headroom when one
    is asked for: `headroom` (capacities that share above these rows) or
    `capacity` (a served layout's; `headroom.CapacityError` when the rows
    exceed it), with no exact copy first (`static_keras.index.headroom`).
    `indptr`: an array to write the row pointers into when it has their
    size and dtype (a delta passes the served ones: `first_children(t)`
    reads level t's before this writes them).
    """
    report = progress or (lambda stage, fraction: None)
    length = len(level_tokens)
    level_sizes = [1] + [int(tokens.size) for tokens in level_tokens]
    d = resolve_dense_levels(dense_levels, vocab_size, level_sizes, dense_budget_bytes)

    # Pass 1: the widest fan-out of each level (B_t) fixes the layout. In a
    # served layout's capacities the tail's offsets are fixed already: its
    # widths are taken in pass 2 from the row pointers it writes anyway.
    step_widths = []
    for t in range(length):
        if capacity is not None and t >= d:
            step_widths.append(capacity.step_widths[t])  # checked after pass 2
            continue
        starts = first_children(t)
        step_widths.append(int(np.diff(starts, append=level_sizes[t + 1]).max()))
        del starts

    report("widths", 0.7)
    arrays: dict[str, np.ndarray] = {}
    head = _dense_head(level_tokens, first_children, vocab_size, d)
    arrays["dense_masks"], arrays["dense_states"] = head
    layout = IndexLayout.create(
        vocab_size=vocab_size,
        length=length,
        dense_levels=d,
        level_sizes=level_sizes,
        step_widths=step_widths,
        has_item_ids=leaf_item_ids is not None,
    )
    if capacity is not None:
        layout = headroom_layouts.fitted_layout(capacity, layout)
    elif headroom:
        layout = headroom_layouts.capacity_layout(layout, headroom)
    padded = layout.has_headroom

    # Pass 2: child tokens of every tail state in state order, and CSR row
    # pointers (absolute tail edge numbers) for levels that branch. With
    # headroom the slots past the used ones stay zero, and padded rows are
    # empty, past the level's used edges: unreachable.
    # The large arrays are allocated aligned: a layer's weights take them
    # as they are (`aligned_arrays`).
    make = aligned_arrays.zeros if padded else aligned_arrays.empty
    tokens = make(layout.num_tail_edges, dtype=token_dtype(vocab_size))
    # Every branching level fills its rows; with none, one zero pads the array.
    given = indptr
    indptr = np.zeros(1, dtype=layout.indptr_dtype)
    if layout.num_indptr:
        fits = (given is not None and given.shape == (layout.num_indptr,)
                and given.dtype == layout.indptr_dtype and given.flags.writeable)  # fmt: skip
        indptr = given if fits else aligned_arrays.empty(layout.num_indptr, layout.indptr_dtype)
    for t in range(d, length):
        edge0 = layout.edge_offsets[t]
        tokens[edge0 : edge0 + level_sizes[t + 1]] = level_tokens[t]
        level_tokens[t] = None  # copied: the list is consumed, a level at a time
        if t in layout.indptr_offsets:
            row0 = layout.indptr_offsets[t]
            rows = indptr[row0 : row0 + layout.level_sizes[t] + 1]
            used = level_sizes[t]
            if step_widths[t] > 1 or not padded or capacity is not None:
                first_children(t, out=rows[:used])
                rows[:used] += edge0
            else:  # one child per state: state i's edge is edge i
                rows[:used] = np.arange(edge0, edge0 + used, dtype=rows.dtype)
            rows[used:] = edge0 + level_sizes[t + 1]
            if capacity is not None and used:
                step_widths[t] = int(np.diff(rows[: used + 1]).max())
        report(f"level {t + 1}/{length}", 0.75 + 0.25 * (t + 1) / length)
    if capacity is not None:  # the widths pass 2 found, against the caps
        exact = dataclasses.replace(layout, used_level_sizes=None, level_sizes=tuple(level_sizes),
                                    step_widths=tuple(step_widths))  # fmt: skip
        headroom_layouts.fitted_layout(capacity, exact)
    arrays["tokens"] = tokens if tokens.size else np.zeros(1, tokens.dtype)
    arrays["indptr"] = indptr
    if leaf_item_ids is not None:
        if padded and leaf_item_ids.size != layout.num_members:  # else padded already
            ids = aligned_arrays.full(layout.num_members, -1, np.int64)
            ids[: leaf_item_ids.size] = leaf_item_ids
            leaf_item_ids = ids
        arrays["leaf_item_ids"] = leaf_item_ids
    return layout, arrays


def sort_unique(seqs: np.ndarray, vocab_size: int, item_ids, on_duplicate_item: str, progress=None):
    """Sorts validated rows and drops duplicates: `(sorted_cols, lcp, leaf_item_ids)`.

    `sorted_cols` holds one array per position of the sorted distinct rows,
    `lcp[i]` the tokens row i shares with row i - 1 (`lcp[0] = -1`), and
    `leaf_item_ids` one item id per distinct row (None without `item_ids`),
    duplicates resolved by `on_duplicate_item` in input order.
    """
    report = progress or (lambda stage, fraction: None)
    length = seqs.shape[1]
    order, sorted_cols = _sorted_rows(seqs, vocab_size)
    report("sorted", 0.45)
    lcp = _common_prefix_lengths(sorted_cols)
    report("prefixes", 0.6)

    # Duplicate rows (lcp == length) collapse into one leaf.
    unique = lcp < length
    leaf_item_ids = None
    if item_ids is not None:
        sorted_ids = np.take(item_ids, order, out=aligned_arrays.empty(order.size, item_ids.dtype))
        leaf_item_ids = _leaf_item_ids(sorted_ids, unique, on_duplicate_item)
    if not unique.all():
        sorted_cols = [column[unique] for column in sorted_cols]
        lcp = lcp[unique]
    return sorted_cols, lcp, leaf_item_ids


def count_levels(lcp: np.ndarray, length: int) -> list[int]:
    """Distinct prefixes of each length 0..L (nodes at depth t + 1 start where lcp <= t)."""
    return [1] + [int(np.count_nonzero(lcp <= t)) for t in range(length)]


def resolve_dense_levels(dense_levels, vocab_size: int, level_sizes, budget_bytes: int) -> int:
    """The dense depth d: `"auto"` by `choose_dense_levels`, or a checked integer."""
    length = len(level_sizes) - 1
    if dense_levels == "auto":
        return choose_dense_levels(vocab_size, list(level_sizes), budget_bytes)
    if isinstance(dense_levels, bool) or not isinstance(dense_levels, (int, np.integer)):
        raise ValueError(
            f"`dense_levels` must be 'auto' or an integer. Received: dense_levels={dense_levels!r}"
        )
    dense_levels = int(dense_levels)
    if not 0 <= dense_levels <= length:
        raise ValueError(
            f"`dense_levels` must lie in [0, length={length}]. "
            f"Received: dense_levels={dense_levels}"
        )
    if vocab_size**dense_levels > np.iinfo(np.int32).max:
        raise ValueError(
            f"`dense_levels={dense_levels}` needs a state map of "
            f"vocab_size**{dense_levels} = {vocab_size**dense_levels} "
            "entries, more than int32 can index"
        )
    return dense_levels


def _parent_starts(lcp: np.ndarray, t: int, out=None) -> np.ndarray:
    """For the children of depth-t nodes, in order: where each parent starts."""
    starts = np.flatnonzero(lcp[lcp <= t] <= t - 1)
    if out is None:
        return starts
    out[:] = starts
    return out


def _leaf_item_ids(sorted_ids: np.ndarray, unique: np.ndarray, policy: str) -> np.ndarray:
    """One item id per distinct sequence, resolving duplicate rows by `policy`."""
    group_start = np.flatnonzero(unique)
    if group_start.size == unique.size:
        return sorted_ids
    group = np.cumsum(unique) - 1
    first = sorted_ids[group_start]
    conflicting = sorted_ids != first[group]
    if policy == "error" and conflicting.any():
        row = int(np.flatnonzero(conflicting)[0])
        raise ValueError(
            "Two different item ids share one semantic ID: item "
            f"{int(first[group[row]])} and item {int(sorted_ids[row])}. Pass "
            "`on_duplicate_item='first'` or `'last'` to keep one of them"
        )
    if policy == "last":
        group_end = np.append(group_start[1:], unique.size) - 1
        return sorted_ids[group_end]
    return first


def _dense_head(level_tokens, first_children, vocab_size: int, d: int):
    """Bit-packed masks for steps `< d` and the state map after `d` tokens,
    from the nodes of each dense depth (their codes: parent code * V + token)."""
    words = dense_mask_words(vocab_size)
    num_rows = sum(vocab_size**t for t in range(d))
    masks = np.zeros((max(num_rows, 1), words), dtype=np.uint32)
    states = np.full(max(vocab_size**d if d else 0, 1), -1, dtype=np.int32)
    if d == 0:
        return masks.view(np.int32), states
    codes = np.zeros(1, dtype=np.int64)  # the root's code
    row0 = 0
    for t in range(d):
        tokens = level_tokens[t].astype(np.int64)
        counts = np.diff(first_children(t), append=tokens.size)
        parents = np.repeat(codes, counts)
        bits = np.zeros((vocab_size**t, words * 32), dtype=bool)
        bits[parents, tokens] = True
        packed = np.packbits(bits, axis=1, bitorder="little")
        masks[row0 : row0 + vocab_size**t] = packed.view("<u4")
        row0 += vocab_size**t
        codes = parents * vocab_size + tokens
    states[codes] = np.arange(codes.size, dtype=np.int32)
    return masks.view(np.int32), states
