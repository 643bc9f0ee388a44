"""Eligibility on the device: member ranges of states and the enterable test.

A decoding step that honours a request's eligibility set and exclusions keeps
a candidate only if its next state has an eligible, non-excluded member below
it (`static_keras.index.eligibility`). The members below a state are one range
`[lo, hi)`; this module computes those ranges in keras.ops for both automaton
kinds and turns them into a keep mask, with fixed-width, branch-free gathers:

- semantic IDs: a tail state descends by first children to its first leaf
  (an `indptr` gather at branching levels, nothing at single-child levels),
  and `hi(s) = lo(s + 1)`; a dense-head state reads a small table of the first
  member of each code block (`dense_boundary_table`);
- string sets: per-state `lo`/`hi` arrays (`StringIndex.member_ranges`).

A request is set out once per decode (`prepare`): its excluded members
sorted and deduplicated, with a running count of those that count, so the
excluded members inside a candidate's range are two searches in the row
(`sorted_search.count_below`: TF's kernel where TF runs op by op, a hand
binary search under XLA), never an `[R, K, E]` compare. A dense step reads
no ranks: each set carries a mask row per dense-head state
(`dense_eligibility_masks`, built on the host, or derived at decode time
where storing costs more than half a bit per member: `derived_dense_masks`),
ANDed into the index's row,
and the codes a request's exclusions empty (`dense_codes`,
`blocked_dense_codes`, found once per decode) are cleared from it
(`blocked_words`; `grouped_blocked_words` for a beam search's beams).

Everything stays in int32 (JAX disables int64 by default).
"""

from __future__ import annotations

from typing import NamedTuple

import keras
import numpy as np
from keras import ops

from static_keras.index.dense_eligibility import dense_boundary_offsets
from static_keras.layers import eligibility_kernels
from static_keras.layers import gather

#: The value of each bit of a 32-bit word, as int32 (bit 31 is the sign).
_BIT_VALUES = (np.uint32(1) << np.arange(32, dtype=np.uint32)).view(np.int32)

# Host tables ------------------------------------------------------------------


# Member ranges on the device --------------------------------------------------


def tree_member_ranges(layout, indptr, dense_table, states, depth: int | None = None):
    """`(lo, hi)` int32, shape of `states`: the members below semantic-ID states.

    Args:
        layout: the index's `IndexLayout`.
        indptr: the index's `indptr` weight.
        dense_table: the `dense_boundary_table` weight.
        states: int `[...]` decoding states.
        depth: Python int, the depth of every valid state (states not of that
            depth get `(0, 0)`); None: each state's depth is read from it.
    """
    states = ops.cast(states, "int32")
    d = layout.dense_levels
    if depth is not None:
        start = layout.depth_starts[depth]
        size = layout.vocab_size**depth if depth < d else layout.level_sizes[depth]
        valid = ops.logical_and(ops.greater_equal(states, start), ops.less(states, start + size))
        local = ops.where(valid, states - start, 0)
        if depth < d:
            at = dense_boundary_offsets(layout)[depth] + local
            lo, hi = gather.take(dense_table, at), gather.take(dense_table, at + 1)
        else:
            lo, hi = ops.unstack(_descend(layout, indptr, ops.stack([local, local + 1]), depth))
        return ops.where(valid, lo, 0), ops.where(valid, hi, 0)
    valid = ops.logical_and(ops.greater_equal(states, 0), ops.less(states, layout.state_space))
    safe = ops.where(valid, states, 0)
    row_depth = ops.zeros_like(safe)
    for start in layout.depth_starts[1:]:
        row_depth = row_depth + ops.cast(ops.greater_equal(safe, start), "int32")
    starts = ops.convert_to_tensor(list(layout.depth_starts), "int32")
    local = safe - gather.take(starts, row_depth)
    lo, hi = ops.unstack(_descend(layout, indptr, ops.stack([local, local + 1]), row_depth))
    if d:
        head = ops.less(safe, layout.dense_head_states)
        at = ops.where(head, safe + row_depth, 0)  # flat entry: state + depth
        lo = ops.where(head, gather.take(dense_table, at), lo)
        hi = ops.where(head, gather.take(dense_table, at + 1), hi)
    return ops.where(valid, lo, 0), ops.where(valid, hi, 0)


