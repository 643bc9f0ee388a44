"""Backend primitives: the few ops a kernel needs that keras.ops lacks or
makes slow, one module per backend, each with the same functions.

- `tensorflow.py`, `jax.py`: the backend's own kernels (plain in-range
  gathers, a 2-D cell gather, popcount, a sorted search);
- `portable.py`: the same in keras.ops only, for PyTorch (`torch.py` adds
  where torch places ops) and any other backend.

Each also answers what the execution plan asks of its backend: where ops go
by default (`device_kind`), whether the ops being built now are compiled by
XLA (`compiling`), whether it holds int64 tensors (`holds_int64`), and how
a weight takes a host array and gives its value back (`weight_value`,
`zeros_value`, `host_array`: TensorFlow shares the memory, with no copy).

This folder is the one place that names a backend: a kernel reaches these
functions through the plan (`execution_plan.current().primitives.take(x,
i)`), and the plan names the module that serves each backend
(`ExecutionPlan.primitive_modules`). A GPU or TPU formulation of a primitive
is one new module here beside the CPU one (say `jax_gpu.py`: it imports
`jax.py`'s functions and replaces those it changes), named for its backend
by that device's plan (`XLA_GPU` or `XLA_TPU` in `kernels/execution_plan.py`).
"""

from __future__ import annotations

import functools
import importlib

import keras

#: What every module here defines.
FUNCTIONS = (
    "take",
    "take_along_rows",
    "take_cells",
    "popcount32",
    "searchsorted",
    "holds_int64",
    "weight_value",
    "zeros_value",
    "host_array",
    "compiling",
    "device_kind",
)


def name() -> str:
    """The running Keras backend: "tensorflow", "jax", "torch", ..."""
    return keras.config.backend()


@functools.lru_cache(maxsize=None)
def load(module: str):
    """The module `module` of this folder (imported on first use: a backend's
    own module imports its framework)."""
    return importlib.import_module(f"{__name__}.{module}")
