"""`StringTransitions`: where a string-set state's edges are and lead.

The string kind's part of a step (`SparseStep`): every state has a CSR row
(`indptr[s] : indptr[s + 1]`) and each edge names its target in
`next_states` (a general automaton: states are shared between members).
"""

from __future__ import annotations

from keras import ops

from static_keras.constants import INVALID_STATE
from static_keras.kernels import gather


class StringTransitions:
    """Rows and edge targets of a `StringIndex` (see the module doc).

    Args:
        layout: the index's `StringIndexLayout`.
        index_weights: the layer's index weights (reads `indptr`,
            `next_states`).
    """

    def __init__(self, layout, index_weights):
        self.layout = layout
        self.index_weights = index_weights

    def width(self, step) -> int:
        return self.layout.max_width if step is None else self.layout.step_widths[step]

    def same_members(self, step) -> bool:
        return False  # a state's members are not its children's in general

    def rows(self, states, step):
        valid = ops.logical_and(
            ops.greater(states, INVALID_STATE), ops.less(states, self.layout.num_states)
        )
        indptr = self.index_weights["indptr"]
        safe = ops.where(valid, states, 0)
        start = ops.cast(gather.take(indptr, safe), "int32")
        count = ops.cast(gather.take(indptr, safe + 1), "int32") - start
        return start, ops.where(valid, count, 0)

    def edge_targets(self, edges):
        return ops.cast(gather.take(self.index_weights["next_states"], edges), "int32")