def tree_member_starts(layout, indptr, states, depth: int):
    """int32, shape of `states`: the first member below tail states of one
    `depth` (`>= dense_levels`), each in `[depth_starts[depth],
    depth_starts[depth] + level_sizes[depth]]`: one past the depth's last
    state gives `num_members`. Consecutive states' starts bound abutting
    ranges (`hi(s) = lo(s + 1)`), so K candidates need K + 1 of them."""
    local = ops.cast(states, "int32") - layout.depth_starts[depth]
    return _descend(layout, indptr, local, depth)


def _descend(layout, indptr, position, depth):
    """Follows first children from tail-local positions of `depth` (an int,
    or an int32 tensor of per-row depths, broadcast against `position`)
    down to member numbers.

    Position `level_sizes[u]` (one past a level's end) descends to one past
    the next level's end, so `hi = lo(s + 1)` needs no special case. All
    positions go down together: one gather per branching level.
    """
    last = indptr.shape[0] - 1
    first = depth if isinstance(depth, int) else layout.dense_levels
    for u in range(first, layout.length):
        if u not in layout.indptr_offsets:  # one child each: same position below
            continue
        at = layout.indptr_offsets[u] + position
        if not isinstance(depth, int):
            at = ops.clip(at, 0, last)
        child = ops.cast(gather.take(indptr, at), "int32") - layout.edge_offsets[u]
        if not isinstance(depth, int):
            child = ops.where(ops.less_equal(depth, u), child, position)
        position = child
    return position


def string_member_ranges(member_lo, member_hi, states):
    """`(lo, hi)` int32: per-state range weights of a string set, `(0, 0)`
    outside `[0, num_states)`."""
    states = ops.cast(states, "int32")
    valid = ops.logical_and(ops.greater_equal(states, 0), ops.less(states, member_lo.shape[0]))
    safe = ops.where(valid, states, 0)
    lo = ops.cast(gather.take(member_lo, safe), "int32")
    hi = ops.cast(gather.take(member_hi, safe), "int32")
    return ops.where(valid, lo, 0), ops.where(valid, hi, 0)


# Requests ---------------------------------------------------------------------


class RequestEligibility(NamedTuple):
    """A request's eligibility per row, checked and set out once per decode
    (`prepare`), so a step only reads it.

    Fields (int32 tensors, or None for no such restriction):
        set_ids: `[R]`, each row's set; -1 no set; -2 an id out of range
            (the row keeps nothing).
        excluded: `[R, E + 1]` the row's excluded members, sorted, and a
            sentinel for `count_below`.
        excluded_before: `[R, E + 1]`, the excluded members the eligible counts
            include (real ones; eligible ones where the row has a set)
            before each slot, so a range's share is two reads.
        dense_excluded: kind-specific, read at dense steps (semantic IDs:
            int32 `[R, d, E + 1]`, `blocked_dense_codes`).
        entered: Python bool: every state passed with this was entered under
            it (a beam search), so a step whose states each have one child
            need not filter (that child has the same members).
        group: Python int: `dense_excluded` has a row per `group` rows (a
            batch row's beams, `repeat_rows`), whose states at a dense step
            are distinct (distinct prefixes of one length).
    """

    set_ids: object = None
    excluded: object = None
    excluded_before: object = None
    dense_excluded: object = None
    entered: bool = False
    group: int = 1


def check_eligibility(eligibility, num_sets: int, rows=None):
    """`(set_ids int32 [R] or None, excluded int32 [R, E] or None)`, checked.

    Set ids must lie in `[-1, num_sets)` (-1: no set restriction); both must
    hold integers (a float id would be truncated to another set, a float
    member to another item: TypeError) and have one row per row (`rows`, an
    int, when it is known: ValueError). Concrete values (eager) are checked
    here; symbolic ones (a TF graph, `jax.jit`) cannot be, and an
    out-of-range id there keeps nothing (its row gets no candidates).
    """
    if not isinstance(eligibility, (tuple, list)) or len(eligibility) != 2:
        raise ValueError(
            "`eligibility` must be a pair (set_ids [R], excluded [R, E]); either may be None"
        )
    set_ids, excluded = eligibility
    if set_ids is not None:
        if num_sets == 0:
            raise ValueError(
                "This layer holds no eligibility sets: build it with `eligibility=` "
                "(an EligibilitySets) or `eligibility_sets=S`, or pass set_ids=None"
            )
        set_ids = _integers(set_ids, "set_ids", "set ids, -1: no set")
        if len(ops.shape(set_ids)) != 1:
            raise ValueError(f"`set_ids` must be int [R]. Received shape {ops.shape(set_ids)}")
        check_rows("set_ids", ops.shape(set_ids), rows)
        values = _concrete(set_ids)
        if values is not None and values.size and (values.min() < -1 or values.max() >= num_sets):
            raise ValueError(
                f"`set_ids` must lie in [-1, {num_sets}) (-1: no set). "
                f"Received values in [{values.min()}, {values.max()}]"
            )
    if excluded is not None:
        excluded = _integers(excluded, "excluded", "member numbers, `exclusion_members`")
        if len(ops.shape(excluded)) != 2:
            raise ValueError(
                f"`excluded` must be int [R, E] member numbers (`exclusion_members`). "
                f"Received shape {ops.shape(excluded)}"
            )
        check_rows("excluded", ops.shape(excluded), rows)
    return set_ids, excluded


