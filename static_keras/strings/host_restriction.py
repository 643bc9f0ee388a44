"""A request's restriction of a `StringLogitsProcessor`, on the host.

Per row: an eligibility set (`set_ids`, -1 none) and excluded members
(given as item ids or member numbers). `restriction` checks them (one clear
error per mistake) and sets them out once per call: the excluded members
that count (distinct, eligible in the row's set) as sorted keys
`row * (M + 1) + member`; `enterable` then tells whether a state still has
an eligible, non-excluded member below it: a rank difference over the
set's bits minus two searches in the keys.
"""

from __future__ import annotations

import numpy as np

from static_keras.index.eligibility import EligibilitySets


def restriction(index, eligibility, catalogue, rows: int, set_ids, excluded_item_ids,
                excluded_members):  # fmt: skip
    """A request's restriction, checked (`catalogue`: a function that gives the
    index's `MemberCatalogue`, built only for item ids): `(set of each row
    int64 [R], -1: none; sorted keys row * (M + 1) +
    member of the excluded members that count: distinct, eligible in
    the row's set)`."""
    sets = _set_ids(eligibility, set_ids, rows)
    num_members = index.num_members
    keys = []
    if excluded_item_ids is not None:
        raw = _excluded(excluded_item_ids, rows, "excluded_item_ids")
        if raw.size:
            query, member = catalogue().lookup(raw)
            keys.append((query // raw.shape[1]) * (num_members + 1) + member)
    if excluded_members is not None:
        raw = _excluded(excluded_members, rows, "excluded_members")
        if raw.size and (raw.min() < -1 or raw.max() >= num_members):
            raise ValueError(
                f"`excluded_members` must lie in [0, {num_members}) (member numbers), "
                f"padded with -1. Received values in [{raw.min()}, {raw.max()}]"
            )
        flat = raw.reshape(-1)
        where = np.flatnonzero(flat >= 0)
        if where.size:
            keys.append((where // raw.shape[1]) * (num_members + 1) + flat[where])
    keys = np.unique(np.concatenate(keys)) if keys else np.zeros(0, np.int64)
    if keys.size and eligibility is not None:
        row, member = np.divmod(keys, num_members + 1)
        counted = np.ones(keys.size, bool)
        restricted = np.flatnonzero(sets[row] >= 0)
        counted[restricted] = eligibility.contains(sets[row[restricted]], member[restricted])
        keys = keys[counted]
    return sets, keys


def _set_ids(eligibility, set_ids, rows: int) -> np.ndarray:
    if set_ids is None:
        return np.full(rows, -1, np.int64)
    array = np.asarray(set_ids)
    if array.dtype == object:
        array = np.array([-1 if v is None else v for v in array.reshape(-1)])
        array = array.reshape(np.shape(set_ids))
    if array.size and (array.dtype == bool or not np.issubdtype(array.dtype, np.integer)):
        raise ValueError(
            f"`set_ids` must hold integers (-1: no restriction). Received dtype {array.dtype}"
        )
    if array.ndim == 0:
        array = np.full(rows, int(array), np.int64)
    elif array.shape != (rows,):
        raise ValueError(
            f"`set_ids` must have shape ({rows},), one per row of `states`. "
            f"Received shape {array.shape}"
        )
    array = array.astype(np.int64, copy=False)
    names = () if eligibility is None else eligibility.names
    bad = (array < -1) | (array >= len(names))
    if bad.any():
        value = int(array[np.flatnonzero(bad)[0]])
        if not names:
            raise ValueError(
                "`set_ids` needs eligibility sets: this processor has none (only -1 is "
                "valid). Make it with StringLogitsProcessor(index, eligibility="
                f"EligibilitySets.build(index, {{name: item_ids}})). Received: {value}"
            )
        raise ValueError(
            f"`set_ids` must lie in [-1, {len(names)}) (-1: no restriction; sets "
            f"{list(names)}). Received: {value}"
        )
    return array


def enterable(index, eligibility, restriction, rows, states) -> np.ndarray:
    """bool: whether `states[i]` (reached by row `rows[i]`) has an eligible,
    non-excluded member in its member range."""
    sets, keys = restriction
    lo, hi = index.member_ranges(states)
    row_sets = sets[rows]
    total = hi - lo
    restricted = np.flatnonzero(row_sets >= 0)
    if restricted.size:
        total[restricted] = eligibility.count(row_sets[restricted], lo[restricted], hi[restricted])
    if keys.size:
        base = rows.astype(np.int64) * (index.num_members + 1)
        total -= np.searchsorted(keys, base + hi) - np.searchsorted(keys, base + lo)
    return total > 0


def _excluded(values, rows: int, name: str) -> np.ndarray:
    array = np.asarray(values)
    if array.size and (array.dtype == bool or not np.issubdtype(array.dtype, np.integer)):
        raise ValueError(f"`{name}` must hold integers (-1: padding). Received dtype {array.dtype}")
    if array.ndim != 2 or array.shape[0] != rows:
        raise ValueError(
            f"`{name}` must have shape ({rows}, E): one padded row per row of `states`. "
            f"Received shape {array.shape}"
        )
    return array.astype(np.int64, copy=False)


def checked_eligibility(index, eligibility) -> EligibilitySets | None:
    """`eligibility` (or None) after checking it is over `index`'s members."""
    if eligibility is None:
        return None
    if not isinstance(eligibility, EligibilitySets):
        raise ValueError(
            "`eligibility` must be EligibilitySets (EligibilitySets.build(index, {name: "
            f"item_ids}})) or None. Received: {type(eligibility).__name__}"
        )
    ids = index.archive_arrays()[index.layout.member_ids_array] if index.has_item_ids else None
    same = eligibility.num_members == index.num_members and (
        np.array_equal(eligibility.catalogue.item_ids, np.arange(index.num_members))
        if ids is None
        else np.array_equal(eligibility.catalogue.item_ids, ids)
    )
    if not same:
        raise ValueError(
            f"`eligibility` was built over another index ({eligibility.num_members} members, "
            f"this one has {index.num_members}, or its member -> item id map differs): "
            "build it with EligibilitySets.build(index, sets)"
        )
    return eligibility
