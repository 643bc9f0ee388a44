"""`apply_delta` against `StaticIndex.build` of the new catalogue (the oracle).

Random deltas over random catalogues at every dense depth, with and without
headroom: adds, removes, re-adds, a removed item's semantic ID reused,
emptied subtrees, a new top-level code; the result holds the same language
and item ids as the full build, and the same arrays where the layouts
coincide. Then the bad inputs, each a ValueError naming the argument.
"""

from __future__ import annotations

import numpy as np
import pytest

from static_keras import StaticIndex
from static_keras.index import catalogue_delta
from static_keras.index.catalogue_delta import apply_delta
from static_keras.index.catalogue_delta import apply_delta_with_member_map
from static_keras.index.catalogue_delta import catalogue_after_delta
from static_keras.index.eligibility import MemberCatalogue
from static_keras.index.headroom import CapacityError

VOCAB, LENGTH = 6, 4


def catalogue(rng, n):
    rows = np.unique(rng.integers(0, VOCAB, (n, LENGTH)), axis=0)
    rows = rows[rng.permutation(len(rows))]
    ids = 10 + 7 * rng.permutation(3 * len(rows))[: len(rows)]
    return rows, ids


def same_catalogue(got: StaticIndex, rows, ids, dense_levels):
    want = StaticIndex.build(rows, VOCAB, item_ids=ids, dense_levels=dense_levels)
    assert got.num_sequences == want.num_sequences
    np.testing.assert_array_equal(got.sequences(), want.sequences())
    np.testing.assert_array_equal(got.lookup_item_ids(rows), ids)
    if not got.layout.has_headroom:
        assert got.layout == want.layout
        for name, array in want.arrays.items():
            np.testing.assert_array_equal(got.arrays[name], array, err_msg=name)
    return want


