"""Dense-head eligibility on the host: member boundaries of dense codes and
per-set mask rows (NumPy only).

A semantic-ID index's dense head has one state per code of the first
`d` tokens; a dense step asks of each code "is an eligible member below
it?". These builders answer it on the host from the set bits, once per
refresh: `dense_boundary_table` (the first member of every code block),
and `dense_eligibility_masks` (a bit per code, laid out as the index's
`dense_masks`). The device side is `static_keras.constraint.dense_step_eligibility`;
a refresh job builds the masks without Keras or TensorFlow.
"""

from __future__ import annotations

import numpy as np

from static_keras.index import layout as host_layout
from static_keras.index import member_ranges as host_member_ranges


def dense_boundary_offsets(layout) -> list[int]:
    """First entry of each dense depth t in `[0, d]` in `dense_boundary_table`.

    Depth t has `V**t + 1` entries, so the offset is `sum_{u<t} (V**u + 1)`,
    which is the first state of depth t plus t: a dense-head state s of depth
    t reads its `lo` at `s + t` and its `hi` at `s + t + 1`.
    """
    starts = list(layout.dense_mask_offsets) + [layout.dense_head_states]
    return [start + t for t, start in enumerate(starts)]


def dense_boundary_table(layout, arrays) -> np.ndarray:
    """int32 `[sum_{t<=d} (V**t + 1)]` (at least 1): the first member of each
    code block of each dense depth t in `[0, d]`, then `num_members`.

    Depths `t < d` are `member_ranges.dense_first_members`; depth d (the codes
    a last dense step leads to, one per tail state of depth d) is what makes
    the candidate ranges of every dense step a slice of one table.
    """
    d, vocab = layout.dense_levels, layout.vocab_size
    if d == 0:
        return np.zeros(1, np.int32)
    tables = host_member_ranges.dense_first_members(layout, arrays)
    valid = arrays["dense_states"] >= 0
    first_state = np.zeros(vocab**d + 1, np.int64)
    np.cumsum(valid, out=first_state[1:])
    # Depth d is the first member below the first tail state at or after
    # each code: a non-decreasing count of valid codes, so it takes at most
    # `level_sizes[d] + 1` values. Walk those, then gather: far fewer
    # steps than walking all V**d + 1 entries.
    states = np.arange(first_state[-1] + 1, dtype=np.int64)
    depth = np.full(states.size, d, np.int64)
    first_members = host_member_ranges.first_tail_members(layout, arrays, states, depth)
    tables.append(first_members[first_state])
    return np.concatenate(tables).astype(np.int32)


def dense_eligibility_masks(
    vocab_size: int, dense_levels: int, boundaries, sets, previous=None, stored_levels=None
) -> np.ndarray:
    """int32 `[S, H, mask_words]`: per set, a mask row for each of the H
    dense-head states of the stored depths, laid out as the index's
    `dense_masks`: bit j of the row of state s is set when code j below s
    has an eligible member.

    A dense step ANDs the row into the index's own before unpacking, so a
    set costs it one `[R, mask_words]` gather, not a rank per code. The
    masks are `sum_{t<stored_levels} V**t` rows of V bits per set (about
    `V**stored_levels` bits), computed from the set bits with one rank per
    code boundary; a layer stores them only where that is cheap and
    derives the deeper rows at decode time (`derived_dense_masks`).

    Args:
        vocab_size, dense_levels: V and d of the index.
        boundaries: the host `dense_boundary_table` (NumPy).
        sets: an `EligibilitySets` over the index's members.
        previous: optional `(words, masks)` the device holds now (int32
            `[S, W]` and this function's output for them): sets whose bits
            did not change keep their masks (a refresh of one set computes
            one set's masks).
        stored_levels: the depths `[0, stored_levels)` whose rows are
            stored (default: all d); deeper ones are derived at decode time
            (`derived_dense_masks`), so H is `sum_{t<stored_levels} V**t`.
    """
    vocab, d = vocab_size, dense_levels
    levels = d if stored_levels is None else stored_levels
    mask_words = host_layout.dense_mask_words(vocab)
    offsets = [sum(vocab**u + 1 for u in range(t)) for t in range(d + 1)]
    boundaries = np.asarray(boundaries, np.int64)
    words = sets.device_arrays()["eligibility_words"]
    masks = np.zeros((sets.num_sets, sum(vocab**t for t in range(levels)), mask_words), np.int32)
    for s in range(sets.num_sets):
        if previous is not None and np.array_equal(previous[0][s], words[s]):
            masks[s] = previous[1][s]
            continue
        row = 0
        for t in range(levels):
            table = boundaries[offsets[t + 1] : offsets[t + 1] + vocab ** (t + 1) + 1]
            ranks = sets.rank(s, table)
            has = (ranks[1:] > ranks[:-1]).reshape(vocab**t, vocab)
            has = np.pad(has, [(0, 0), (0, mask_words * 32 - vocab)])
            packed = np.packbits(has, axis=1, bitorder="little").view("<u4").view(np.int32)
            masks[s, row : row + vocab**t] = packed
            row += vocab**t
    return masks


def dense_member_codes(layout, boundaries) -> np.ndarray:
    """int32 `[max(num_members, 1)]`: each member's code of depth d (its
    first d tokens as a base-V number), from the host `dense_boundary_table`.

    Members are in code order, so depth d's block of the table is where
    each code's members start: a repeat, no search. A request's exclusions
    read their codes here with one gather (`dense_codes`) instead of a
    binary search per dense depth (dependent cache misses per member, the
    largest eligibility cost with cold caches).
    """
    d, vocab = layout.dense_levels, layout.vocab_size
    start = dense_boundary_offsets(layout)[d]
    first = np.asarray(boundaries[start : start + vocab**d + 1], np.int64)
    codes = np.repeat(np.arange(vocab**d, dtype=np.int32), np.diff(first))
    if codes.size != layout.num_sequences:
        raise ValueError(
            f"The dense boundary table covers {codes.size} members, the index has "
            f"{layout.num_sequences}"
        )
    # Member slots of a layout with headroom hold no item: no request
    # excludes them (ids < 0 name nothing), so their code is never read.
    codes = np.pad(codes, (0, layout.num_members - codes.size))
    return codes if codes.size else np.zeros(1, np.int32)
