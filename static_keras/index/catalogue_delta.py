"""A catalogue delta: the index of a changed catalogue without a full sort.

A served index's leaves are its catalogue's semantic IDs in sorted order,
so a day's change (items added with their semantic IDs, item ids removed)
is a merge of two sorted runs, not a new sort of every row:

1. the served rows come back sorted from the trie's arrays (one gather per
   level, leaves up);
2. the added rows are sorted among themselves (a few thousand to a few
   hundred thousand) and located in the served order by walking them down
   the trie (a binary search per level within one row, vectorised over the
   added rows): the served rows stay where they are;
3. removed leaves drop out, the added rows are inserted (`np.insert`, one
   pass per column), and the build's level pass runs on the merged rows
   (`builder.arrays_from_sorted`), keeping the served dense depth.

The result equals `StaticIndex.build` of the new catalogue (same language,
same item ids; same arrays when the layouts coincide). An index with
headroom gives an index in the same capacities (`headroom.fit`), or a
`CapacityError` naming the capacity the new catalogue exceeds.

NumPy only.
"""

from __future__ import annotations

import numpy as np

from static_keras.index import builder
from static_keras.index import member_ranges
from static_keras.index import tree_walk
from static_keras.index.input_checks import check_duplicate_policy
from static_keras.index.input_checks import validate_item_ids
from static_keras.index.input_checks import validate_sequences
from static_keras.index.member_catalogue import MemberCatalogue
from static_keras.index.static_index import StaticIndex

#: Offending ids an error message names.
_SHOWN = 5


def apply_delta(
    index: StaticIndex,
    *,
    add_sequences=None,
    add_item_ids=None,
    remove_item_ids=None,
    on_duplicate_item: str = "error",
    catalogue: MemberCatalogue | None = None,
) -> StaticIndex:
    """The index of `index`'s catalogue with items removed and added.

    Args:
        index: a `StaticIndex` built with `item_ids`.
        add_sequences: int `[k, L]` semantic IDs of the items added.
        add_item_ids: int `[k]` their item ids: none may be in the catalogue
            unless it is also removed (a replaced item).
        remove_item_ids: int `[r]` item ids to remove, each in the catalogue.
        on_duplicate_item: as in `StaticIndex.build`: an added semantic ID
            that a kept item (or another added one) already has is an error
            (`"error"`), keeps the earlier item (`"first"`: the served one,
            then the added ones in order) or the later one (`"last"`).
        catalogue: optional `MemberCatalogue` of `index` (a served
            version's exclusion table gives it without a sort).

    Returns:
        A `StaticIndex` equal in language and item ids to `StaticIndex.build`
        of the new catalogue, in `index`'s capacities when it has headroom
        (`headroom.CapacityError` when the change does not fit).

    Raises:
        ValueError: naming the argument and the first offending ids.
    """
    delta = dict(add_sequences=add_sequences, add_item_ids=add_item_ids,
                 remove_item_ids=remove_item_ids, on_duplicate_item=on_duplicate_item,
                 catalogue=catalogue)  # fmt: skip
    return apply_delta_with_member_map(index, **delta)[0]


