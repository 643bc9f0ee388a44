"""Backend primitives in keras.ops only: PyTorch's (`torch.py`) and any
other backend's that has no module of its own (`kernels/backends/`).

The same functions as `tensorflow.py` and `jax.py`, with the same answers;
where keras.ops has no such op, its nearest exact form: a flattened view
for a 2-D cell gather, SWAR steps for popcount, an all-pairs count for a
sorted search.
"""

from __future__ import annotations

import numpy as np
from keras import ops

_M1 = 0x55555555
_M2 = 0x33333333
_M4 = 0x0F0F0F0F
_LOW31 = 0x7FFFFFFF


def take(x, indices):
    """`x[indices]` along axis 0 (indices in range)."""
    return ops.take(x, indices, axis=0)


def take_along_rows(x, indices):
    """`out[r, k] = x[r, indices[r, k]]` for 2-D `x` and `indices` (in range)."""
    return ops.take_along_axis(x, indices, axis=1)


def take_cells(x, rows, columns):
    """`x[rows, columns]` (broadcast; any further axes come along): keras.ops
    has no 2-D gather, so a gather on the flattened view."""
    flat = ops.reshape(x, (-1, *x.shape[2:]))
    return take(flat, rows * ops.shape(x)[1] + columns)


def popcount32(x):
    """int32: the set bits of each int32 pattern. SWAR steps, the sign bit
    apart, so they only see non-negative 31-bit values and never overflow."""
    sign = ops.bitwise_and(ops.right_shift(x, 31), 1)
    return _popcount31(ops.bitwise_and(x, _LOW31)) + sign


def _popcount31(x):
    """Set bits of a non-negative int32 (SWAR: 2-, 4-, 8-bit field sums)."""
    x = x - ops.bitwise_and(ops.right_shift(x, 1), _M1)  # never below 0: x >= (x >> 1) & m1
    x = ops.bitwise_and(x, _M2) + ops.bitwise_and(ops.right_shift(x, 2), _M2)
    x = ops.bitwise_and(x + ops.right_shift(x, 4), _M4)  # < 0x40000000 before the mask
    x = x + ops.right_shift(x, 8)
    x = x + ops.right_shift(x, 16)
    return ops.bitwise_and(x, 0x3F)


def searchsorted(sorted_rows, values):
    """int32 `[R, Q]`: entries of each sorted row `< values[r, q]`.
    keras.ops' `searchsorted` is 1-D: every pair compared (`[R, Q, P]`)."""
    below = ops.less(ops.expand_dims(sorted_rows, 1), ops.expand_dims(values, 2))
    return ops.sum(ops.cast(below, "int32"), axis=2)


def weight_value(array):
    """`array`, for a weight to take as its value (the backend copies it)."""
    return array


def zeros_value(shape, dtype):
    """None: the weight starts as the backend's own zeros."""
    return None


def host_array(weight) -> np.ndarray:
    """A weight's value as NumPy (a copy)."""
    return np.asarray(ops.convert_to_numpy(weight))


def holds_int64() -> bool:
    return True


def compiling() -> bool:
    """Whether XLA compiles the ops built now: never through keras.ops alone."""
    return False


def device_kind() -> str:
    return "cpu"