@pytest.mark.parametrize("dense_levels", range(LENGTH + 1))
@pytest.mark.parametrize("room", [0.0, 0.5])
@pytest.mark.parametrize("slices", ["one", "many"])
def test_random_deltas_equal_the_full_build(dense_levels, room, slices, monkeypatch):
    if slices == "many":  # the slice-at-a-time passes, over several slices
        monkeypatch.setattr(catalogue_delta, "_SLICE", 3)
    rng = np.random.default_rng([dense_levels, int(room * 10)])
    for trial in range(30):
        rows, ids = catalogue(rng, int(rng.integers(5, 120)))
        served = StaticIndex.build(rows, VOCAB, item_ids=ids, dense_levels=dense_levels,
                                   headroom=room)  # fmt: skip
        n = len(rows)
        remove = rng.choice(n, int(rng.integers(0, n // 2 + 1)), replace=False)
        if trial % 4 == 0:  # empty a subtree: every item under the first code
            remove = np.union1d(remove, np.flatnonzero(rows[:, 0] == rows[0, 0]))
        keep = np.setdiff1d(np.arange(n), remove)
        if keep.size == 0:
            keep, remove = remove[:1], remove[1:]
        taken = {tuple(r) for r in rows[keep]}
        fresh = [r for r in map(tuple, rng.integers(0, VOCAB, (40, LENGTH))) if r not in taken]
        fresh = list(dict.fromkeys(fresh))[: int(rng.integers(0, 20))]
        if trial % 3 == 1 and remove.size:  # a removed item's semantic ID reused
            fresh.append(tuple(rows[remove[0]]))
        if trial % 5 == 2:  # a top-level code nobody had (when one is free)
            free = np.setdiff1d(np.arange(VOCAB), rows[keep, 0])
            if free.size:
                fresh.append((int(free[0]),) + (0,) * (LENGTH - 1))
        fresh = list(dict.fromkeys(fresh))
        added = np.array(fresh, np.int64).reshape(-1, LENGTH)
        new_ids = 5 + 7 * (3 * n + np.arange(len(added)))
        if trial % 3 == 2 and remove.size and len(added):  # a removed item re-added
            new_ids[0] = ids[remove[0]]
        try:
            got, old_members, new_members = apply_delta_with_member_map(
                served, add_sequences=added, add_item_ids=new_ids, remove_item_ids=ids[remove]
            )
        except CapacityError:
            assert room > 0
            continue
        same_catalogue(got, np.concatenate([rows[keep], added]),
                       np.concatenate([ids[keep], new_ids]), dense_levels)  # fmt: skip
        if room:
            assert got.layout.graph_shape() == served.layout.graph_shape()
        # The member map: each kept served member and where it went.
        leaf = "leaf_item_ids"
        np.testing.assert_array_equal(got.arrays[leaf][new_members],
                                      served.arrays[leaf][old_members])  # fmt: skip
        assert old_members.size == keep.size
        # The new exclusion table by a merge equals the one sorted afresh.
        table = MemberCatalogue.from_index(served).exclusion_table()
        ids = got.archive_arrays()[got.layout.member_ids_array]
        merged = catalogue_after_delta(table, old_members, new_members, ids)
        want = MemberCatalogue.from_index(got)
        for got_part, want_part in zip(merged.exclusion_table(), want.exclusion_table()):
            np.testing.assert_array_equal(got_part, want_part)
        assert merged.fingerprint == want.fingerprint


def test_duplicate_semantic_ids_follow_the_build_policy():
    rows = np.array([[0, 1, 2, 3], [1, 1, 1, 1], [2, 2, 2, 2]])
    served = StaticIndex.build(rows, VOCAB, item_ids=[10, 11, 12], dense_levels=1)
    added = np.array([[1, 1, 1, 1], [5, 5, 5, 5], [5, 5, 5, 5]])
    with pytest.raises(ValueError, match=r"`add_sequences` repeats the semantic ID.*item 11"):
        apply_delta(served, add_sequences=added[:2], add_item_ids=[20, 21])
    with pytest.raises(ValueError, match="Two different item ids share one semantic ID"):
        apply_delta(served, add_sequences=added[1:], add_item_ids=[21, 22])
    first = apply_delta(served, add_sequences=added, add_item_ids=[20, 21, 22],
                        on_duplicate_item="first")  # fmt: skip
    assert first.lookup_item_ids(added).tolist() == [11, 21, 21]
    last = apply_delta(served, add_sequences=added, add_item_ids=[20, 21, 22],
                       on_duplicate_item="last")  # fmt: skip
    assert last.lookup_item_ids(added).tolist() == [20, 22, 22]
    assert last.num_sequences == 4


@pytest.mark.parametrize(
    "arguments, message",
    [
        (dict(remove_item_ids=[10, 99, 98]), r"`remove_item_ids` names 2 item id\(s\) not in "
                                             r"the catalogue: \[98, 99\]"),
        (dict(add_sequences=[[0, 0, 0, 0]], add_item_ids=[11]), r"`add_item_ids` holds 1 item "
                                                                r"id\(s\) already in.*\[11\]"),
        (dict(add_sequences=[[0, 0, 0, 0], [0, 0, 0, 1]], add_item_ids=[30, 30]),
         r"`add_item_ids` repeats item id\(s\) \[30\]"),
        (dict(add_sequences=[[0, 0, 0]], add_item_ids=[30]), "`add_sequences` must have 4 tokens"),
        (dict(add_sequences=[[0, 0, 0, 6]], add_item_ids=[30]), "`add_sequences`.*range"),
        (dict(add_sequences=[[0, 0, 0, 1]]), "`add_sequences` and `add_item_ids` go together"),
        (dict(add_sequences=[[0, 0, 0, 1]], add_item_ids=[-3]), "`add_item_ids` must be non-neg"),
        (dict(remove_item_ids=[10, 11, 12]), "removes every item"),
        (dict(add_sequences=[[0, 0, 0, 1]], add_item_ids=[30, 31]),
         r"`add_item_ids` must be a vector with one id per sequence"),
        (dict(add_sequences=[[0, 0, 0, 1]], add_item_ids=[30.5]), "`add_item_ids` must hold int"),
        (dict(add_sequences=[[0.5, 0, 0, 1]], add_item_ids=[30]), "`add_sequences`"),
        (dict(add_sequences=[0, 0, 0, 1], add_item_ids=[30]), "`add_sequences`.*rank 2"),
        (dict(remove_item_ids=[[10]]), "`remove_item_ids` must be a vector"),
        (dict(remove_item_ids=[10.0]), "`remove_item_ids` must be a vector of integer"),
        (dict(remove_item_ids=[-4]), "`remove_item_ids` must be non-negative"),
        (dict(on_duplicate_item="newest"), "on_duplicate_item"),
    ],
)  # fmt: skip
def test_bad_deltas_are_refused_naming_the_argument(arguments, message):
    rows = np.array([[0, 1, 2, 3], [1, 1, 1, 1], [2, 2, 2, 2]])
    served = StaticIndex.build(rows, VOCAB, item_ids=[10, 11, 12])
    with pytest.raises(ValueError, match=message):
        apply_delta(served, **arguments)


def test_an_index_without_item_ids_has_no_delta():
    served = StaticIndex.build([[0, 1, 2, 3]], VOCAB)
    with pytest.raises(ValueError, match="built with `item_ids`"):
        apply_delta(served, remove_item_ids=[0])


def test_a_delta_beyond_the_headroom_names_the_capacity():
    rows = np.array([[0, 1, 2, 3], [1, 1, 1, 1]])
    served = StaticIndex.build(rows, VOCAB, item_ids=[10, 11], headroom=0.5, dense_levels=1)
    added = np.array([[3, 0, 0, 0], [3, 0, 0, 1], [3, 0, 0, 2]])
    with pytest.raises(CapacityError, match=r"members \(capacity 3\).*more headroom"):
        apply_delta(served, add_sequences=added, add_item_ids=[20, 21, 22])
    # A fan-out above its step's cap (every served state has one child).
    rows = np.array([[a, b, 1, 0] for a in range(2) for b in range(5)])
    served = StaticIndex.build(rows, VOCAB, item_ids=np.arange(10), headroom=0.5, dense_levels=1)
    added = np.array([[0, 0, 1, 1], [0, 0, 1, 2], [0, 0, 1, 3]])
    with pytest.raises(CapacityError, match=r"fan-out of 4 at step 3 \(cap B_3 = 2\)"):
        apply_delta(served, add_sequences=added, add_item_ids=[20, 21, 22])


def test_a_catalogue_of_another_index_is_refused():
    from static_keras.index.eligibility import MemberCatalogue

    served = StaticIndex.build([[0, 1, 2, 3], [1, 1, 1, 1]], VOCAB, item_ids=[10, 11])
    other = StaticIndex.build([[0, 1, 2, 3]], VOCAB, item_ids=[10])
    with pytest.raises(ValueError, match="`catalogue` is not the catalogue of `index`"):
        apply_delta(served, remove_item_ids=[10], catalogue=MemberCatalogue.from_index(other))
