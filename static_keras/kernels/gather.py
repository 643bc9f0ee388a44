"""Gathers with in-range indices, the hot op of every decoding step.

`keras.ops.take` and `take_along_axis` accept negative and out-of-range
indices, which costs extra ops on every call (about 15 for
`take_along_axis` under TensorFlow); TensorFlow's graph executor dispatches
each one. Every index a decoding kernel passes here is in range by
construction (padding slots are clamped to 0 and masked afterwards), so
these call the backend's plain gathers (the execution plan's primitives,
`kernels/backends/`), with the same results.
"""

from __future__ import annotations

import keras
from keras import ops

from static_keras.kernels import execution_plan


def take(x, indices):
    """`x[indices]` along axis 0; every index must lie in `[0, x.shape[0])`."""
    if isinstance(x, keras.Variable):
        x = x.value  # also the mapped value inside a `keras.StatelessScope`
    return execution_plan.current().primitives.take(x, indices)


def take_along_rows(x, indices):
    """`out[r, k] = x[r, indices[r, k]]` for 2-D `x` and `indices` (in range)."""
    return execution_plan.current().primitives.take_along_rows(x, indices)


def take_cells(x, rows, columns):
    """`x[rows, columns]`: the cells of `x`'s first two axes, elementwise over
    `rows` and `columns` (which broadcast against each other; every index in
    range); any further axes of `x` come along (`x` `[A, B, W]` gives rows
    of `W`). A gather on `x` itself (the backend's, `take_cells` of its
    primitives) or on a flattened view of it, as the execution plan says
    (`direct_cell_gather`).
    """
    if isinstance(x, keras.Variable):
        x = x.value
    plan = execution_plan.current()
    if plan.direct_cell_gather:
        return plan.primitives.take_cells(x, rows, columns)
    flat = ops.reshape(x, (-1, *x.shape[2:]))
    return take(flat, rows * ops.shape(x)[1] + columns)


def take_runs(x, edges, start):
    """`x[edges]` of a 1-D `x`, for `[R, W]` in-range `edges` that run on from
    each row's `start` (`[R]`) where they matter: `edges[r, j] = start[r] + j`
    for the slots a caller keeps (the others, which it masks, may read other
    entries of `x`).

    With one row, where the plan says so (`slice_single_row_runs`), the run
    is read as one slice of `x` and a gather from its `W` entries; otherwise
    (and for `x` shorter than `W`) as `take(x, edges)`.
    """
    if isinstance(x, keras.Variable):
        x = x.value
    size, rows, width = x.shape[0], edges.shape[0], edges.shape[1]
    if rows == 1 and size is not None and size >= width:
        if execution_plan.current().slice_single_row_runs:
            first = ops.clip(start[0], 0, size - width)  # the run always fits in `x`
            window = ops.slice(x, ops.expand_dims(first, 0), (width,))
            slots = ops.arange(width, dtype="int32")
            at = ops.minimum(ops.clip(start[0] - first, 0, width - 1) + slots, width - 1)
            return ops.expand_dims(take(window, at), 0)
    return take(x, edges)
