"""The `step` argument of a constraint's step methods, checked once.

A Python int is the fast path (each step has its own static width); a
scalar int tensor or None means any step (the widest width, each row's
depth read from its state).
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops


def static_step(step, length: int) -> int | None:
    """A Python int step (range-checked), or None for a tensor step or None."""
    if step is None:
        return None
    if isinstance(step, bool):
        raise ValueError(f"`step` must be an int, a scalar int tensor or None. Received: {step}")
    if isinstance(step, (int, np.integer)):
        if not 0 <= step < length:
            raise ValueError(f"`step` must lie in [0, {length}). Received: step={step}")
        return int(step)
    if not hasattr(step, "shape"):  # a float, a list: what a tensor would be made of
        step = np.asarray(step)
    shape = tuple(ops.shape(step))
    dtype = keras.backend.standardize_dtype(step.dtype)
    if shape != () or "int" not in dtype:
        raise ValueError(
            "`step` must be an int, a scalar int tensor or None. "
            f"Received: shape {shape}, dtype {dtype}"
        )
    return None