def check_rows(name: str, shape, rows) -> None:
    """ValueError unless `shape[0]` is `rows` (where both are known ints)."""
    known = isinstance(rows, (int, np.integer)) and isinstance(shape[0], (int, np.integer))
    if known and int(shape[0]) != int(rows):
        raise ValueError(
            f"`{name}` must have one row per batch row: expected {int(rows)} rows. "
            f"Received shape {tuple(shape)}"
        )


def _integers(x, name: str, what: str):
    """`x` as int32, after a TypeError unless it holds integers."""
    dtype = getattr(x, "dtype", None)
    if dtype is None:  # a list or a scalar: NumPy decides what it holds
        x = np.asarray(x)
        dtype = x.dtype
    if isinstance(dtype, np.dtype) and dtype.kind in "USO":
        dtype = "string"
    try:
        dtype = keras.backend.standardize_dtype(dtype)
    except ValueError:
        dtype = str(dtype)
    if not (dtype.startswith("int") or dtype.startswith("uint")):
        raise TypeError(f"`{name}` must hold integers ({what}). Received dtype {dtype}")
    return ops.cast(x, "int32")


def _concrete(x):
    try:
        return np.asarray(ops.convert_to_numpy(x))
    except Exception:  # symbolic: a graph tensor or a tracer
        return None


def prepare(
    words, num_members: int, eligibility, num_sets: int, dense_exclusions=None, rows=None
) -> RequestEligibility:
    """A `RequestEligibility` from `(set_ids [R], excluded [R, E])` (checked
    by `check_eligibility`; a `RequestEligibility` is returned as is).
    `dense_exclusions`: None, or the kind's function of `(set_ids, excluded,
    excluded_before)` giving `dense_excluded`. `rows`: the rows the request
    must have, where known.

    Excluded entries may come in any order, repeat, or be padding (any value
    outside `[0, num_members)`): they are sorted, and each member counts once.
    """
    if isinstance(eligibility, RequestEligibility):
        return eligibility
    set_ids, excluded = check_eligibility(eligibility, num_sets, rows)
    if set_ids is not None:
        known = ops.logical_and(ops.greater_equal(set_ids, -1), ops.less(set_ids, num_sets))
        set_ids = ops.where(known, set_ids, -2)
    if excluded is None or excluded.shape[1] == 0:
        return RequestEligibility(set_ids)

    real = ops.logical_and(ops.greater_equal(excluded, 0), ops.less(excluded, num_members))
    members = ops.sort(ops.where(real, excluded, num_members), axis=1)
    distinct = ops.not_equal(members[:, 1:], members[:, :-1])
    first = ops.concatenate([ops.ones_like(members[:, :1], "bool"), distinct], axis=1)
    counted = ops.logical_and(ops.less(members, num_members), first)
    if set_ids is not None:
        restricted = ops.greater_equal(set_ids, 0)
        safe = ops.where(restricted, set_ids, 0)
        eligible = eligibility_kernels.contains(words, safe[:, None], members)
        counted = ops.logical_and(
            counted, ops.logical_or(ops.logical_not(restricted[:, None]), eligible)
        )
    searched, before = eligibility_kernels.prepare_counted(members, counted)
    dense = None if dense_exclusions is None else dense_exclusions(set_ids, searched, before)
    return RequestEligibility(set_ids, searched, before, dense)


