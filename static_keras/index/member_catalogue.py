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

#: Direct (table) lookups of item ids while the largest id is at most this
#: many times the number of members (plus a constant): 4 bytes per slot.
_DIRECT_TABLE_SLACK = 4


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
    (the usual catalogue: 4 bytes per id), otherwise a binary search over the
    sorted ids (an id may then name several members). Ids outside the
    catalogue match nothing.

    Args:
        member_item_ids: int `[num_members]` or None (identity).
        num_members: int.
    """

    def __init__(self, member_item_ids, num_members: int):
        self.num_members = int(num_members)
        self._identity = member_item_ids is None
        self._table = self._sorted_ids = self._sorted_members = None
        self._fingerprint = None
        self._ids = None
        if self._identity:
            return
        ids = _item_id_array(member_item_ids, "member_item_ids")
        if ids.shape != (self.num_members,):
            raise ValueError(
                f"`member_item_ids` must have shape ({self.num_members},). Received {ids.shape}"
            )
        self._ids = ids
        largest = int(ids.max()) if ids.size else -1
        if ids.size and ids.min() >= 0 and largest < _DIRECT_TABLE_SLACK * ids.size + 2**16:
            table = np.full(largest + 1, -1, np.int32 if ids.size < 2**31 else np.int64)
            table[ids] = np.arange(ids.size, dtype=table.dtype)
            if np.count_nonzero(table >= 0) == ids.size:  # distinct ids
                self._table = table
                return
        order = np.argsort(ids, kind="stable")
        self._sorted_ids = ids[order]
        self._sorted_members = order

    @classmethod
    def from_index(cls, index) -> "MemberCatalogue":
        """The catalogue of a `TokenAutomaton` (`StaticIndex`, `StringIndex`)."""
        layout = index.layout
        ids = None
        if index.has_item_ids:
            ids = index.archive_arrays()[layout.member_ids_array]
        return cls(ids, index.num_members)

    @property
    def item_ids(self) -> np.ndarray:
        """int64 `[num_members]`: the item id of each member."""
        return np.arange(self.num_members) if self._identity else self._ids

    @property
    def nbytes(self) -> int:
        """Host bytes of the lookup structure (not sent to the device)."""
        parts = (self._table, self._sorted_ids, self._sorted_members)
        return sum(part.nbytes for part in parts if part is not None)

    @property
    def fingerprint(self) -> str:
        """SHA-256 of the member -> item id map: eligibility files bind to it."""
        if self._fingerprint is None:
            digest = hashlib.sha256(f"members:{self.num_members};".encode())
            if self._identity:
                digest.update(b"identity")
            else:
                digest.update(np.ascontiguousarray(self._ids, "<i8").tobytes())
            self._fingerprint = digest.hexdigest()
        return self._fingerprint

    def lookup(self, item_ids) -> tuple[np.ndarray, np.ndarray]:
        """`(query, member)` int64: every member of every id (query = position
        in the flattened `item_ids`); ids outside the catalogue give nothing."""
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
        left = np.searchsorted(self._sorted_ids, ids, side="left")
        right = np.searchsorted(self._sorted_ids, ids, side="right")
        counts = right - left
        query = np.repeat(np.arange(ids.size, dtype=np.int64), counts)
        first = np.cumsum(counts) - counts
        position = np.arange(query.size, dtype=np.int64) - np.repeat(first - left, counts)
        return query, self._sorted_members[position]

    def members(self, item_ids) -> np.ndarray:
        """int: the members of `item_ids` (unsorted, may repeat)."""
        members = self._members_or_absent(item_ids)
        return members[members >= 0]

    def _members_or_absent(self, item_ids) -> np.ndarray:
        """Members of `item_ids`, with -1 for ids outside the catalogue where
        that saves a pass (the refresh path: one gather when every id is
        inside the table)."""
        if self._table is not None:
            ids = _item_id_array(item_ids, "item_ids").reshape(-1)
            if ids.size and ids.min() >= 0 and ids.max() < self._table.size:
                return np.take(self._table, ids)
        return self.lookup(item_ids)[1]

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