def apply_delta_with_member_map(
    index: StaticIndex,
    *,
    add_sequences=None,
    add_item_ids=None,
    remove_item_ids=None,
    on_duplicate_item: str = "error",
    catalogue: MemberCatalogue | None = None,
) -> tuple[StaticIndex, np.ndarray, np.ndarray]:
    """`apply_delta`, and where the kept members went: `(new index,
    old_members, new_members)`, int64, served member `old_members[i]` is
    member `new_members[i]` of the new index (what carries eligibility sets
    over without a search by item id). It drops its reference to `index`
    once its rows are read, so a caller that keeps none frees the served
    arrays before the new ones are built."""
    layout = index.layout
    if not layout.has_item_ids:
        raise ValueError(
            "A catalogue delta needs an index built with `item_ids` (removals name item ids)"
        )
    check_duplicate_policy(on_duplicate_item)
    adds, add_ids = _added(index, add_sequences, add_item_ids)
    removed = _item_ids(remove_item_ids, "remove_item_ids")
    if catalogue is None:
        catalogue = MemberCatalogue.from_index(index)
    elif catalogue.num_members != index.num_members:
        raise ValueError("`catalogue` is not the catalogue of `index` (its size differs)")

    # Removed members (each id must name one).
    query, members = catalogue.lookup(removed)
    missing = np.setdiff1d(removed, removed[query])
    if missing.size:
        raise ValueError(
            f"`remove_item_ids` names {missing.size} item id(s) not in the catalogue: "
            f"{_first(missing)}"
        )
    gone = np.zeros(layout.num_sequences, bool)
    gone[members] = True
    # Added ids: new, or replacing a removed item; distinct.
    order = np.argsort(add_ids, kind="stable")
    twice = add_ids[order][1:][np.diff(add_ids[order]) == 0]
    if twice.size:
        raise ValueError(f"`add_item_ids` repeats item id(s) {_first(np.unique(twice))}")
    held_query, held_members = catalogue.lookup(add_ids)
    clash = add_ids[held_query[~gone[held_members]]]
    if clash.size:
        raise ValueError(
            f"`add_item_ids` holds {clash.size} item id(s) already in the catalogue (and not "
            f"removed): {_first(np.sort(clash))}"
        )

    # Added rows sorted; duplicates among them resolved by the policy.
    ids = add_ids
    if adds.shape[0]:
        columns, _, ids = builder.sort_unique(adds, layout.vocab_size, add_ids, on_duplicate_item)
        adds = np.stack(columns, axis=1)
        del columns
    position, member = _locate(index, adds)  # in the served leaf order
    same = member >= 0
    kept_same = same & ~gone[np.maximum(member, 0)]
    if kept_same.any():
        if on_duplicate_item == "error":
            rows = np.flatnonzero(kept_same)
            served = index.arrays["leaf_item_ids"][member[rows]]
            raise ValueError(
                f"`add_sequences` repeats the semantic ID of {rows.size} kept item(s): added "
                f"item {int(ids[rows[0]])} has the semantic ID of item {int(served[0])}. Pass "
                "`on_duplicate_item='first'` or `'last'` to keep one of them"
            )
        if on_duplicate_item == "first":
            adds, ids, position = adds[~kept_same], ids[~kept_same], position[~kept_same]
        else:  # "last": the added item takes the leaf
            gone[member[kept_same]] = True

    # Merge: the kept served rows, the added rows at their positions.
    kept = np.flatnonzero(~gone)
    if not kept.size and not ids.size:
        raise ValueError("The delta removes every item: an index needs at least one")
    shift = np.cumsum(gone)  # removed leaves before each position
    at = position - np.concatenate([[0], shift])[position]
    leaf_ids = index.arrays["leaf_item_ids"][: layout.num_sequences]
    merged_ids = np.insert(leaf_ids[kept], at, ids)
    merged = leaf_columns(index)
    index = None  # the served arrays are read: the caller's copy is the last
    for t, column in enumerate(merged):  # one column at a time: one extra column of memory
        merged[t] = np.insert(column[kept], at, adds[:, t].astype(column.dtype))
    del column
    # Kept member k moves up by the added rows inserted at or before it.
    new_members = np.arange(kept.size, dtype=np.int64)
    new_members += np.searchsorted(at, new_members, side="right")
    lcp = builder._common_prefix_lengths(merged)
    capacity = layout.graph_shape() if layout.has_headroom else None
    new_layout, arrays = builder.arrays_from_sorted(
        merged, lcp, merged_ids, layout.vocab_size, layout.dense_levels, 0, capacity=capacity
    )
    return StaticIndex(new_layout, arrays), kept, new_members


def leaf_columns(index: StaticIndex) -> list[np.ndarray]:
    """The used leaves' sequences, sorted, as one array per position (the
    index's token dtype): one gather per level, from the leaves up."""
    layout, arrays = index.layout, index.arrays
    used = layout.filled_level_sizes
    d, length = layout.dense_levels, layout.length
    columns: list[np.ndarray] = [None] * length
    # int32 while the states fit: half the memory traffic of the gathers
    small = max(used) < np.iinfo(np.int32).max
    ancestor = np.arange(used[length], dtype=np.int32 if small else np.int64)  # depth t + 1
    for t in range(length - 1, d - 1, -1):
        columns[t] = arrays["tokens"][layout.edge_offsets[t] + ancestor]
        ancestor = _parents(layout, arrays, t)[ancestor]
    if d:
        codes = np.flatnonzero(arrays["dense_states"] >= 0)[ancestor]
        dtype = columns[-1].dtype if d < length else np.dtype(np.int32)
        for t in range(d - 1, -1, -1):
            codes, digit = np.divmod(codes, layout.vocab_size)
            columns[t] = digit.astype(dtype)
    return columns


def _parents(layout, arrays, t: int) -> np.ndarray:
    """`[used states at depth t + 1]`: each one's parent at depth t (local)."""
    used = layout.filled_level_sizes
    dtype = np.int32 if max(used) < np.iinfo(np.int32).max else np.int64
    if t not in layout.indptr_offsets:
        return np.arange(used[t + 1], dtype=dtype)
    row0 = layout.indptr_offsets[t]
    counts = np.diff(arrays["indptr"][row0 : row0 + used[t] + 1])
    return np.repeat(np.arange(used[t], dtype=dtype), counts)


