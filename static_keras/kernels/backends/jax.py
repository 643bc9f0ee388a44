"""JAX's backend primitives (`kernels/backends/`): its own in-range gathers,
popcount and sorted search, and what the execution plan asks of it.

`keras.ops.take` and `take_along_axis` check for negative and out-of-range
indices; a kernel's indices are in range by construction, so these tell XLA
so (`mode="clip"` or `"promise_in_bounds"`: no extra ops). A GPU or TPU
formulation of one of these (a Pallas kernel, say) is a new module beside
this one (`jax_gpu.py`, importing these and replacing what it changes),
named by that device's plan.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

# Keras copies a host array into a JAX variable (`jnp.array`) whatever it
# is given: the portable forms.
from static_keras.kernels.backends.portable import host_array  # noqa: F401
from static_keras.kernels.backends.portable import weight_value  # noqa: F401
from static_keras.kernels.backends.portable import zeros_value  # noqa: F401


def take(x, indices):
    """`x[indices]` along axis 0 (indices in range)."""
    return jnp.take(x, indices, axis=0, mode="clip")  # XLA clamps: no extra ops


def take_along_rows(x, indices):
    """`out[r, k] = x[r, indices[r, k]]` for 2-D `x` and `indices` (in range)."""
    return jnp.take_along_axis(x, indices, axis=1, mode="promise_in_bounds")


def take_cells(x, rows, columns):
    """`x[rows, columns]` (broadcast; any further axes come along): one
    gather on `x`."""
    return x.at[rows, columns].get(mode="promise_in_bounds")


def popcount32(x):
    """int32: the set bits of each int32 pattern (one op; XLA's popcnt)."""
    return lax.population_count(x)


def searchsorted(sorted_rows, values):
    """int32 `[R, Q]`: entries of each sorted row `< values[r, q]`
    (`jnp.searchsorted` per row)."""
    counts = jax.vmap(functools.partial(jnp.searchsorted, side="left"))(sorted_rows, values)
    return counts.astype("int32")


def holds_int64() -> bool:
    """False unless 64-bit mode is on (`jax_enable_x64`)."""
    return bool(jax.config.jax_enable_x64)


def compiling() -> bool:
    """Whether the ops built now are compiled by XLA as one program: staged
    by `jax.jit` (or a `lax` loop or branch), not dispatched one by one.

    JAX has no public query for it without a value in hand, but every op
    bound while a function is staged is a `jax.core.Tracer`, constants
    included (a constant scalar becomes a literal of the staged program, no
    op). Under `vmap` or `grad` alone it is concrete: those run op by op.
    """
    return isinstance(jnp.asarray(0), jax.core.Tracer)


@functools.lru_cache(maxsize=None)
def device_kind() -> str:
    """ "tpu", "gpu" or "cpu": where JAX places ops by default."""
    return jax.default_backend() if jax.default_backend() in ("gpu", "tpu") else "cpu"
