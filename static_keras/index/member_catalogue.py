"""`MemberCatalogue`: catalogue item ids -> member numbers of one index.

Eligibility sets, refreshes and per-request exclusions arrive as item ids
(what the catalogue and the business rules know); the bit vectors are over
member numbers (what the index's states cover). This map is built once per
index, on the host, and shared by every refresh.

NumPy only.
"""

from __future__ import annotations

import hashlib

import numpy as np

from static_keras.index import aligned_arrays

#: Direct (table) lookups of item ids while the largest id is at most this
#: many times the number of members (plus a constant): 4 bytes per slot.
_DIRECT_TABLE_SLACK = 4
#: Ids per step of a carry-over by item id (`shared_member_chunks`).
_SHARED_CHUNK = 1 << 22


def _item_id_array(values, name: str) -> np.ndarray:
    array = np.asarray(values)
    if array.size == 0:
        return np.zeros(0, np.int64)
    if array.dtype == bool or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"`{name}` must hold integer item ids. Received dtype {array.dtype}")
    if array.dtype == np.uint64:
        array = np.minimum(array, np.iinfo(np.int64).max)  # too large: not in any catalogue
    return array.astype(np.int64, copy=False)


class MemberCatalogue:
    """Maps catalogue item ids to member numbers of one index.

    Member m is the index's member state `first_member_state + m`; its item
    id is `index.item_ids` of that state (a semantic-ID index built without
    item ids uses the member number itself). Lookups are a table gather when
    the ids are distinct and not much larger than the number of members
    (ids 0..N-1 and the like: 4 bytes per id), otherwise a binary search of
    the sorted queries over the sorted ids (real catalogues: sparse 64-bit
    ids; an id may then name several members). Ids outside the catalogue
    match nothing.

    Args:
        member_item_ids: int `[num_members]` or None (identity: member m is
            item m; `arange(num_members)` is the same catalogue).
        num_members: int.
    """

    def __init__(self, member_item_ids, num_members: int):
        self.num_members = int(num_members)
        self._table = self._sorted_ids = self._sorted_members = None
        self._fingerprint = None
        self._ids = None
        self._ids_from_table = False
        self._distinct = True
        self._has_item_ids = member_item_ids is not None
        if member_item_ids is None:
            self._identity = True
            return
        ids = _item_id_array(member_item_ids, "member_item_ids")
        if ids.shape != (self.num_members,):
            raise ValueError(
                f"`member_item_ids` must have shape ({self.num_members},). Received {ids.shape}"
            )
        self._identity = _is_identity(ids)
        if self._identity:
            return
        self._ids = ids
        largest = int(ids.max()) if ids.size else -1
        if ids.size and ids.min() >= -1 and largest < _DIRECT_TABLE_SLACK * ids.size + 2**16:
            held = np.flatnonzero(ids >= 0)  # -1: a member slot with no item (headroom)
            table = np.full(largest + 1, -1, np.int32 if ids.size < 2**31 else np.int64)
            table[ids[held]] = held
            if np.count_nonzero(table >= 0) == held.size:  # distinct ids
                self._table = table
                return
        self._sorted_ids, self._sorted_members = _sorted_with_members(ids)
        self._distinct = not _repeats_an_item(self._sorted_ids)

    @classmethod
    def from_sorted(
        cls,
        sorted_ids,
        sorted_members,
        num_members: int,
        *,
        has_item_ids: bool = True,
        member_item_ids=None,
        fingerprint: str | None = None,
    ) -> "MemberCatalogue":
        """The catalogue from its ids sorted ascending and the member of each
        (a served version's exclusion table): no sort. The ids in member
        order (`item_ids`) are scattered from the table on first use only (a
        rules job never needs them: N int64s it would hold for nothing), unless
        `member_item_ids`, the same ids in member order, are at hand.
        `fingerprint`: the table's known fingerprint (a version's metadata,
        the table checked against its `exclusion_table_digest`), else
        derived from the table on first use."""
        sorted_ids = _item_id_array(sorted_ids, "sorted_ids")
        sorted_members = np.asarray(sorted_members)
        if sorted_members.dtype != np.int32:  # int32 as served: half the memory
            sorted_members = sorted_members.astype(np.int64)
        if sorted_ids.shape != (num_members,) or sorted_members.shape != (num_members,):
            raise ValueError(
                f"`sorted_ids` and `sorted_members` must have shape ({num_members},). "
                f"Received {sorted_ids.shape} and {sorted_members.shape}"
            )
        if num_members and _any_step(sorted_ids, np.less):
            raise ValueError("`sorted_ids` must be sorted ascending")
        ids = None
        if member_item_ids is not None:
            ids = _item_id_array(member_item_ids, "member_item_ids")
            if ids.shape != (num_members,):
                raise ValueError(f"`member_item_ids` must have shape ({num_members},)")
        catalogue = cls.__new__(cls)
        catalogue.num_members = int(num_members)
        catalogue._table = None
        catalogue._fingerprint = fingerprint
        catalogue._has_item_ids = bool(has_item_ids)
        if ids is None:
            catalogue._identity = _is_sorted_identity(sorted_ids, sorted_members)
        else:
            catalogue._identity = _is_identity(ids)
        catalogue._ids = None if catalogue._identity else ids
        catalogue._ids_from_table = ids is None and not catalogue._identity
        catalogue._sorted_ids = catalogue._sorted_members = None
        catalogue._distinct = True
        if not catalogue._identity:
            catalogue._sorted_ids, catalogue._sorted_members = sorted_ids, sorted_members
            catalogue._distinct = not _repeats_an_item(sorted_ids)
        return catalogue

    @classmethod
    def from_index(cls, index) -> "MemberCatalogue":
        """The catalogue of a `TokenAutomaton` (`StaticIndex`, `StringIndex`)."""
        layout = index.layout
        ids = None
        if index.has_item_ids:
            ids = index.archive_arrays()[layout.member_ids_array]
        return cls(ids, index.num_members)

    def release(self) -> None:
        """Drops the arrays (a job that holds the only copy and has looked
        up what it needs): afterwards only `num_members` answers."""
        self._ids = self._table = self._sorted_ids = self._sorted_members = None
        self._ids_from_table = False

    @property
    def item_ids(self) -> np.ndarray:
        """int64 `[num_members]`: the item id of each member."""
        if self._identity:
            return np.arange(self.num_members)
        if self._ids is None and self._ids_from_table:
            self._ids = np.full(self.num_members, NO_ITEM, np.int64)
            self._ids[self._sorted_members] = self._sorted_ids
        return self._ids

    @property
    def has_item_ids(self) -> bool:
        """Whether the ids are catalogue item ids (False: member numbers,
        positions that a new catalogue reassigns)."""
        return self._has_item_ids

    @property
    def nbytes(self) -> int:
        """Host bytes of the lookup structure (not sent to the device)."""
        parts = (self._table, self._sorted_ids, self._sorted_members)
        return sum(part.nbytes for part in parts if part is not None)

    @property
    def fingerprint(self) -> str:
        """SHA-256 of the member -> item id map: what eligibility sets bind
        to (sets over another catalogue would name other items)."""
        if self._fingerprint is None:
            if self._ids is None and self._ids_from_table:
                self._fingerprint = _table_fingerprint(
                    self._sorted_ids, self._sorted_members, self.num_members
                )
            else:
                self._fingerprint = catalogue_fingerprint(
                    None if self._identity else self._ids, self.num_members
                )
        return self._fingerprint

    def lookup(self, item_ids) -> tuple[np.ndarray, np.ndarray]:
        """`(query, member)` int64: every member of every id (query = position
        in the flattened `item_ids`, ascending); ids outside the catalogue
        give nothing."""
        ids = _item_id_array(item_ids, "item_ids").reshape(-1)
        if self._identity:
            query = np.flatnonzero((ids >= 0) & (ids < self.num_members))
            return query, ids[query]
        if self._table is not None:
            inside = (ids >= 0) & (ids < self._table.size)
            member = np.full(ids.size, -1, np.int64)
            member[inside] = self._table[ids[inside]]
            query = np.flatnonzero(member >= 0)
            return query, member[query]
        if not _any_step(ids, np.less):  # already ascending: no sort, no reorder
            return self._sorted_lookup(ids)
        # Sorted queries walk the sorted ids in one direction: a binary
        # search of unsorted ones misses the cache at every level.
        order = np.argsort(ids, kind="stable")
        query, member = self._sorted_lookup(ids[order])
        query = order[query]
        ranked = np.argsort(query, kind="stable")
        return query[ranked], member[ranked]

    def members(self, item_ids) -> np.ndarray:
        """int: the members of `item_ids` (unsorted, may repeat)."""
        members = self._members_or_absent(item_ids)
        return members[members >= 0]

    def _members_or_absent(self, item_ids) -> np.ndarray:
        """Members of `item_ids` in no particular order, with -1 for ids
        outside the catalogue where that saves a pass (the set build and
        refresh path: a table gather, or a sort of the ids and one search)."""
        ids = _item_id_array(item_ids, "item_ids").reshape(-1)
        if self._table is not None:
            if ids.size and ids.min() >= 0 and ids.max() < self._table.size:
                return np.take(self._table, ids)
            return self.lookup(ids)[1]
        if self._identity:
            return self.lookup(ids)[1]
        # A set's ids often come sorted (a saved set, a table's column): one
        # pass tells, where a sort of 5 x 10^7 sorted ids costs about 4 s.
        ascending = not _any_step(ids, np.less)
        return self._sorted_lookup(ids if ascending else np.sort(ids))[1]

    def shared_members(self, other: "MemberCatalogue") -> tuple[np.ndarray, np.ndarray]:
        """All of `shared_member_chunks` at once."""
        pairs = list(self.shared_member_chunks(other))
        if not pairs:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return tuple(np.concatenate(part) for part in zip(*pairs))

    def shared_member_chunks(self, other: "MemberCatalogue", chunk: int | None = None):
        """`(member here, member in other)` int64 for every item id the two
        catalogues share (an index swap carries eligibility over by these
        pairs), `chunk` of this catalogue's ids at a time (default
        `_SHARED_CHUNK`; at 10^8 items all the pairs at once are GBs): one
        pass of this catalogue's ids, ascending, over the other."""
        if not isinstance(other, MemberCatalogue):
            raise TypeError(f"`other` must be a MemberCatalogue. Received {type(other).__name__}")
        bad_chunk = isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1
        if chunk is not None and bad_chunk:
            raise ValueError(f"`chunk` must be a positive int or None. Received: chunk={chunk!r}")
        ids, members = self._ascending()
        step = chunk or _SHARED_CHUNK
        for start in range(0, ids.size, step):
            query, theirs = other._lookup_ascending(ids[start : start + step])
            yield members[start : start + step][query], theirs

    def _ascending(self) -> tuple[np.ndarray, np.ndarray]:
        """`(item ids ascending, member of each)`, members with no item left out."""
        if self._identity:
            every = np.arange(self.num_members, dtype=np.int64)
            return every, every
        if self._table is not None:
            ids = np.flatnonzero(self._table >= 0)
            return ids, self._table[ids].astype(np.int64)
        start, stop = _no_item_run(self._sorted_ids)
        if start == 0:  # no slots without an item, or all first (ids ascending): views
            return self._sorted_ids[stop:], self._sorted_members[stop:]
        keep = np.r_[0:start, stop : self._sorted_ids.size]
        return self._sorted_ids[keep], self._sorted_members[keep]

    def exclusion_table(self) -> tuple[np.ndarray, np.ndarray]:
        """`(ids, members)` `[num_members]`: every member's item id (int64),
        ascending, and the member of each (int32 where it fits); the members with no item (-1,
        the slots of an index with headroom) first. What a served model
        searches for a request's exclusions: its size is fixed by the
        layout, so a new catalogue within it is new values, not a new graph."""
        if self._sorted_ids is not None:  # every member's id sorted, -1 first: the table
            return self._sorted_ids, self._sorted_members
        ids, members = self._ascending()
        empty = self.num_members - ids.size
        if empty:
            held = np.zeros(self.num_members, bool)
            held[members] = True
            ids = np.concatenate([np.full(empty, -1, np.int64), ids])
            members = np.concatenate([np.flatnonzero(~held), members])
        return ids, members

    def _lookup_ascending(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`lookup` of ids known to be ascending (no sort)."""
        if self._sorted_ids is None:
            return self.lookup(ids)
        return self._sorted_lookup(ids)

    def _sorted_lookup(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`lookup` of ascending `ids` over the sorted catalogue (-1 names
        nothing: it marks the members with no item, and pads requests)."""
        start, stop = _no_item_run(ids)
        if start < stop:  # -1 names no item: look up what is around it
            below, above = self._sorted_lookup(ids[:start]), self._sorted_lookup(ids[stop:])
            return np.concatenate([below[0], above[0] + stop]), np.concatenate([below[1], above[1]])
        if self._distinct:
            return self._distinct_lookup(ids)
        left = search_ascending(self._sorted_ids, ids, side="left")
        right = search_ascending(self._sorted_ids, ids, side="right")
        counts = right - left
        query = np.repeat(np.arange(ids.size, dtype=np.int64), counts)
        first = np.cumsum(counts) - counts
        position = np.arange(query.size, dtype=np.int64) - np.repeat(first - left, counts)
        return query, self._sorted_members[position]

    def _distinct_lookup(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`_sorted_lookup` where every item has one member: a block of the
        ids at a time within its window of the table, so that no temporary
        is as long as the ids (at 5 x 10^7 ids, each was 400 MB of fresh
        memory to fault in)."""
        queries, members = [np.zeros(0, np.int64)], [self._sorted_members[:0]]
        for start, stop, low, high in _ascending_blocks(self._sorted_ids, ids, "right"):
            window, asked = self._sorted_ids[low:high], ids[start:stop]
            if not window.size:
                continue
            position = np.searchsorted(window, asked, side="left")
            found = np.flatnonzero(window[np.minimum(position, window.size - 1)] == asked)
            queries.append(found + start)
            members.append(self._sorted_members[low:high][position[found]])
        return np.concatenate(queries), np.concatenate(members)

    def exclusion_members(self, excluded_item_ids, width: int | None = None) -> np.ndarray:
        """int32 `[R, width]`: each row's excluded items as sorted, distinct
        member numbers, padded with `num_members`.

        The padding lies outside every range `[lo, hi)` (`hi <= num_members`)
        and reads a zero bit, so a device kernel can sum over all `width`
        slots without a mask. Distinct matters: the enterable rule subtracts
        each excluded member once.

        Args:
            excluded_item_ids: int `[R, E]` item ids, padded with -1; may
                repeat ids and hold ids outside the catalogue.
            width: int or None. Slots per row; defaults to `E`. ValueError
                when a row has more distinct excluded members (only when one
                item id names several members).
        """
        raw = np.asarray(excluded_item_ids)
        if raw.ndim != 2:
            raise ValueError(
                f"`excluded_item_ids` must have rank 2 [R, E]. Received shape {raw.shape}"
            )
        rows, columns = raw.shape
        width = columns if width is None else int(width)
        dtype = np.int32 if self.num_members < 2**31 - 1 else np.int64
        out = np.full((rows, width), self.num_members, dtype)
        if raw.size == 0:
            return out
        query, member = self.lookup(raw)
        keys = np.unique((query // columns) * (self.num_members + 1) + member)
        row, member = np.divmod(keys, self.num_members + 1)
        starts = np.searchsorted(row, np.arange(rows))
        slot = np.arange(row.size) - starts[row]
        if slot.size and slot.max() >= width:
            raise ValueError(
                f"A row has {int(slot.max()) + 1} distinct excluded members, more than "
                f"width={width} (an item id names several members): pass a larger `width`"
            )
        out[row, slot] = member
        return out


def _is_identity(ids: np.ndarray) -> bool:
    """Whether member m is item m for every m (one catalogue, one fingerprint)."""
    return bool(ids.size == 0 or (ids[0] == 0 and ids[-1] == ids.size - 1
                                  and np.array_equal(ids, np.arange(ids.size))))  # fmt: skip


def _is_sorted_identity(sorted_ids: np.ndarray, sorted_members: np.ndarray) -> bool:
    """`_is_identity` of the ids in member order, read off the sorted table
    (ascending ids 0..N-1 with member m at position m), a chunk at a time."""
    size = sorted_ids.size
    if size == 0:
        return True
    if sorted_ids[0] != 0 or sorted_ids[-1] != size - 1:
        return False
    for start in range(0, size, _CHUNK):
        expected = np.arange(start, min(start + _CHUNK, size))
        chunk = slice(start, start + _CHUNK)
        if not (np.array_equal(sorted_ids[chunk], expected)
                and np.array_equal(sorted_members[chunk], expected)):  # fmt: skip
            return False
    return True


def _table_fingerprint(sorted_ids, sorted_members, num_members: int) -> str:
    """`catalogue_fingerprint` of the ids in member order, hashed a chunk of
    members at a time from the sorted table through an int32 inverse (half
    of the int64 ids in member order it avoids holding)."""
    index_dtype = np.int32 if sorted_ids.size < 2**31 else np.int64
    position = np.full(num_members, -1, index_dtype)  # of each member in the table
    for start in range(0, sorted_members.size, _CHUNK):
        members = sorted_members[start : start + _CHUNK]
        position[members] = np.arange(start, start + members.size, dtype=index_dtype)
    digest = hashlib.sha256(f"members:{int(num_members)};".encode())
    for start in range(0, num_members, _CHUNK):
        at = position[start : start + _CHUNK]
        ids = np.where(at >= 0, sorted_ids[np.maximum(at, 0)], NO_ITEM).astype("<i8")
        digest.update(ids.data)
    return digest.hexdigest()


#: Queries per block of `search_ascending`: a block's window of a 10^8
#: table (about 2 x 16 K int64) stays in cache while the block is searched.
_SEARCH_BLOCK = 1 << 14


def search_ascending(sorted_values: np.ndarray, queries: np.ndarray, side: str = "left"):
    """`np.searchsorted(sorted_values, queries, side)` for ascending `queries`,
    a block of them at a time within the window that the block's first and
    last query bound (their answers are monotone, so every answer of the block
    lies in it). NumPy's search of sorted queries narrows from below only and
    starts each one over the rest of the array: 5 x 10^7 queries into 1.1 x
    10^8 ids take 2.3-3.2 s that way, 1.3-1.4 s by blocks."""
    out = np.empty(queries.size, np.intp)
    for start, stop, low, high in _ascending_blocks(sorted_values, queries, side):
        found = out[start:stop]
        found[:] = np.searchsorted(sorted_values[low:high], queries[start:stop], side=side)
        found += low
    return out


def _ascending_blocks(sorted_values: np.ndarray, queries: np.ndarray, side: str):
    """`(start, stop, low, high)` per block of `_SEARCH_BLOCK` ascending
    queries: `sorted_values[low:high]` holds every answer of
    `queries[start:stop]` (`side` of the block's last query bounds it: "right"
    keeps an entry equal to it inside)."""
    if queries.size <= _SEARCH_BLOCK:
        if queries.size:
            yield 0, queries.size, 0, sorted_values.size
        return
    starts = np.arange(0, queries.size, _SEARCH_BLOCK)
    ends = np.minimum(starts + _SEARCH_BLOCK, queries.size)
    low = np.searchsorted(sorted_values, queries[starts], side="left")
    high = np.searchsorted(sorted_values, queries[ends - 1], side=side)
    yield from zip(starts.tolist(), ends.tolist(), low.tolist(), high.tolist())


def _any_step(values: np.ndarray, compare) -> bool:
    """Whether `compare(values[i + 1], values[i])` holds for any i, a chunk
    at a time (a bool per entry at once is N bytes for one answer)."""
    for start in range(0, max(values.size - 1, 0), _CHUNK):
        stop = min(start + _CHUNK, values.size - 1)
        if np.any(compare(values[start + 1 : stop + 1], values[start:stop])):
            return True
    return False


#: Members per chunk of the table passes above (8 MiB of int64).
_CHUNK = 1 << 20


def _sorted_with_members(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`(ids ascending, member of each)`, ties by member: the exclusion table
    as served, in aligned buffers that its variables take without a copy,
    the members int32 where they fit (at 10^8 items the table was 3 GB of
    transient copies in an export). Where the id span leaves room, id and
    member share one int64 key and one vectorised sort does it (about 10x a
    stable argsort at 2 x 10^7)."""
    bits = max(int(ids.size - 1).bit_length(), 1)
    low = int(ids.min())
    members = aligned_arrays.empty(ids.shape, np.int32 if ids.size <= 2**31 else np.int64)
    if int(ids.max()) - low < 2 ** (62 - bits):
        keys = aligned_arrays.empty(ids.shape, np.int64)
        np.subtract(ids, low, out=keys)
        keys <<= bits
        for start in range(0, ids.size, _CHUNK):  # the member numbers, a chunk at a time
            keys[start : start + _CHUNK] |= np.arange(start, min(start + _CHUNK, ids.size))
        keys.sort()
        np.bitwise_and(keys, (1 << bits) - 1, out=members, casting="unsafe")
        keys >>= bits
        keys += low
        return keys, members
    order = np.argsort(ids, kind="stable")
    members[:] = order
    sorted_ids = aligned_arrays.empty(ids.shape, np.int64)
    np.take(ids, order, out=sorted_ids)
    return sorted_ids, members


def exclusion_table_digest(fingerprint: str, sorted_ids, sorted_members) -> str:
    """SHA-256 binding a served exclusion table to its catalogue's
    fingerprint: the fingerprint, then the ids (little-endian int64) and the
    members (int32) in table order. A reader checks a table against it in
    one sequential pass; re-deriving the fingerprint reads the table in
    member order (two random passes: 4.6 s of a 6.8 s rules job at 10^8)."""
    size = int(np.asarray(sorted_ids).size)
    digest = hashlib.sha256(f"exclusion-table:{fingerprint}:{size};".encode())
    for values, dtype in ((sorted_ids, "<i8"), (sorted_members, "<i4")):
        for start in range(0, size, _CHUNK):
            digest.update(np.ascontiguousarray(values[start : start + _CHUNK], dtype).data)
    return digest.hexdigest()


def catalogue_fingerprint(member_item_ids, num_members: int) -> str:
    """SHA-256 of a member -> item id map (None or `arange`: the identity),
    without building the lookup structure."""
    digest = hashlib.sha256(f"members:{int(num_members)};".encode())
    ids = None if member_item_ids is None else _item_id_array(member_item_ids, "member_item_ids")
    if ids is None or _is_identity(ids):
        digest.update(b"identity")
    else:
        digest.update(np.ascontiguousarray(ids, "<i8").data)
    return digest.hexdigest()


#: The item id of a member slot with no item (an index with headroom), and
#: the padding of requests: it names nothing.
NO_ITEM = -1


def _no_item_run(sorted_ids: np.ndarray) -> tuple[int, int]:
    """`[start, stop)` of the `NO_ITEM` entries of ascending ids."""
    start = int(np.searchsorted(sorted_ids, NO_ITEM, side="left"))
    stop = int(np.searchsorted(sorted_ids, NO_ITEM, side="right"))
    return start, stop


def _repeats_an_item(sorted_ids: np.ndarray) -> bool:
    """Whether ascending ids name an item twice (`NO_ITEM` slots aside: views
    of the runs around them, no copy)."""
    start, stop = _no_item_run(sorted_ids)
    return _any_step(sorted_ids[:start], np.equal) or _any_step(sorted_ids[stop:], np.equal)
