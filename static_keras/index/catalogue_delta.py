"""A catalogue delta: the index of a changed catalogue without a full sort.

A served index's leaves are its catalogue's semantic IDs in sorted order and
its levels are the distinct prefixes in the same order, so a day's change
(items added with their semantic IDs, item ids removed) is a merge, level by
level, of the served trie with a few new nodes:

1. the added rows are sorted among themselves and walked down the served
   trie (a binary search per level within one row, vectorised over the
   added rows): how deep each is a served prefix, and before which served
   node of every deeper level its new nodes go;
2. from the leaves up, each served node keeps its place if a kept leaf or
   an added row lies below it (the kept leaves before each node are one
   gather of the level below's at the nodes' first children); the others
   are deleted and the new nodes inserted (`np.insert`, one pass per level);
   where each merged node's children start is a running sum of the served
   child counts, corrected by the children that died or were born;
3. the build's level pass (`builder.arrays_from_levels`) writes the CSR
   arrays, keeping the served dense depth, straight into the served
   capacities when the index has headroom.

The result equals `StaticIndex.build` of the new catalogue (same language,
same item ids; same arrays when the layouts coincide), or a `CapacityError`
naming the capacity the new catalogue exceeds.

NumPy only.
"""

from __future__ import annotations

import numpy as np

from static_keras.index import builder
from static_keras.index import tree_walk
from static_keras.index.input_checks import check_duplicate_policy
from static_keras.index.input_checks import validate_item_ids
from static_keras.index.input_checks import validate_sequences
from static_keras.index.member_catalogue import NO_ITEM
from static_keras.index.member_catalogue import MemberCatalogue
from static_keras.index.static_index import StaticIndex

#: Offending ids an error message names.
_SHOWN = 5
#: Elements per slice where a full-size temporary would cost memory.
_SLICE = 1 << 22


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
    release_served: bool = False,
) -> tuple[StaticIndex, np.ndarray, np.ndarray]:
    """`apply_delta`, and where the kept members went: `(new index,
    old_members, new_members)`, int64, served member `old_members[i]` is
    member `new_members[i]` of the new index (what carries eligibility sets
    over without a search by item id). `release_served=True` empties
    `index` and `catalogue` once the merge has read them (a job holding
    the only copy: the new arrays are then built in the memory the served
    ones held)."""
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
    trie = _Levels(index)
    inside, cursor = trie.locate(adds)  # in the served leaf order
    member = np.where(inside == layout.length, cursor[:, -1], -1)
    kept_same = (member >= 0) & ~gone[np.maximum(member, 0)]
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
            keep = ~kept_same
            adds, ids, inside, cursor = adds[keep], ids[keep], inside[keep], cursor[keep]
        else:  # "last": the added item takes the leaf
            gone[member[kept_same]] = True

    if release_served:  # every id is looked up
        catalogue.release()
    del catalogue
    kept = np.flatnonzero(~gone)
    if not kept.size and not ids.size:
        raise ValueError("The delta removes every item: an index needs at least one")
    leaf_ids = index.arrays["leaf_item_ids"][: layout.num_sequences]
    served = index
    del index
    merge = _Merge(trie, gone, adds, inside, cursor)
    level_tokens = merge.levels()
    new_members = merge.kept_to_merged[:-1]  # where each kept member went
    # The merged item ids, in the served capacity when there is one (-1
    # past the items), a slice at a time (no full-size temporary).
    total = new_members.size + ids.size
    fits = layout.has_headroom and total <= layout.num_members  # else the build says so
    merged_ids = np.full(layout.num_members if fits else total, NO_ITEM, np.int64)
    merged_ids[merge.add_leaf] = ids
    for start in range(0, kept.size, _SLICE):
        part = slice(start, start + _SLICE)
        merged_ids[new_members[part]] = leaf_ids[kept[part]]
    del leaf_ids
    # The new row pointers are found level by level from the served ones:
    # a job holding the only copy writes them over the served ones, level
    # by level (the same offsets in the served capacities); the rest of the
    # served arrays go first.
    capacity = layout.graph_shape() if layout.has_headroom else None
    indptr = None
    if release_served:
        indptr = served._arrays["indptr"] if capacity is not None else None
        served._arrays.clear()
    new_layout, arrays = builder.arrays_from_levels(
        level_tokens, merge.first_children, merged_ids, layout.vocab_size, layout.dense_levels,
        0, capacity=capacity, indptr=indptr,
    )  # fmt: skip
    return StaticIndex(new_layout, arrays), kept, new_members


