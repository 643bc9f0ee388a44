"""Which execution mode the ops being built will run in.

Some kernels have a formulation per mode (`docs/concepts.md`): XLA (JAX,
TF `jit_compile`) fuses many small ops into a few loops, while TensorFlow's
graph executor (what TF Serving runs by default) and eager mode dispatch
every op on its own, a few microseconds each. Both forms give the same
results; the choice is made when the ops are built, so a SavedModel
exported without XLA carries the op-by-op form.
"""

from __future__ import annotations

import keras
from keras import ops


def tf_op_by_op() -> bool:
    """Whether ops built now run one by one in TensorFlow (eagerly, or in a
    `tf.function` outside any `jit_compile` context), not compiled by XLA."""
    if keras.config.backend() != "tensorflow":
        return False
    import tensorflow as tf
    from tensorflow.python.ops import control_flow_util

    if tf.executing_eagerly():
        return True
    return not control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


def xla_compiled() -> bool:
    """Whether ops built now are compiled by XLA (TF `jit_compile`, JAX)."""
    backend = keras.config.backend()
    return backend == "jax" or (backend == "tensorflow" and not tf_op_by_op())


def computed_once(x):
    """`x`, materialised once under XLA (TF `jit_compile`, JAX).

    XLA fuses a cheap producer into each consumer, once per consumer
    element: a derived eligibility word's ~100 bit ops into the unpack of
    its 32 flags (+16 ms at `[2560, 64]`). XLA's CPU pipeline drops
    optimization barriers before fusion, so `x` passes through a scatter
    instead (a fusion root; an identity `segment_sum`, +0.3 ms there). Not
    worth it for small producers: on a beam search's `[R]` states it cost
    more than the recomputation it saves. Where TF runs op by op, and on
    torch, `x` itself.
    """
    if xla_compiled():
        flat = ops.reshape(x, (-1,))
        size = flat.shape[0] if flat.shape[0] is not None else ops.shape(flat)[0]
        summed = ops.segment_sum(flat, ops.arange(size, dtype="int32"), size)
        return ops.reshape(summed, ops.shape(x))
    return x