def repeat_rows(request: RequestEligibility, times: int, entered: bool) -> RequestEligibility:
    """Each row `times` times in a row (batch rows to beams, whose states
    are distinct at every step). The dense exclusions stay one row per
    batch row (`group`): a dense step finds the beam each emptied code is
    below, instead of testing every code against every beam's state."""
    fields = [None if x is None else ops.repeat(x, times, axis=0) for x in request[:3]]
    return RequestEligibility(*fields, request.dense_excluded, entered=entered,
                              group=request.group * times)  # fmt: skip


def dense_excluded_rows(request: RequestEligibility):
    """`dense_excluded` with one row per row (repeated if grouped)."""
    if request.group == 1:
        return request.dense_excluded
    return ops.repeat(request.dense_excluded, request.group, axis=0)


def keep_mask(words, directory, request: RequestEligibility, lo, hi):
    """bool `[R, K]`: whether `[lo, hi)` holds an eligible, non-excluded member.

    Args:
        words, directory: int32 `[S, W]`, `[S, D]` weights.
        request: a `RequestEligibility`.
        lo, hi: int32 `[R, K]` member ranges of each row's candidate states.
    """
    width = ops.shape(lo)[1]
    return _keep(words, directory, request, ops.concatenate([lo, hi], axis=1),
                 lambda x: x[:, width:] - x[:, :width])  # fmt: skip


def keep_mask_between(words, directory, request: RequestEligibility, bounds):
    """bool `[R, K]`: `keep_mask` for abutting ranges `[bounds[:, k],
    bounds[:, k + 1])`, e.g. a row's candidates when they are consecutive
    states (`tree_member_starts`): K + 1 ranks and searches, not 2 K."""
    return _keep(words, directory, request, bounds, lambda x: x[:, 1:] - x[:, :-1])


def _keep(words, directory, request, positions, span):
    """bool: `span(counts below positions) > 0`, with `span` the ranges'
    difference of the reads at their two ends."""
    count = span(positions)
    if request.set_ids is not None:
        ranks = _ranks(words, directory, request.set_ids, positions)
        count = _set_counts(request.set_ids, span(ranks), count)
    if request.excluded is not None:
        below = eligibility_kernels.counted_below(
            request.excluded, request.excluded_before, positions
        )
        count = count - span(below)
    return ops.greater(count, 0)


def _ranks(words, directory, set_ids, positions):
    """int32 `[R, Q]`: rank of each position in its row's set (set 0 for
    rows without one; `_set_counts` drops those)."""
    safe = ops.where(ops.greater_equal(set_ids, 0), set_ids, 0)
    return eligibility_kernels.rank(words, directory, safe[:, None], positions)


def _set_counts(set_ids, ranked, count):
    """`ranked` for rows with a set, `count` for rows without, 0 for rows
    with an unknown id."""
    count = ops.where(ops.greater_equal(set_ids, 0)[:, None], ranked, count)
    return ops.where(ops.greater_equal(set_ids, -1)[:, None], count, 0)


def dense_codes(member_codes, members, counted):
    """int32 `[R, E + 1]`: the code of depth d whose block holds each counted
    member (-1 for the others), once per decode: one gather.

    Args:
        member_codes: the `dense_member_codes` weight.
        members, counted: int32 `[R, E + 1]` sorted members and bool, which
            of them are real.
    """
    codes = gather.take(member_codes, ops.where(counted, members, 0))  # padding reads 0
    return ops.where(counted, codes, -1)


def blocked_dense_codes(words, directory, request: RequestEligibility, codes, table,
                        offsets, vocab: int):  # fmt: skip
    """int32 `[R, d, E + 1]`: at `[:, t]`, the codes of depth t + 1 that a
    row's exclusions empty (no eligible, non-excluded member left below),
    each once, at the slot of its first excluded member; -1 elsewhere.

    Found once per decode (every depth in one rank and one search), so a
    dense step only clears their bits.

    Args:
        words, directory: int32 `[S, W]`, `[S, D]` set weights.
        request: a `RequestEligibility` with `set_ids`, `excluded` and
            `excluded_before` (no `dense_excluded` yet).
        codes: int32 `[R, E + 1]`, the depth-d code of each excluded member
            (`dense_codes`), -1 for padding.
        table, offsets: the `dense_boundary_table` weight and its
            `dense_boundary_offsets`.
        vocab: V.
    """
    d = len(offsets) - 1
    real = ops.greater_equal(codes, 0)
    # The code of each depth t + 1, side by side: [R, d * (E + 1)].
    depth_codes = [ops.where(real, _floor_divide(codes, vocab ** (d - 1 - t)), 0)
                   for t in range(d)]  # fmt: skip
    at = ops.concatenate([offsets[t + 1] + c for t, c in enumerate(depth_codes)], axis=1)
    lo, hi = gather.take(table, at), gather.take(table, at + 1)
    count = hi - lo
    if request.set_ids is not None:
        width = ops.shape(at)[1]
        ranks = _ranks(words, directory, request.set_ids, ops.concatenate([lo, hi], axis=1))
        count = _set_counts(request.set_ids, ranks[:, width:] - ranks[:, :width], count)
    left = count - eligibility_kernels.counted_in_ranges(
        request.excluded, request.excluded_before, lo, hi
    )
    width = ops.shape(codes)[1]
    out = []
    for t, code in enumerate(depth_codes):
        first = ops.concatenate(
            [ops.ones_like(real[:, :1]), ops.not_equal(code[:, 1:], code[:, :-1])], axis=1
        )
        emptied = ops.less_equal(left[:, t * width : (t + 1) * width], 0)
        out.append(ops.where(ops.logical_and(ops.logical_and(real, first), emptied), code, -1))
    return ops.stack(out, axis=1)


