"""Gathers with in-range indices, the hot op of every decoding step.

`keras.ops.take` and `take_along_axis` accept negative and out-of-range
indices, which costs extra ops on every call: under TensorFlow `take` adds a
compare, an add, a select and a shape read to each gather, and
`take_along_axis` broadcasts, swaps axes, casts to int64 and reshapes (about
15 ops). XLA fuses most of that away; TensorFlow's graph executor, what TF
Serving runs by default, dispatches each op separately (a few microseconds
each on a CPU), and in a beam search those extra ops were about half of
the graph. Every index a decoding kernel passes here is in range by
construction (padding slots are clamped to 0 and masked afterwards), so
these call the backend's plain gather. Results are the same as the
`keras.ops` versions for in-range indices.
"""

from __future__ import annotations

import keras
from keras import ops

from static_keras.layers import execution_mode


def take(x, indices):
    """`x[indices]` along axis 0; every index must lie in `[0, x.shape[0])`."""
    if isinstance(x, keras.Variable):
        x = x.value  # also the mapped value inside a `keras.StatelessScope`
    backend = keras.config.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.gather(x, indices)
    if backend == "jax":
        import jax.numpy as jnp

        return jnp.take(x, indices, axis=0, mode="clip")  # XLA clamps: no extra ops
    return ops.take(x, indices, axis=0)


def take_along_rows(x, indices):
    """`out[r, k] = x[r, indices[r, k]]` for 2-D `x` and `indices` (in range)."""
    backend = keras.config.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.gather(x, indices, batch_dims=1)
    if backend == "jax":
        import jax.numpy as jnp

        return jnp.take_along_axis(x, indices, axis=1, mode="promise_in_bounds")
    return ops.take_along_axis(x, indices, axis=1)


def take_cells(x, rows, columns):
    """`x[rows, columns]`: the cells of `x`'s first two axes, elementwise over
    `rows` and `columns` (which broadcast against each other; every index in
    range); any further axes of `x` come along (`x` `[A, B, W]` gives rows
    of `W`).

    Compiled by XLA this is a gather from `x` itself. Flattening `x` first
    (a reshape, a shape-changing bitcast in HLO) makes XLA:CPU's cost model
    count every byte of `x` as read by the fusion that holds the gather:
    the 2049 x 64 mask words are 513 KiB, over its 512 KiB bar, and each
    such fusion (a decode has ~7 at 1 x 1, a few elements each) was split
    over two threads, about 25 us of hand-off for a 1 us loop. Op by op the
    flat gather is one kernel where `gather_nd` is two.
    """
    if isinstance(x, keras.Variable):
        x = x.value
    backend = keras.config.backend()
    if backend == "jax":
        return x.at[rows, columns].get(mode="promise_in_bounds")
    if backend == "tensorflow" and execution_mode.xla_compiled():
        import tensorflow as tf

        x = tf.convert_to_tensor(x)  # a read: XLA has no `ResourceGatherNd`
        shape = tf.broadcast_dynamic_shape(tf.shape(rows), tf.shape(columns))
        cells = tf.stack([tf.broadcast_to(rows, shape), tf.broadcast_to(columns, shape)], -1)
        return tf.gather_nd(x, cells)
    flat = ops.reshape(x, (-1, *x.shape[2:]))
    return take(flat, rows * ops.shape(x)[1] + columns)


def take_runs(x, edges, start):
    """`x[edges]` of a 1-D `x`, for `[R, W]` in-range `edges` that run on from
    each row's `start` (`[R]`) where they matter: `edges[r, j] = start[r] + j`
    for the slots a caller keeps (the others, which it masks, may read other
    entries of `x`).

    Under JAX with one row (batch 1 x beam 1), the run is read as one
    `dynamic-slice` of `x` and a gather from those `W` entries. A gather
    straight from `x` is, to XLA:CPU's cost model, a read of all of `x` (the
    token array is MBs), which splits its fusion over two threads: ~25-50 us
    of hand-off for a loop of a few elements, twice a step at 1 x 1.
    TensorFlow keeps the gather: under `jit_compile` the slice made each
    1 x 1 decode ~3 ms slower outside the compiled program (its XLA work was
    unchanged; the launch around it grew, as if copying the index
    variables), and op by op a gather is one kernel. More rows, and `x`
    shorter than `W`, also read `take(x, edges)`.
    """
    if isinstance(x, keras.Variable):
        x = x.value
    size, rows, width = x.shape[0], edges.shape[0], edges.shape[1]
    if rows == 1 and size is not None and size >= width and keras.config.backend() == "jax":
        first = ops.clip(start[0], 0, size - width)  # the run always fits in `x`
        window = ops.slice(x, ops.expand_dims(first, 0), (width,))
        slots = ops.arange(width, dtype="int32")
        at = ops.minimum(ops.clip(start[0] - first, 0, width - 1) + slots, width - 1)
        return ops.expand_dims(take(window, at), 0)
    return take(x, edges)
