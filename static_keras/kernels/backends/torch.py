"""PyTorch's backend primitives: keras.ops (`portable.py`), and where torch
places ops. A torch formulation of a primitive (say a Triton kernel for a
GPU) is one new module beside this one, named by its plan
(`kernels/backends/__init__.py`)."""

from __future__ import annotations

import functools

from static_keras.kernels.backends.portable import compiling
from static_keras.kernels.backends.portable import holds_int64
from static_keras.kernels.backends.portable import popcount32
from static_keras.kernels.backends.portable import searchsorted
from static_keras.kernels.backends.portable import take
from static_keras.kernels.backends.portable import take_along_rows
from static_keras.kernels.backends.portable import take_cells

__all__ = [
    "take",
    "take_along_rows",
    "take_cells",
    "popcount32",
    "searchsorted",
    "holds_int64",
    "compiling",
    "device_kind",
]


@functools.lru_cache(maxsize=None)
def device_kind() -> str:
    import torch

    return "gpu" if torch.cuda.is_available() else "cpu"
