"""Counts in sorted rows: `np.searchsorted(row, values, "left")` per row.

A request's excluded members are searched at every eligible step. Two
formulations give the same int32 counts; the execution plan picks one
(`sorted_search`): the backend's own search (its primitives' `searchsorted`:
one `tf.searchsorted` kernel where TensorFlow runs op by op), or a
branch-free binary search by powers of two (`log2(P)` fused gathers) under
XLA, whose `searchsorted` lowering is an all-pairs compare, and on backends
without a batched search kernel.
"""

from __future__ import annotations

from keras import ops

from static_keras.kernels import execution_plan
from static_keras.kernels import gather


def count_below(sorted_rows, values, max_width: int):
    """int32 `[R, Q]`: how many entries of each sorted row are `< values[r, q]`.

    Args:
        sorted_rows: int32 `[R, P]`, non-decreasing rows whose last entry no
            value exceeds (a sentinel). P may be unknown until run time.
        values: int32 `[R, Q]`.
        max_width: the most entries a row may have when P is not static.
    """
    plan = execution_plan.current()
    if plan.sorted_search == "searchsorted":
        return plan.primitives.searchsorted(sorted_rows, values)
    width = sorted_rows.shape[1]
    bits = (width - 1).bit_length() if width is not None else (max_width - 1).bit_length()
    last = ops.shape(sorted_rows)[1] - 1
    position = ops.zeros_like(values)
    # Probes past the row's end read its sentinel, which no value exceeds,
    # so they never move.
    for bit in reversed(range(bits)):
        at = position + ((1 << bit) - 1)
        if width is None or width != 1 << bits:
            at = ops.minimum(at, last)
        probe = gather.take_along_rows(sorted_rows, at)
        position = ops.where(ops.less(probe, values), position + (1 << bit), position)
    return position