def _locate(index: StaticIndex, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`(position, member)` int64 per row: the number of served leaves
    before it in sorted order, and the leaf it equals (-1: none)."""
    layout, arrays = index.layout, index.arrays
    n, d, vocab = rows.shape[0], layout.dense_levels, layout.vocab_size
    rows = rows.astype(np.int64)
    position = np.full(n, -1, np.int64)
    tail = np.zeros(n, np.int64)  # tail state (global tail numbering) while inside
    if d:
        code = np.zeros(n, np.int64)
        for t in range(d):
            code = code * vocab + rows[:, t]
        tail = arrays["dense_states"][code].astype(np.int64)
        outside = np.flatnonzero(tail < 0)
        if outside.size:  # before the members of the next code present
            valid = arrays["dense_states"] >= 0
            codes = code[outside]
            # The first depth-d state at or after a code: the valid codes before it.
            first_state = np.cumsum(valid)[codes] - valid[codes]
            depth = np.full(outside.size, d, np.int64)
            position[outside] = member_ranges.first_tail_members(layout, arrays, first_state,
                                                                 depth)  # fmt: skip
    for t in range(d, layout.length):
        inside = np.flatnonzero(tail >= 0)
        if not inside.size:
            break
        start, end = tree_walk.row_bounds(layout, arrays, tail[inside], t)
        edge = _lower_bound(arrays["tokens"], start, end, rows[inside, t])
        hit = (edge < end) & (
            arrays["tokens"][np.minimum(edge, arrays["tokens"].size - 1)] == rows[inside, t]
        )
        # Missed: before the first member under the next sibling edge (the
        # lower bound), which is one past the row's last for a larger token.
        miss = inside[~hit]
        next_state = layout.level_sizes[d] + edge[~hit]
        depth = np.full(miss.size, t + 1, np.int64)
        position[miss] = member_ranges.first_tail_members(layout, arrays, next_state, depth)
        tail[miss] = -1
        tail[inside[hit]] = layout.level_sizes[d] + edge[hit]
    found = tail >= 0
    member = np.where(found, tail - layout.leaf_offset, -1)
    position[found] = member[found]
    return position, member


def _lower_bound(tokens, start, end, target) -> np.ndarray:
    """First edge in `tokens[start:end]` (sorted per row) `>= target`, else `end`."""
    lo, hi = start.astype(np.int64), end.astype(np.int64)
    while True:
        active = lo < hi
        if not active.any():
            return lo
        mid = (lo + hi) // 2
        value = tokens[np.where(active, mid, 0)].astype(np.int64)
        right = active & (value < target)
        lo = np.where(right, mid + 1, lo)
        hi = np.where(active & ~right, mid, hi)


def _added(index, sequences, item_ids) -> tuple[np.ndarray, np.ndarray]:
    layout = index.layout
    if sequences is None and item_ids is None:
        return np.zeros((0, layout.length), np.int64), np.zeros(0, np.int64)
    if sequences is None or item_ids is None:
        raise ValueError("`add_sequences` and `add_item_ids` go together: pass both or neither")
    array = np.asarray(sequences)
    if array.ndim == 2 and array.shape[0] == 0:
        return np.zeros((0, layout.length), np.int64), _item_ids(item_ids, "add_item_ids")
    try:
        seqs = validate_sequences(array, layout.vocab_size)
    except ValueError as error:
        raise ValueError(str(error).replace("`sequences`", "`add_sequences`")) from None
    if seqs.shape[1] != layout.length:
        raise ValueError(
            f"`add_sequences` must have {layout.length} tokens per row (the index's length). "
            f"Received shape {seqs.shape}"
        )
    try:
        ids = validate_item_ids(item_ids, seqs.shape[0])
    except ValueError as error:
        raise ValueError(str(error).replace("`item_ids`", "`add_item_ids`")) from None
    return seqs, ids


def _item_ids(values, name: str) -> np.ndarray:
    if values is None:
        return np.zeros(0, np.int64)
    array = np.asarray(values)
    if array.size == 0:
        return np.zeros(0, np.int64)
    if array.ndim != 1 or array.dtype == bool or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"`{name}` must be a vector of integer item ids. Received "
                         f"shape {array.shape}, dtype {array.dtype}")  # fmt: skip
    array = array.astype(np.int64)
    if array.min() < 0:
        raise ValueError(
            f"`{name}` must be non-negative item ids. Received {_first(array[array < 0])}"
        )
    return array


def _first(ids) -> str:
    ids = np.asarray(ids).reshape(-1)
    shown = ", ".join(str(int(i)) for i in ids[:_SHOWN])
    return f"[{shown}{', ...' if ids.size > _SHOWN else ''}]"
