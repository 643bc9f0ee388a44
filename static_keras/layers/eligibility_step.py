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

At a dense step the candidates of a row are the V consecutive codes below
its state, so their ranges are V + 1 consecutive table entries (boundaries):
one rank per boundary gives the eligible counts, and each excluded member is
binary-searched among the boundaries and scattered onto the code it passes
through, so nothing is ever `[R, V, E]`.

Everything stays in int32 (JAX disables int64 by default).
"""

from __future__ import annotations

import math

import numpy as np
from keras import ops

from static_keras.index import member_ranges as host_member_ranges
from static_keras.layers import eligibility_kernels
from static_keras.layers import gather

# Host tables ------------------------------------------------------------------


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
    depth = np.full(first_state.size, d, np.int64)
    tables.append(host_member_ranges.first_tail_members(layout, arrays, first_state, depth))
    return np.concatenate(tables).astype(np.int32)


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
            lo, hi = _descend(layout, indptr, local, local + 1, depth)
        return ops.where(valid, lo, 0), ops.where(valid, hi, 0)
    valid = ops.logical_and(ops.greater_equal(states, 0), ops.less(states, layout.state_space))
    safe = ops.where(valid, states, 0)
    row_depth = ops.zeros_like(safe)
    for start in layout.depth_starts[1:]:
        row_depth = row_depth + ops.cast(ops.greater_equal(safe, start), "int32")
    starts = ops.convert_to_tensor(list(layout.depth_starts), "int32")
    local = safe - gather.take(starts, row_depth)
    lo, hi = _descend(layout, indptr, local, local + 1, row_depth)
    if d:
        head = ops.less(safe, layout.dense_head_states)
        at = ops.where(head, safe + row_depth, 0)  # flat entry: state + depth
        lo = ops.where(head, gather.take(dense_table, at), lo)
        hi = ops.where(head, gather.take(dense_table, at + 1), hi)
    return ops.where(valid, lo, 0), ops.where(valid, hi, 0)


def _descend(layout, indptr, lo, hi, depth):
    """Follows first children from tail-local positions `lo`, `hi` of `depth`
    (an int, or an int32 tensor of per-row depths) down to member numbers.

    Position `level_sizes[u]` (one past a level's end) descends to one past
    the next level's end, so `hi = lo(s + 1)` needs no special case.
    """
    last = indptr.shape[0] - 1
    first = depth if isinstance(depth, int) else layout.dense_levels
    for u in range(first, layout.length):
        if u not in layout.indptr_offsets:  # one child each: same position below
            continue
        offset, edges = layout.indptr_offsets[u], layout.edge_offsets[u]
        moved = []
        for position in (lo, hi):
            at = offset + position
            if not isinstance(depth, int):
                at = ops.clip(at, 0, last)
            child = ops.cast(gather.take(indptr, at), "int32") - edges
            if not isinstance(depth, int):
                child = ops.where(ops.less_equal(depth, u), child, position)
            moved.append(child)
        lo, hi = moved
    return lo, hi


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


def check_eligibility(eligibility, num_sets: int, num_rows=None):
    """`(set_ids int32 [R] or None, excluded int32 [R, E] or None)`, checked.

    Set ids must lie in `[-1, num_sets)` (-1: no set restriction). Concrete
    values (eager) are checked here and raise ValueError; symbolic ones (a
    TF graph, `jax.jit`) cannot be, and an out-of-range id there keeps
    nothing (its row gets no candidates), see `keep_mask`.
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
        set_ids = ops.cast(set_ids, "int32")
        if len(ops.shape(set_ids)) != 1:
            raise ValueError(f"`set_ids` must be int [R]. Received shape {ops.shape(set_ids)}")
        values = _concrete(set_ids)
        if values is not None and values.size and (values.min() < -1 or values.max() >= num_sets):
            raise ValueError(
                f"`set_ids` must lie in [-1, {num_sets}) (-1: no set). "
                f"Received values in [{values.min()}, {values.max()}]"
            )
    if excluded is not None:
        excluded = ops.cast(excluded, "int32")
        if len(ops.shape(excluded)) != 2:
            raise ValueError(
                f"`excluded` must be int [R, E] member numbers (`exclusion_members`). "
                f"Received shape {ops.shape(excluded)}"
            )
    return set_ids, excluded


def _concrete(x):
    try:
        return np.asarray(ops.convert_to_numpy(x))
    except Exception:  # symbolic: a graph tensor or a tracer
        return None


def keep_mask(words, directory, num_members: int, eligibility, lo, hi):
    """bool `[R, K]`: whether `[lo, hi)` holds an eligible, non-excluded member.

    Args:
        words, directory: int32 `[S, W]` weights (unused rows: set id -1).
        num_members: int (the padding of `excluded`).
        eligibility: `(set_ids [R] or None, excluded [R, E] or None)`, checked.
        lo, hi: int32 `[R, K]` member ranges of each row's candidate states.
    """
    set_ids, excluded = eligibility
    count = hi - lo
    if set_ids is not None:
        restricted, safe, known = _set_rows(set_ids, words.shape[0])
        ranked = eligibility_kernels.eligible_in_range(words, directory, safe, lo, hi)
        count = ops.where(restricted[:, None], ranked, count)
        count = ops.where(known[:, None], count, 0)
    if excluded is not None and excluded.shape[1] != 0:
        counted = _counted_exclusions(words, num_members, set_ids, excluded)  # [R, E]
        inside = ops.logical_and(
            ops.greater_equal(excluded[:, None, :], lo[:, :, None]),
            ops.less(excluded[:, None, :], hi[:, :, None]),
        )
        hits = ops.logical_and(inside, counted[:, None, :])
        count = count - ops.sum(ops.cast(hits, "int32"), axis=-1)
    return ops.greater(count, 0)


def dense_keep_mask(words, directory, num_members: int, eligibility, boundaries):
    """bool `[R, V]`: `keep_mask` of V consecutive ranges per row, given as
    their V + 1 boundaries `[R, V + 1]` (non-decreasing along a row).

    Each excluded member is binary-searched among its row's boundaries (the
    last boundary `<=` it names its code) and scattered onto that code.
    """
    set_ids, excluded = eligibility
    vocab = boundaries.shape[1] - 1
    if set_ids is not None:
        restricted, safe, known = _set_rows(set_ids, words.shape[0])
        ranks = eligibility_kernels.rank(words, directory, safe[:, None], boundaries)
        ranks = ops.where(restricted[:, None], ranks, boundaries)
        count = ops.where(known[:, None], ranks[:, 1:] - ranks[:, :-1], 0)
    else:
        count = boundaries[:, 1:] - boundaries[:, :-1]
    if excluded is not None and excluded.shape[1] != 0:
        counted = _counted_exclusions(words, num_members, set_ids, excluded)
        # Upper bound: the first boundary above each member, in [0, V + 1].
        low = ops.zeros_like(excluded)
        high = ops.full_like(excluded, vocab + 1)
        for _ in range(math.ceil(math.log2(vocab + 2))):
            active = ops.less(low, high)
            middle = (low + high) // 2
            value = gather.take_along_rows(boundaries, ops.minimum(middle, vocab))
            right = ops.logical_and(active, ops.less_equal(value, excluded))
            low = ops.where(right, middle + 1, low)
            high = ops.where(ops.logical_and(active, ops.logical_not(right)), middle, high)
        code = low - 1
        inside = ops.logical_and(ops.greater_equal(code, 0), ops.less(code, vocab))
        hit = ops.logical_and(inside, counted)
        columns = ops.where(hit, code, vocab)  # misses land in a spare column
        rows = ops.broadcast_to(
            ops.arange(ops.shape(columns)[0], dtype="int32")[:, None], ops.shape(columns)
        )
        indices = ops.reshape(ops.stack([rows, columns], axis=-1), (-1, 2))
        removed = ops.scatter(
            indices, ops.reshape(ops.cast(hit, "int32"), (-1,)), (ops.shape(columns)[0], vocab + 1)
        )
        count = count - removed[:, :vocab]
    return ops.greater(count, 0)


def _set_rows(set_ids, num_sets: int):
    """`(restricted, safe, known)` `[R]`: rows with a set, clamped ids, and
    rows whose id lies in `[-1, num_sets)` (the others keep nothing)."""
    restricted = ops.greater_equal(set_ids, 0)
    known = ops.logical_and(ops.greater_equal(set_ids, -1), ops.less(set_ids, num_sets))
    safe = ops.where(ops.logical_and(restricted, known), set_ids, 0)
    return restricted, safe, known


def _counted_exclusions(words, num_members: int, set_ids, excluded):
    """bool `[R, E]`: excluded members the eligible count includes (so they
    must be subtracted): real members, and eligible where the row has a set."""
    real = ops.logical_and(ops.greater_equal(excluded, 0), ops.less(excluded, num_members))
    if set_ids is None:
        return real
    restricted, safe, _ = _set_rows(set_ids, words.shape[0])
    member = ops.where(real, excluded, num_members)
    eligible = eligibility_kernels.contains(words, safe[:, None], member)
    return ops.logical_and(real, ops.logical_or(ops.logical_not(restricted[:, None]), eligible))
