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