def blocked_words(blocked, parent, vocab: int, mask_words: int):
    """int32 `[R, mask_words]`: the bits of the codes a dense step must clear,
    laid out as a dense mask row.

    Args:
        blocked: int32 `[R, E + 1]`, one depth of `blocked_dense_codes`
            (distinct codes per row, -1 padding).
        parent: int32 `[R]`, each row's state's code at its depth t.
        vocab, mask_words: V and the words of a mask row.
    """
    rows = ops.shape(blocked)[0]
    child = _floor_divide(blocked, vocab)
    hit = ops.logical_and(ops.greater_equal(blocked, 0), ops.equal(child, parent[:, None]))
    row = ops.broadcast_to(ops.arange(rows, dtype="int32")[:, None], ops.shape(blocked))
    return _cleared_words(row, blocked - child * vocab, hit, rows, mask_words)


def grouped_blocked_words(blocked, parent, group: int, vocab: int, mask_words: int):
    """`blocked_words` for rows in groups of `group` that share one row of
    `blocked` and whose `parent` codes within a group are distinct (a beam
    search's beams): each code is matched to the one beam it lies below
    (`[G, E + 1, group]` compares), and only the `G * (E + 1)` codes are
    scattered, not `group` copies of each.

    Args:
        blocked: int32 `[G, E + 1]`, one depth of `blocked_dense_codes` per group.
        parent: int32 `[G * group]`, each row's state's code at its depth t
            (negative for rows with no state).
        group, vocab, mask_words: rows per group, V and the words of a mask row.
    """
    child = _floor_divide(blocked, vocab)  # the code each blocked one is below
    match = ops.equal(child[:, :, None], ops.reshape(parent, (-1, 1, group)))
    hit = ops.logical_and(ops.greater_equal(blocked, 0), ops.any(match, axis=2))
    beam = ops.cast(ops.argmax(ops.cast(match, "int32"), axis=2), "int32")
    groups = ops.shape(blocked)[0]
    row = ops.arange(groups, dtype="int32")[:, None] * group + beam
    return _cleared_words(row, blocked - child * vocab, hit, groups * group, mask_words)


def _floor_divide(x, divisor: int):
    """`x // divisor` (floor) for int32 `x` and a Python int `divisor` > 0:
    an arithmetic shift when it is a power of two (floor division for
    negative `x` too). TF's CPU integer FloorDiv is about 5x a shift."""
    if divisor == 1:
        return x
    if divisor & (divisor - 1) == 0:
        return ops.right_shift(x, divisor.bit_length() - 1)
    return ops.floor_divide(x, divisor)


def _cleared_words(row, token, hit, rows, mask_words: int):
    """int32 `[rows, mask_words]`: bit `token` set in row `row` for every
    `hit` entry (int32 / bool tensors of one shape, distinct codes per row)."""
    token = ops.where(hit, token, 0)
    values = ops.where(hit, gather.take(_BIT_VALUES, ops.bitwise_and(token, 31)), 0)
    segments = row * mask_words + ops.right_shift(token, 5)
    # Distinct codes: distinct bits, so the sum of a word's values is their OR.
    words = ops.segment_sum(
        ops.reshape(values, (-1,)), ops.reshape(segments, (-1,)), rows * mask_words
    )
    return ops.reshape(words, (-1, mask_words))