def catalogue_after_delta(
    served_table, old_members, new_members, member_item_ids
) -> MemberCatalogue:
    """The catalogue of a delta's new index from the served one's exclusion
    table, by a merge: no sort of the N item ids, no gather of them (the
    served table gives the kept ids in order), a slice at a time.

    Args:
        served_table: `(ids, members)`: the served exclusion table
            (`MemberCatalogue.exclusion_table()`: ids ascending, ties by
            member).
        old_members, new_members: int: served member `old_members[i]` is
            member `new_members[i]` of the new index
            (`apply_delta_with_member_map`); the order of kept members is
            kept, so the kept entries stay sorted.
        member_item_ids: int64 `[new members]`: the new index's item id of
            each member (`NO_ITEM` for a slot with no item).

    Returns:
        The `MemberCatalogue` that `MemberCatalogue.from_index` gives for the
        new index (the same table), bound to `member_item_ids`.
    """
    ids = np.asarray(member_item_ids)
    count = ids.size
    member_dtype = np.int32 if count < 2**31 else np.int64
    served_ids, served_members = (np.asarray(part) for part in served_table)
    remap = np.full(max(int(served_members.max(initial=-1)) + 1, 0), -1, member_dtype)
    remap[old_members] = new_members
    # The other members of the new index: added items, and slots with no item.
    covered = np.zeros(count, bool)
    covered[new_members] = True
    rest = np.flatnonzero(~covered).astype(member_dtype)
    del covered
    rest_ids = ids[rest]
    empty = rest[rest_ids == NO_ITEM]
    added = rest[rest_ids != NO_ITEM]
    del rest, rest_ids
    added = added[np.argsort(ids[added], kind="stable")]
    added_ids = ids[added]
    table_ids = np.empty(count, np.int64)
    table_members = np.empty(count, member_dtype)
    table_ids[: empty.size], table_members[: empty.size] = NO_ITEM, empty
    body_ids, body_members = table_ids[empty.size :], table_members[empty.size :]
    # The kept entries, in table order, packed at the front of the body.
    kept = 0
    for start in range(0, served_ids.size, _SLICE):
        new = remap[served_members[start : start + _SLICE]]
        keep = new >= 0
        size = int(np.count_nonzero(keep))
        body_ids[kept : kept + size] = served_ids[start : start + _SLICE][keep]
        body_members[kept : kept + size] = new[keep]
        kept += size
    del remap
    # No added id equals a kept one (`apply_delta` refuses it): a left search
    # places each added entry; kept entry i moves up by the added entries
    # placed at or before it, the last slice first (nothing unread is
    # overwritten: the moves only go up, and targets increase).
    at = np.searchsorted(body_ids[:kept], added_ids, side="left")
    for start in reversed(range(0, kept, _SLICE)):
        where = np.arange(start, min(start + _SLICE, kept))
        shift = np.searchsorted(at, where, side="right")
        if not shift[-1]:
            break  # no added entry before this slice, nor before any earlier one
        part_ids, part_members = body_ids[where].copy(), body_members[where].copy()
        body_ids[where + shift], body_members[where + shift] = part_ids, part_members
    placed = at + np.arange(added.size)
    body_ids[placed], body_members[placed] = added_ids, added
    return MemberCatalogue.from_sorted(table_ids, table_members, count, member_item_ids=ids)


