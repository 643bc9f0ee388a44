"""Searches in sorted rows, formulated per execution mode.

A request's excluded members are searched at every eligible step, so the
search must be cheap where the layer runs:

- under XLA (TF `jit_compile`, JAX) and on other backends: a branch-free
  binary search by powers of two, `log2(P)` fused gathers of `[R, Q]`
  (XLA lowers `tf.searchsorted` to an all-pairs `[R, Q, P]` compare, 13x
  slower at Q = 40, P = 101);
- where TensorFlow runs op by op (its graph executor, what TF Serving runs
  by default, and eager): one `tf.searchsorted` kernel, because the hand
  search is about 35 ops the executor dispatches one by one (2.1 ms against 0.7 ms for `[2560, 4]`
  queries in rows of 101; `benchmarks/decoding/eligibility_step.py`).

Both give the same int32 counts. The choice is made when the ops are built
(`tf_op_by_op`): a SavedModel exported without XLA carries the
`searchsorted` form, which is also what TF Serving runs; a graph later
auto-clustered by XLA (`--tf_xla_auto_jit`) still computes the same counts,
only slower.
"""

from __future__ import annotations

from keras import ops

from static_keras.layers import gather
from static_keras.layers.execution_mode import tf_op_by_op


def count_below(sorted_rows, values, max_width: int):
    """int32 `[R, Q]`: how many entries of each sorted row are `< values[r, q]`.

    Args:
        sorted_rows: int32 `[R, P]`, non-decreasing rows whose last entry no
            value exceeds (a sentinel). P may be unknown until run time.
        values: int32 `[R, Q]`.
        max_width: the most entries a row may have when P is not static.
    """
    if tf_op_by_op():
        import tensorflow as tf

        return tf.searchsorted(sorted_rows, values, side="left", out_type=tf.int32)
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
