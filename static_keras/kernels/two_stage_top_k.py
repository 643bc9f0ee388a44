"""Top-k of long rows in two stages: block maxima first, then the best blocks.

A beam search's ranking over every (beam, token) of a batch row is a top-k
over `beam_size * V` values, and the CPU top-k kernels of XLA and
TensorFlow scan each row with a heap (measured in docs/benchmarks.md,
"Execution plans and kernel formulations"). Split each row into blocks of
`b` values: the k best values lie in the k blocks with the best maxima (a
block outside those has k better maxima above its own, so k better
values), so a vectorised max over the blocks, a top-k over the `n / b`
maxima and one over the `k x b` values of the chosen blocks give the same
result at about `n / b + k b` heap steps instead of `n`. The chosen blocks are read in
ascending order, so ties keep the plain top-k's rule (the lower index
first) and the result equals `ops.top_k(x, k, sorted=True)` value for
value and index for index. On short rows (`n < 1024 k`) the extra ops cost
more than they save, and the plain kernel runs.
"""

from __future__ import annotations

import math

import numpy as np
from keras import ops

from static_keras.kernels import gather

#: Rows at least this many times `k` long take the two-stage path.
MIN_LENGTH_PER_K = 1024


def top_k(x, k: int):
    """`(values, indices)` of the `k` largest entries of each row of 2-D `x`,
    sorted descending: `ops.top_k(x, k)` exactly (indices int32), ties by
    lower index as TensorFlow's and XLA's top-k break them (PyTorch's
    `topk` leaves the order of ties open: equal values, tied indices may
    differ). `x`'s last dimension must be static; NaN-free."""
    n = x.shape[-1]
    if n is None or n < MIN_LENGTH_PER_K * k:
        values, indices = ops.top_k(x, k, sorted=True)
        return values, ops.cast(indices, "int32")
    block = _block_size(n, k)
    blocks = -(-n // block)
    if blocks * block != n:  # pad with -inf at the end: never before a real value
        x = ops.pad(x, [[0, 0], [0, blocks * block - n]], constant_values=-np.inf)
    rows = ops.shape(x)[0]
    tiles = ops.reshape(x, (-1, blocks, block))
    _, chosen = ops.top_k(ops.max(tiles, axis=2), k, sorted=False)
    # Ascending block order: positions in the gathered row then follow the
    # original order, so the second top-k breaks ties by lower index.
    chosen = ops.sort(ops.cast(chosen, "int32"), axis=-1)
    first = ops.expand_dims(ops.arange(rows, dtype="int32") * blocks, 1)
    picked = gather.take(ops.reshape(tiles, (-1, block)), ops.reshape(first + chosen, (-1,)))
    values, position = ops.top_k(ops.reshape(picked, (-1, k * block)), k, sorted=True)
    position = ops.cast(position, "int32")
    indices = gather.take_along_rows(chosen, position // block) * block + position % block
    return values, indices


def _block_size(n: int, k: int) -> int:
    """The power of two at or below `sqrt(n / k)`: it balances the two top-k
    (`n / b` maxima, `k b` values); 32 at `n = 2048 k`, which measured
    faster than 64."""
    return 1 << max(0, int(math.log2(math.sqrt(n / k))))
