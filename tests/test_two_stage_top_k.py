"""The two-stage top-k equals a stable descending sort, index for index."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from decoding_oracles import compiled_modes

from static_keras.kernels import two_stage_top_k


def _oracle(x, k):
    """Descending by value, ties by lower index: NumPy's stable sort."""
    order = np.argsort(-x, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(x, order, axis=1), order


def _rows(kind, rows, n, rng):
    if kind == "normal":
        return rng.normal(size=(rows, n)).astype("float32")
    if kind == "ties":  # few distinct values: ties at every rank
        return rng.integers(0, 4, (rows, n)).astype("float32")
    if kind == "masked":  # a dense mask: most values -inf, some rows all -inf
        x = rng.normal(size=(rows, n)).astype("float32")
        x[rng.random((rows, n)) < 0.999] = -np.inf
        x[0] = -np.inf
        return x
    raise ValueError(kind)


@pytest.mark.parametrize("kind", ["normal", "ties", "masked"])
@pytest.mark.parametrize(
    "n, k",
    [
        (1024 * 3, 3),  # exactly the threshold: two stages, 32 blocks of 32
        (1024 * 3 - 1, 3),  # one below: the plain kernel
        (20 * 2048, 20),  # batch 128 x beam 20 at V = 2048
        (5 * 1031 * 4, 5),  # not a multiple of the block: -inf padding
        (7000, 1),
    ],
)
def test_two_stage_top_k_equals_a_stable_sort(kind, n, k):
    x = _rows(kind, 3, n, np.random.default_rng(n + k))
    want_values, want_indices = _oracle(x, k)
    for mode, wrap in compiled_modes():
        values, indices = wrap(lambda v: two_stage_top_k.top_k(v, k))(x)
        values, indices = np.asarray(values), np.asarray(indices)
        np.testing.assert_array_equal(values, want_values, err_msg=mode)
        assert indices.dtype == np.int32
        if keras.config.backend() == "torch":  # torch.topk: ties in any order
            np.testing.assert_array_equal(np.take_along_axis(x, indices, 1), values)
            assert all(len(set(row)) == k for row in indices.tolist())
        else:
            np.testing.assert_array_equal(indices, want_indices, err_msg=mode)


def test_block_sizes_balance_the_two_stages():
    assert two_stage_top_k._block_size(20 * 2048, 20) == 32
    assert two_stage_top_k._block_size(70 * 2048, 70) == 32
    assert two_stage_top_k._block_size(1024, 1) == 32
    assert two_stage_top_k._block_size(8, 8) == 1
