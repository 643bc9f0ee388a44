"""Device kernels of eligibility sets: popcount, rank and range counts in keras.ops.

The device half of `static_keras.index.eligibility.EligibilitySets`: the
same bit words and rank directory (`device_arrays()`, int32), the
same answers as its NumPy `rank`, `contains` and `eligible_in_range`. Every
function is elementwise arithmetic and gathers on static shapes, with no
data-dependent control flow, so it runs unchanged on TensorFlow, JAX and
torch, eagerly, in a TF graph and under XLA.

Everything stays in int32 (JAX disables int64 by default) and no step
relies on signed overflow: shifts right are masked after an arithmetic
shift, and no intermediate exceeds 2**31 - 1.
"""

from __future__ import annotations

from keras import ops

from static_keras.kernels import execution_plan
from static_keras.kernels import gather
from static_keras.kernels import sorted_search

_LOW31 = 0x7FFFFFFF
_INT32_MAX = 0x7FFFFFFF  # the search padding: above every member number


def popcount32(x):
    """int32: the set bits of each 32-bit pattern.

    keras.ops has no popcount: the backend's primitive (`kernels/backends/`):
    one op on TensorFlow and JAX (XLA's popcnt), SWAR steps elsewhere.

    Args:
        x: int32 tensor, any shape (uint32 bits viewed as int32).

    Returns:
        int32 tensor of the same shape, values in `[0, 32]`.
    """
    return execution_plan.current().primitives.popcount32(ops.cast(x, "int32"))


def _flat_index(words, set_ids, positions):
    num_words = words.shape[1]
    set_ids = ops.cast(set_ids, "int32")
    return set_ids * num_words + ops.right_shift(ops.cast(positions, "int32"), 5)


def rank(words, directory, set_ids, positions):
    """int32: eligible members before each position of each set.

    `rank(i) = directory[i >> 6] + popcount(words[w - 1]) (w = i >> 5 odd)
    + popcount(words[w] & low_bits(i & 31))`; the low-bit mask is
    `0x7FFFFFFF >> (31 - b)` (b ones, b in [0, 31]), so no shift ever
    reaches the sign bit.

    Args:
        words: int32 `[S, W]`, `EligibilitySets.device_arrays()["eligibility_words"]`.
        directory: int32 `[S, D]`, `...["eligibility_directory"]`.
        set_ids: int `[...]`, broadcast against `positions` (e.g. `[R, 1]`
            for `[R, B]` positions).
        positions: int `[...]` in `[0, num_members]`.
    """
    positions = ops.cast(positions, "int32")
    set_ids = ops.cast(set_ids, "int32")
    flat = _flat_index(words, set_ids, positions)
    bit = ops.bitwise_and(positions, 31)
    below = ops.right_shift(ops.full_like(bit, _LOW31), 31 - bit)
    flat_words = ops.reshape(words, (-1,))
    word = gather.take(flat_words, flat)
    odd = ops.bitwise_and(ops.right_shift(positions, 5), 1)
    previous = ops.bitwise_and(gather.take(flat_words, flat - odd), -odd)  # 0 unless odd
    at = set_ids * directory.shape[1] + ops.right_shift(positions, 6)
    before = gather.take(ops.reshape(directory, (-1,)), at)
    return before + popcount32(previous) + popcount32(ops.bitwise_and(word, below))


def contains(words, set_ids, members):
    """bool: whether each member is eligible (padding `num_members` is not).

    Args:
        words: int32 `[S, W]`.
        set_ids: int, broadcast against `members`.
        members: int `[...]` in `[0, num_members]`.
    """
    word = gather.take(ops.reshape(words, (-1,)), _flat_index(words, set_ids, members))
    bit = ops.bitwise_and(ops.cast(members, "int32"), 31)
    return ops.equal(ops.bitwise_and(ops.right_shift(word, bit), 1), 1)


#: Most excluded members a row may hold when their number is not static
#: (a served signature): `count_below` then searches `2**12` slots.
MAX_DYNAMIC_EXCLUDED = 2**12 - 1


def count_below(sorted_rows, values):
    """int32 `[R, Q]`: how many entries of each sorted row are `< values[r, q]`
    (`sorted_search.count_below`; rows whose last entry no value exceeds,
    `prepare_counted` appends one). P may be unknown until run time, up to
    `MAX_DYNAMIC_EXCLUDED + 1`."""
    return sorted_search.count_below(sorted_rows, values, MAX_DYNAMIC_EXCLUDED + 1)