class _Levels:
    """The served trie level by level. Depth u's nodes are numbered in leaf
    order; `tokens[u]` is the last token of each, and `first_child(u, j)`
    the first node of depth u + 1 at or after node j's children (j may be
    one past the last: then one past the last of depth u + 1). Tail depths
    read the CSR rows, dense depths the codes of the state map."""

    def __init__(self, index: StaticIndex):
        layout, arrays = index.layout, index.arrays
        self.layout, self.arrays = layout, arrays
        used = layout.filled_level_sizes
        length, d, vocab = layout.length, layout.dense_levels, layout.vocab_size
        # int32 where the leaves fit: half the memory traffic of each pass
        self.dtype = np.int32 if used[length] < np.iinfo(np.int32).max else np.int64
        self.tokens: list = [None] * (length + 1)
        for u in range(d, length):
            edge0 = layout.edge_offsets[u]
            self.tokens[u + 1] = arrays["tokens"][edge0 : edge0 + used[u + 1]]
        self.codes = [np.zeros(1, np.int64)]  # depth u <= d: the codes of its nodes, ascending
        self.dense_children = []  # depth u < d: first child of each node (and one past)
        if d:
            deepest = np.flatnonzero(arrays["dense_states"] >= 0)
            for u in range(1, d + 1):
                prefix = deepest // vocab ** (d - u)
                first = np.flatnonzero(np.concatenate([[True], prefix[1:] != prefix[:-1]]))
                self.codes.append(prefix[first])
                self.tokens[u] = (prefix[first] % vocab).astype(arrays["tokens"].dtype)
            for u in range(d):
                parents = self.codes[u + 1] // vocab
                self.dense_children.append(np.searchsorted(parents, np.append(self.codes[u], -1)))
                self.dense_children[u][-1] = parents.size

    def child_starts(self, u: int) -> tuple[np.ndarray, int]:
        """`(starts, shift)`: `starts - shift` is the first child of every
        node of depth u and one past the last (`starts` a view of the row
        pointers where depth u has them: no copy)."""
        layout = self.layout
        if u < layout.dense_levels:
            return self.dense_children[u], 0
        count = layout.filled_level_sizes[u] + 1
        if u not in layout.indptr_offsets:  # one child per state
            return np.arange(count, dtype=self.dtype), 0
        row0 = layout.indptr_offsets[u]
        return self.arrays["indptr"][row0 : row0 + count], layout.edge_offsets[u]

    def first_child(self, u: int, nodes=None) -> np.ndarray:
        """The first child of `nodes` of depth u (all of them and one past
        the last when None)."""
        layout = self.layout
        if nodes is not None and u >= layout.dense_levels and u not in layout.indptr_offsets:
            return nodes  # one child per state
        starts, shift = self.child_starts(u)
        if nodes is not None:
            starts = starts[nodes]
        return starts - shift if shift else starts

    def locate(self, rows: np.ndarray):
        """Per added row: `inside` (the depth to which its prefix is a served
        node) and `cursor` `[k, L + 1]`: at depths <= inside that node, past
        them the served node it goes before (how many served nodes of the
        depth sort before its prefix); `cursor[:, L]` is its leaf position."""
        layout, arrays = self.layout, self.arrays
        k, length, d, vocab = rows.shape[0], layout.length, layout.dense_levels, layout.vocab_size
        rows = rows.astype(np.int64)
        inside = np.zeros(k, np.int64)
        cursor = np.zeros((k, length + 1), np.int64)
        going = np.ones(k, bool)
        prefix = np.zeros(k, np.int64)
        last = arrays["tokens"].size - 1
        for u in range(length):
            out = np.flatnonzero(~going)  # below a new node: the first served node after it
            cursor[out, u + 1] = self.first_child(u, cursor[out, u])
            rows_in = np.flatnonzero(going)
            if u < d:
                prefix = prefix * vocab + rows[:, u]
                codes = self.codes[u + 1]
                at = np.searchsorted(codes, prefix[rows_in])
                hit = at < codes.size
                hit[hit] = codes[at[hit]] == prefix[rows_in[hit]]
                cursor[rows_in, u + 1] = at
            else:
                state = layout.tail_state_offsets[u] + cursor[rows_in, u]
                start, end = tree_walk.row_bounds(layout, arrays, state, u)
                edge = tree_walk.lower_bound(arrays["tokens"], start, end, rows[rows_in, u])
                hit = (edge < end) & (arrays["tokens"][np.minimum(edge, last)] == rows[rows_in, u])
                cursor[rows_in, u + 1] = edge - layout.edge_offsets[u]
            inside[rows_in[hit]] = u + 1
            going[rows_in[~hit]] = False
        return inside, cursor


