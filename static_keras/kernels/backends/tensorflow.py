"""TensorFlow's backend primitives (`kernels/backends/`): its own plain
gathers, popcount and sorted search, and what the execution plan asks of it.

`keras.ops.take` and `take_along_axis` accept negative and out-of-range
indices at the cost of extra ops on every call (about 15 for
`take_along_axis`), which TensorFlow's graph executor dispatches one by
one; a kernel's indices are in range by construction, so these are the
plain gathers. A GPU or TPU formulation of one of these is a new module
beside this one, named by that device's plan.
"""

from __future__ import annotations

import functools

import numpy as np
import tensorflow as tf

from static_keras.index import aligned_arrays


def take(x, indices):
    """`x[indices]` along axis 0 (indices in range)."""
    # A read, then a gather: `tf.gather` on a variable is a `ResourceGather`,
    # which puts the variable in copy-on-read mode for good, and every later
    # plain read of it (a reshape, a search) then copies all of it: a
    # per-request cost that grows with the catalogue.
    return tf.gather(tf.convert_to_tensor(x), indices)


def take_along_rows(x, indices):
    """`out[r, k] = x[r, indices[r, k]]` for 2-D `x` and `indices` (in range)."""
    return tf.gather(x, indices, batch_dims=1)


def take_cells(x, rows, columns):
    """`x[rows, columns]` (broadcast; any further axes come along): one
    `gather_nd` on `x`."""
    x = tf.convert_to_tensor(x)  # a read: XLA has no `ResourceGatherNd`
    shape = tf.broadcast_dynamic_shape(tf.shape(rows), tf.shape(columns))
    cells = tf.stack([tf.broadcast_to(rows, shape), tf.broadcast_to(columns, shape)], -1)
    return tf.gather_nd(x, cells)


def popcount32(x):
    """int32: the set bits of each int32 pattern (one kernel; XLA's popcnt)."""
    return tf.cast(tf.raw_ops.PopulationCount(x=x), "int32")


def searchsorted(sorted_rows, values):
    """int32 `[R, Q]`: entries of each sorted row `< values[r, q]` (one kernel)."""
    return tf.searchsorted(sorted_rows, values, side="left", out_type=tf.int32)


def holds_int64() -> bool:
    return True


def weight_value(array):
    """`array` as a tensor over the same memory, for a weight to take as its
    buffer: the variable made from it (or assigned it) copies nothing.

    `tf.Variable(array)` or `assign(array)` of a NumPy array converts it
    first, which holds two copies of it (measured: +2 GiB for 1 GiB of
    int32), so an index's weights cost three times the index while they
    are made. DLPack hands over the array's memory instead; memory that is
    not aligned for TensorFlow's kernels, not contiguous or read-only is
    first copied into an aligned buffer (one copy). Assigning a weight
    replaces its buffer, never writes into it, so the array is never
    changed through the weight.
    """
    array = np.asarray(array)
    if array.flags.writeable:
        array = aligned_arrays.aligned(array)
    else:  # DLPack cannot say read-only
        array = aligned_arrays.aligned_copy(array)
    return tf.experimental.dlpack.from_dlpack(array.__dlpack__())


def zeros_value(shape, dtype):
    """Zeros for a weight that its file's values will replace: calloc'd
    memory (pages untouched, so not resident) shared with the variable."""
    array = aligned_arrays.zeros(shape, dtype)
    return tf.experimental.dlpack.from_dlpack(array.__dlpack__())


def host_array(weight) -> np.ndarray:
    """A weight's value as NumPy: a read-only view of its buffer (DLPack,
    no copy) on the CPU; elsewhere a copy."""
    tensor = tf.convert_to_tensor(weight)
    if "CPU" not in tensor.device.upper():
        return tensor.numpy()
    return np.from_dlpack(tensor)


def compiling() -> bool:
    """Whether the ops built now are compiled by XLA: inside a
    `tf.function(jit_compile=True)` (or a function it calls).

    TensorFlow has no user-facing API for this. `tf.__internal__` is the
    API it exports for its own libraries (Keras), and this function is what
    TensorFlow's losses call to take their XLA forms; it finds the XLA
    context of the graph being built or of a graph around it.
    """
    if tf.executing_eagerly():
        return False
    return tf.__internal__.get_enclosing_xla_context() is not None


@functools.lru_cache(maxsize=None)
def device_kind() -> str:
    """ "tpu", "gpu" or "cpu": where TensorFlow places ops by default."""
    for kind in ("tpu", "gpu"):
        if tf.config.list_logical_devices(kind.upper()):
            return kind
    return "cpu"