def prepare_counted(sorted_members, counted):
    """`(searched, before)` int32 `[R, E + 1]`: a row's sorted members
    `[R, E]` and which of them count (bool `[R, E]`), set out for
    `counted_in_ranges`: the members with a sentinel appended for
    `count_below`, and how many counted ones come before each slot."""
    searched = ops.pad(ops.cast(sorted_members, "int32"), [[0, 0], [0, 1]],
                       constant_values=_INT32_MAX)  # fmt: skip
    counted = ops.pad(ops.cast(counted, "int32"), [[0, 0], [0, 1]])
    return searched, ops.cumsum(counted, axis=1) - counted


def counted_below(searched, before, positions):
    """int32 `[R, Q]`: counted members of each row below each position
    (`prepare_counted`): one search, one read."""
    return gather.take_along_rows(before, count_below(searched, positions))


def counted_in_ranges(searched, before, lo, hi):
    """int32 `[R, B]`: counted members of each row inside each `[lo, hi)`
    (`prepare_counted`): the counted ones below `hi` minus those below `lo`."""
    width = ops.shape(lo)[1]
    below = counted_below(searched, before, ops.concatenate([lo, hi], axis=1))  # one search
    return below[:, width:] - below[:, :width]


def eligible_in_range(words, directory, set_ids, lo, hi, excluded_members=None):
    """int32 `[R, B]`: eligible, non-excluded members in `[lo, hi)`.

    A candidate state is enterable when this is positive:
    `rank(hi) - rank(lo)` minus the row's excluded members that lie in the
    range and are eligible (each excluded member is distinct, and the
    padding `num_members` lies in no range).

    Args:
        words, directory: int32 `[S, W]`, `[S, D]` (see `rank`).
        set_ids: int `[R]`, the set of each row.
        lo, hi: int `[R, B]`, the member ranges of each row's candidates.
        excluded_members: optional int `[R, E]`, sorted distinct member
            numbers per row padded with `num_members`
            (`MemberCatalogue.exclusion_members`).
    """
    rows = ops.expand_dims(ops.cast(set_ids, "int32"), 1)
    lo, hi = ops.cast(lo, "int32"), ops.cast(hi, "int32")
    count = rank(words, directory, rows, hi) - rank(words, directory, rows, lo)
    if excluded_members is None:
        return count
    excluded = ops.cast(excluded_members, "int32")
    counted = contains(words, rows, excluded)  # the padding is never eligible
    searched, before = prepare_counted(excluded, counted)
    return count - counted_in_ranges(searched, before, lo, hi)


def keep_mask(words, directory, request, lo, hi):
    """bool `[R, K]`: whether `[lo, hi)` holds an eligible, non-excluded member.

    Args:
        words, directory: int32 `[S, W]`, `[S, D]` weights.
        request: a `RequestEligibility`.
        lo, hi: int32 `[R, K]` member ranges of each row's candidate states.
    """
    width = ops.shape(lo)[1]
    return _keep(words, directory, request, ops.concatenate([lo, hi], axis=1),
                 lambda x: x[:, width:] - x[:, :width])  # fmt: skip


def keep_mask_between(words, directory, request, bounds):
    """bool `[R, K]`: `keep_mask` for abutting ranges `[bounds[:, k],
    bounds[:, k + 1])`, e.g. a row's candidates when they are consecutive
    states (`member_ranges.tree_member_starts`): K + 1 ranks and searches, not 2 K."""
    return _keep(words, directory, request, bounds, lambda x: x[:, 1:] - x[:, :-1])


def _keep(words, directory, request, positions, span):
    """bool: `span(counts below positions) > 0`, with `span` the ranges'
    difference of the reads at their two ends."""
    count = span(positions)
    if request.set_ids is not None:
        ranks = set_ranks(words, directory, request.set_ids, positions)
        count = set_counts(request.set_ids, span(ranks), count)
    if request.excluded is not None:
        below = counted_below(request.excluded, request.excluded_before, positions)
        count = count - span(below)
    return ops.greater(count, 0)


def set_ranks(words, directory, set_ids, positions):
    """int32 `[R, Q]`: rank of each position in its row's set (set 0 for
    rows without one; `set_counts` drops those)."""
    safe = ops.where(ops.greater_equal(set_ids, 0), set_ids, 0)
    return rank(words, directory, safe[:, None], positions)


def set_counts(set_ids, ranked, count):
    """`ranked` for rows with a set, `count` for rows without, 0 for rows
    with an unknown id."""
    count = ops.where(ops.greater_equal(set_ids, 0)[:, None], ranked, count)
    return ops.where(ops.greater_equal(set_ids, -1)[:, None], count, 0)