class _Merge:
    """The merged trie's levels: each depth's served nodes that keep a leaf
    or an added row, and the added rows' new nodes inserted in order.

    Edits are few (a delta) and levels are long, so a depth costs a handful
    of passes: from the leaves up, the kept leaves before each node (a
    gather of the depth below's at its first children), a compare, a delete
    of the dead nodes and an insert of the new ones; then, per depth, where
    each node's children start: the served child counts, less the dead
    children, plus the new ones, the dead nodes deleted and the new ones
    inserted as for the tokens, and a running sum. What the added rows
    index is a search over them."""

    def __init__(self, trie: _Levels, gone, adds, inside, cursor):
        self.trie, self.adds = trie, adds
        length, dtype = trie.layout.length, trie.dtype
        # A row equal to a removed leaf is a new leaf on served nodes.
        self.inside = np.minimum(inside, length - 1)
        self.cursor = cursor
        kept_before = np.zeros(gone.size + 1, dtype)  # kept leaves before each leaf
        np.cumsum(~gone, out=kept_before[1:])
        self.kept_before = kept_before
        self.at = kept_before[cursor[:, length]].astype(np.int64)  # `np.insert` index of each row
        self.add_leaf = self.at + np.arange(adds.shape[0])  # merged leaf of each added row
        # The merged leaf of each kept leaf (by kept rank): its rank plus the
        # added rows inserted at or before it.
        kept = int(kept_before[-1])
        self.kept_to_merged = np.zeros(kept + 1, dtype)
        np.add.at(self.kept_to_merged, self.at, 1)
        np.cumsum(self.kept_to_merged, out=self.kept_to_merged)
        self.kept_to_merged += np.arange(kept + 1, dtype=dtype)
        add_lcp = (
            builder._common_prefix_lengths([adds[:, t] for t in range(length)])
            if adds.shape[0] else np.zeros(0, np.int8)
        )  # fmt: skip
        # Per depth u: the added rows that open a node there (their prefix
        # is neither served nor the previous row's), the served nodes that
        # die, and where the new nodes go once those are deleted.
        none = np.zeros(0, np.int64)
        self.opening = [none] + [
            np.flatnonzero((self.inside < u) & (add_lcp < u)) for u in range(1, length + 1)
        ]
        self.dead = [none] * (length + 1)
        self.where = [none] * (length + 1)

    def levels(self) -> list[np.ndarray]:
        """The tokens of each merged depth (`arrays_from_levels`'s
        `level_tokens`); `first_children` reads what this finds."""
        length = self.trie.layout.length
        level_tokens = [None] * length
        kept_rank = self.kept_before  # depth L: the kept leaves before each leaf
        for u in range(length, 0, -1):
            level_tokens[u - 1] = self._depth(u, kept_rank)
            kept_rank = kept_rank[self.trie.first_child(u - 1)]
        self.kept_before = None
        # `first_children` reads the served row pointers only.
        self.trie.tokens = None
        self.trie.arrays = {"indptr": self.trie.arrays["indptr"]}
        return level_tokens

    def _depth(self, u: int, kept_rank) -> np.ndarray:
        """The tokens of the merged nodes of depth u (`kept_rank`: kept
        leaves before each served node, and one past)."""
        alive = kept_rank[1:] > kept_rank[:-1]
        alive[self.cursor[self.inside >= u, u]] = True  # added rows through served nodes
        dead = np.flatnonzero(~alive)
        del alive
        opening = self.opening[u]
        where = self.cursor[opening, u]
        where -= np.searchsorted(dead, where, side="left")
        self.dead[u], self.where[u] = dead, where
        new_tokens = self.adds[opening, u - 1].astype(self.trie.tokens[u].dtype)
        return np.insert(np.delete(self.trie.tokens[u], dead), where, new_tokens)

    def first_children(self, t: int, out=None) -> np.ndarray:
        """Where the children of each merged node of depth t start among
        the merged nodes of depth t + 1 (after `levels`), written into
        `out` when given."""
        u = t + 1
        served_starts, shift = self.trie.child_starts(t)  # (read-only, served + shift)
        counts = np.diff(served_starts)
        # Dead children leave their served parent ...
        # (keys in the starts' dtype: a mixed search converts the whole level)
        dead = (self.dead[u] + shift).astype(served_starts.dtype)
        np.subtract.at(counts, np.searchsorted(served_starts, dead, side="right") - 1, 1)
        del served_starts, dead
        # ... new children join theirs: a served node, or a new node of depth
        # t (the one the last row opening at depth t at or before them opened).
        rows = self.opening[u]
        on_served = self.inside[rows] >= t
        np.add.at(counts, self.cursor[rows[on_served], t], 1)
        if self.dead[t].size:  # a dead node has no child left
            counts = np.delete(counts, self.dead[t])
        if t and self.opening[t].size:
            parent = np.searchsorted(self.opening[t], rows[~on_served], side="right") - 1
            new_counts = np.bincount(parent, minlength=self.opening[t].size)
            counts = np.insert(counts, self.where[t], new_counts.astype(counts.dtype))
        starts = np.empty(counts.size, counts.dtype) if out is None else out
        starts[0] = 0
        np.cumsum(counts[:-1], out=starts[1:], dtype=starts.dtype)
        return starts


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
