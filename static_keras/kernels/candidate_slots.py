"""Fixed-width candidate slots: a row's run of edges, and the best of them."""

from __future__ import annotations

import numpy as np
from keras import ops

from static_keras.kernels import gather


def row_slots(start, count, width: int):
    """`(edges, ok)` `[R, width]` of rows `[start, start + count)`: clamped
    (always in range) edge numbers and whether each is real."""
    slot = ops.arange(width, dtype="int32")
    ok = ops.less(slot, ops.expand_dims(count, 1))
    edges = ops.where(ok, ops.expand_dims(start, 1) + slot, 0)
    return edges, ok


def best_slots(scores, tokens, next_states, k: int):
    """The `k` best of `[R, B]` candidate slots (`-inf`: padding), sorted."""
    scores, pick = ops.top_k(scores, k, sorted=True)
    tokens = gather.take_along_rows(tokens, pick)
    next_states = gather.take_along_rows(next_states, pick)
    return scores, tokens, next_states, ops.greater(scores, -np.inf)
