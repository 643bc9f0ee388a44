"""`SparseStep`: one decoding step over the CSR rows of an automaton.

Both kinds store the edges of their sparse part the same way: each state's
tokens sorted in a CSR row of `tokens`. What differs per kind is where a
state's row is and where an edge leads; the kind supplies that as its
transitions (`TreeTransitions` for semantic IDs, `StringTransitions` for
string sets):

- `rows(states, step)`: `(start, count)` int32 `[R]`, count 0 for states
  outside the sparse part; `step` an int, or None for any step;
- `edge_targets(edges)`: int32, the state each edge leads to;
- `width(step)`: the edge slots read per row (`B_t`; the widest for None);
- `same_members(step)`: whether every child at int `step` holds all of its
  parent's members (then entered rows need no eligibility check).

The kernels here are the fixed-width gather of the paper (VNTK): `B_t` edge
slots from each row's start, padding slots masked.
"""

from __future__ import annotations

import math

import numpy as np
from keras import ops

from static_keras.constants import INVALID_STATE
from static_keras.constants import PAD_TOKEN
from static_keras.kernels import candidate_slots
from static_keras.kernels import gather


class SparseStep:
    """The sparse-part kernels of one layer.

    Args:
        transitions: the kind's transitions (see the module doc).
        index_weights: the layer's index weights (reads `tokens`).
    """

    def __init__(self, transitions, index_weights):
        self.transitions = transitions
        self.index_weights = index_weights

    def slots(self, states, step):
        """The `B_t` edge slots from each row's CSR start, `[R, B_t]`:
        clamped (always in range) edge numbers and whether each is real."""
        start, count = self.transitions.rows(states, step)
        return candidate_slots.row_slots(start, count, self.transitions.width(step))

    def candidates(self, logits, states, step, k: int, caps: bool, keep=None):
        """`(scores, tokens, next_states, ok)`, `[R, k]`: the best `k` slots
        when `caps` and `k < B_t`, padded when `k > B_t`. `keep`: None, or
        `edges -> bool [R, B_t]`, the slots whose target stays eligible."""
        transitions = self.transitions
        start, count = transitions.rows(states, step)
        edges, ok = candidate_slots.row_slots(start, count, transitions.width(step))
        tokens = ops.cast(gather.take_runs(self.index_weights["tokens"], edges, start), "int32")
        scores = ops.where(ok, gather.take_along_rows(logits, tokens), -np.inf)
        next_states = transitions.edge_targets(edges)
        if keep is not None:
            ok = ops.logical_and(ok, keep(edges))
            scores = ops.where(ok, scores, -np.inf)
        width = ops.shape(edges)[1]
        if k < width and caps:
            return candidate_slots.best_slots(scores, tokens, next_states, k)
        if k > width:  # any-step candidates: as wide as the widest dense step
            pad = [[0, 0], [0, k - width]]
            scores = ops.pad(scores, pad, constant_values=-np.inf)
            tokens = ops.pad(tokens, pad, constant_values=PAD_TOKEN)
            next_states = ops.pad(next_states, pad, constant_values=INVALID_STATE)
            ok = ops.pad(ok, pad, constant_values=False)
        return scores, tokens, next_states, ok

    def allowed(self, states, step, vocab_size: int, keep=None):
        """bool `[R, V]`: the tokens of each row's real (and kept) slots."""
        edges, ok = self.slots(states, step)
        tokens = ops.cast(gather.take(self.index_weights["tokens"], edges), "int32")
        if keep is not None:
            ok = ops.logical_and(ok, keep(edges))
        # Scatter the valid slots into [R, V + 1]; padding slots land in the
        # spare last column, which is dropped.
        columns = ops.where(ok, tokens, vocab_size)
        rows = ops.broadcast_to(
            ops.expand_dims(ops.arange(ops.shape(columns)[0], dtype="int32"), 1),
            ops.shape(columns),
        )
        indices = ops.reshape(ops.stack([rows, columns], axis=-1), (-1, 2))
        counts = ops.scatter(
            indices,
            ops.ones((ops.shape(indices)[0],), dtype="int32"),
            (ops.shape(columns)[0], vocab_size + 1),
        )
        return ops.greater(counts[:, :vocab_size], 0)

    def advance(self, states, tokens, step):
        """int32 `[R]`: the state after each row's token, `INVALID_STATE` for
        a token not in its row: a branch-free binary search in the row."""
        start, count = self.transitions.rows(states, step)
        table = self.index_weights["tokens"]
        low, high = start, start + count
        for _ in range(max(1, math.ceil(math.log2(self.transitions.width(step) + 1)))):
            active = ops.less(low, high)
            middle = (low + high) // 2
            value = ops.cast(gather.take(table, ops.where(active, middle, 0)), "int32")
            right = ops.logical_and(active, ops.less(value, tokens))
            low = ops.where(right, middle + 1, low)
            high = ops.where(ops.logical_and(active, ops.logical_not(right)), middle, high)
        at = ops.clip(low, 0, table.shape[0] - 1)
        hit = ops.equal(ops.cast(gather.take(table, at), "int32"), tokens)
        found = ops.logical_and(ops.less(low, start + count), hit)
        return ops.where(found, self.transitions.edge_targets(at), INVALID_STATE)
