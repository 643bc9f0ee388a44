"""`TreeTransitions`: where a semantic-ID state's edges are and lead.

The semantic-ID kind's part of a step (`SparseStep`). States are numbered
depth by depth (`IndexLayout.depth_starts`), tail states after the dense
head; the CSR row of a tail state is an `indptr` read at a branching depth
and the state's own edge at a depth where every state has one child; edge k
leads to tail state `n_d + k` (no `next_states` array).
"""

from __future__ import annotations

from keras import ops

from static_keras.constants import INVALID_STATE
from static_keras.kernels import gather


class TreeTransitions:
    """Rows and edge targets of a semantic-ID index (see the module doc).

    Args:
        layout: the index's `IndexLayout`.
        index_weights: the layer's index weights (reads `indptr`).
    """

    def __init__(self, layout, index_weights):
        self.layout = layout
        self.index_weights = index_weights
        # Per-depth constants of the any-step kernels (tensor step or None).
        depths = range(layout.length + 1)
        self._depth_tables = {
            "depth_start": list(layout.depth_starts),
            "has_indptr": [t in layout.indptr_offsets for t in depths],
            "indptr_offset": [layout.indptr_offsets.get(t, 0) for t in depths],
            "edge_offset": [layout.edge_offsets.get(t, 0) for t in depths],
        }

    def depth(self, states):
        """Tokens decoded to reach each (non-negative) state: one comparison per
        depth against `layout.depth_starts`, as `StaticIndex.depth` does."""
        depth = ops.zeros_like(states)
        for start in self.layout.depth_starts[1:]:
            depth = depth + ops.cast(ops.greater_equal(states, start), "int32")
        return depth

    def width(self, step) -> int:
        if step is not None:
            return self.layout.step_widths[step]
        sparse = self.layout.step_widths[self.layout.dense_levels :]
        return max(sparse) if sparse else 1

    def same_members(self, step) -> bool:
        # A tree's members all end at depth L: an only child holds all of
        # its parent's members. Step 0 has no entered parent to rely on.
        return step is not None and step > 0 and self.layout.step_widths[step] == 1

    def edge_targets(self, edges):
        layout = self.layout
        return edges + (layout.dense_head_states + layout.level_sizes[layout.dense_levels])

    def rows(self, states, step):
        """CSR row of each tail state: `(start, count)`, count 0 elsewhere."""
        layout = self.layout
        if step is not None:
            valid = ops.greater(states, INVALID_STATE)
            first = layout.dense_head_states + layout.tail_state_offsets[step]
            local = ops.where(valid, states - first, 0)
            if step in layout.indptr_offsets:
                rows = layout.indptr_offsets[step] + local
                indptr = self.index_weights["indptr"]
                start = ops.cast(gather.take(indptr, rows), "int32")
                count = ops.cast(gather.take(indptr, rows + 1), "int32") - start
            else:  # every state at this depth has exactly one child
                start = layout.edge_offsets[step] + local
                count = ops.ones_like(start)
            return start, ops.where(valid, count, 0)
        # Any step: each row's depth from its state, then per-depth constants.
        inner = ops.logical_and(
            ops.greater_equal(states, layout.dense_head_states),
            ops.less(states, layout.first_leaf_state),
        )
        states = ops.where(inner, states, layout.dense_head_states)
        depth = self.depth(states)
        table = {k: ops.convert_to_tensor(v, "int32") for k, v in self._depth_tables.items()}
        local = states - gather.take(table["depth_start"], depth)
        start = gather.take(table["edge_offset"], depth) + local
        count = ops.ones_like(start)
        if layout.indptr_offsets:
            indptr = self.index_weights["indptr"]
            last = indptr.shape[0] - 2
            rows = ops.clip(gather.take(table["indptr_offset"], depth) + local, 0, last)
            row_start = ops.cast(gather.take(indptr, rows), "int32")
            row_count = ops.cast(gather.take(indptr, rows + 1), "int32") - row_start
            branching = ops.cast(gather.take(table["has_indptr"], depth), "bool")
            start = ops.where(branching, row_start, start)
            count = ops.where(branching, row_count, count)
        return ops.where(inner, start, 0), ops.where(inner, count, 0)
