"""PyTorch's backend primitives: keras.ops (`portable.py`), and where torch
places ops. A torch formulation of a primitive (say a Triton kernel for a
GPU) is one new module beside this one, named by its plan
(`kernels/backends/__init__.py`)."""

from __future__ import annotations

import functools

from static_keras.kernels.backends.portable import compiling
from static_keras.kernels.backends.portable import holds_int64
from static_keras.kernels.backends.portable import host_array
from static_keras.kernels.backends.portable import popcount32
from static_keras.kernels.backends.portable import searchsorted
from static_keras.kernels.backends.portable import take
from static_keras.kernels.backends.portable import take_along_rows
from static_keras.kernels.backends.portable import take_cells
from static_keras.kernels.backends.portable import weight_value
from static_keras.kernels.backends.portable import zeros_value

__all__ = [
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
]


@functools.lru_cache(maxsize=None)
def device_kind() -> str:
    import torch

    return "gpu" if torch.cuda.is_available() else "cpu"
