"""Host arrays a device framework can take as its own buffers, without a copy.

TensorFlow's CPU kernels read tensors aligned for its widest vectors
(64 bytes); NumPy aligns large arrays to 16. A weight made from a NumPy
array therefore costs a copy, and TensorFlow's own conversion of one costs
two (`kernels/backends/tensorflow.weight_value`). The index builder
allocates the large arrays of an index here, so a layer's weights share
their memory with the `StaticIndex` they came from: one copy of the index
in a process, not three while the layer is made.
"""

from __future__ import annotations

import numpy as np

#: Bytes: TensorFlow's EIGEN_MAX_ALIGN_BYTES on AVX-512 machines.
ALIGNMENT = 64


def empty(shape, dtype) -> np.ndarray:
    """`np.empty(shape, dtype)` at an aligned address."""
    return _carve(np.empty, shape, dtype)


def zeros(shape, dtype) -> np.ndarray:
    """`np.zeros(shape, dtype)` at an aligned address (calloc'd: its pages
    cost no memory until written)."""
    return _carve(np.zeros, shape, dtype)


def full(shape, value, dtype) -> np.ndarray:
    """`np.full(shape, value, dtype)` at an aligned address."""
    out = empty(shape, dtype)
    out.fill(value)
    return out


def is_aligned(array: np.ndarray) -> bool:
    """Whether `array`'s data starts at an aligned address (an empty array
    has no data to align)."""
    return array.size == 0 or array.ctypes.data % ALIGNMENT == 0


def aligned(array: np.ndarray) -> np.ndarray:
    """`array` itself when it is C-contiguous, native-order and aligned,
    else an aligned copy of it (one copy)."""
    array = np.asarray(array)
    if array.flags.c_contiguous and array.dtype.isnative and is_aligned(array):
        return array
    return aligned_copy(array)


def aligned_copy(array: np.ndarray) -> np.ndarray:
    """A writeable, aligned, native-order copy of `array`."""
    array = np.asarray(array)
    out = empty(array.shape, array.dtype.newbyteorder("="))
    np.copyto(out, array)
    return out


def _carve(allocate, shape, dtype) -> np.ndarray:
    dtype = np.dtype(dtype)
    shape = tuple(int(x) for x in np.atleast_1d(shape))
    size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = allocate(size + ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % ALIGNMENT
    return raw[start : start + size].view(dtype).reshape(shape)
