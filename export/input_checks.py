"""Checks of a request's tensors inside a served signature, in the graph.

TF Serving feeds a request's tensors as they come (its `Session::Run` holds
them to neither the signature's shape nor any range), so a served function
checks what its model would otherwise answer wrongly without a word: each
returns its tensor once the check has passed, else InvalidArgument naming
the input. They run outside any XLA cluster: XLA drops Assert ops.
"""

from __future__ import annotations

import tensorflow as tf


def check_shape(name: str, tensor: tf.Tensor, spec: tf.TensorSpec) -> tf.Tensor:
    """`tensor`, once its shape is known to be `spec`'s (any batch), else
    InvalidArgument naming the input and both shapes. TF Serving feeds a
    request's tensors as they come (its `Session::Run` does not hold them
    to the signature's shape), and a history of another length than the
    model was built for would be answered without a word."""
    expected = spec.shape.as_list()[1:]
    if not expected:
        return tensor
    shape = tf.shape(tensor, out_type=tf.int64)
    # Only the dimensions: the rank is the placeholder's to grappler, which
    # folds a rank check away (a request of another rank fails in the model).
    padded = tf.concat([shape[1:], tf.fill([len(expected)], tf.constant(-1, tf.int64))], 0)
    same = tf.reduce_all(tf.equal(padded[: len(expected)], expected))
    dims = ", ".join(str(d) for d in expected)
    check = tf.debugging.Assert(
        same,
        [f"Input {name!r} must have shape [batch, {dims}] (what the model was built for); "
         "received shape", shape],
    )  # fmt: skip
    with tf.control_dependencies([check]):
        return tf.identity(tensor)


def check_ids(
    name: str, tensor: tf.Tensor, low: int, high: int, what: str = "the rows of its embedding"
) -> tf.Tensor:
    """`tensor`, once every id is known to be in [low, high) (else InvalidArgument).

    On GPU an out-of-range gather returns zeros and Keras' `take` wraps
    negative ids, so the signature checks ids itself. The model reads the
    checked tensor, so the check runs first and its message is the one sent.
    """
    inside = tf.reduce_all(
        (tensor >= tf.cast(low, tensor.dtype)) & (tensor < tf.cast(high, tensor.dtype))
    )
    check = tf.debugging.Assert(
        inside,
        [f"Input {name!r} holds ids outside [{low}, {high}) ({what}); "
         "smallest and largest:", tf.reduce_min(tensor), tf.reduce_max(tensor)],
    )  # fmt: skip
    with tf.control_dependencies([check]):
        return tf.identity(tensor)


def check_batch(name: str, tensor: tf.Tensor, batch: tf.Tensor) -> tf.Tensor:
    """`tensor`, once its leading dimension is known to be `batch`."""
    check = tf.debugging.Assert(
        tf.equal(tf.shape(tensor)[0], batch),
        [f"Input {name!r}: `{name}` must have one row per batch row: expected", batch,
         "rows. Received rows:", tf.shape(tensor)[0]],
    )  # fmt: skip
    with tf.control_dependencies([check]):
        return tf.identity(tensor)


def check_width(name: str, tensor: tf.Tensor, most: int) -> tf.Tensor:
    """`tensor` `[B, E]`, once `E <= most` is known (the step's search of a
    row's exclusions covers that many when E is not static)."""
    check = tf.debugging.Assert(
        tf.less_equal(tf.shape(tensor)[1], most),
        [f"Input {name!r} may hold at most {most} ids per row; received", tf.shape(tensor)[1]],
    )
    with tf.control_dependencies([check]):
        return tf.identity(tensor)
