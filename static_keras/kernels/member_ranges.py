"""Member ranges on the device: the members below each decoding state.

The members below a state are one range `[lo, hi)` (members are numbered in
decoding order), for both kinds, with fixed-width, branch-free gathers:

- semantic IDs: a tail state descends by first children to its first leaf
  (an `indptr` gather at branching levels, nothing at single-child levels),
  and `hi(s) = lo(s + 1)`; a dense-head state reads a small table of the
  first member of each code block (`dense_boundary_table`);
- string sets: per-state `lo`/`hi` arrays (`StringIndex.member_ranges`).

The host side (NumPy) is `static_keras.index.member_ranges`.
"""

from __future__ import annotations

from keras import ops

from static_keras.index.dense_eligibility import dense_boundary_offsets
from static_keras.kernels import gather


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


def keep_edges(part, request, edges, step):
    """bool `[R, B]`: whether each edge slot's target keeps an eligible,
    non-excluded member of its row's request (`part`: a member-range part
    with `transitions`, `ranges` and `eligibility_filter`)."""
    targets = part.transitions.edge_targets(edges)
    lo, hi = part.ranges(targets, None if step is None else step + 1)
    return part.eligibility_filter.keep(request, lo, hi)
