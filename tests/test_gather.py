"""The in-range gathers and runs (`kernels/gather.py`) against NumPy indexing, in every
execution mode of the test backend, and under JAX in a subprocess."""

import textwrap

import keras
import numpy as np
import pytest
from backend_subprocess import run_under
from decoding_oracles import compiled_modes
from keras import ops

from static_keras.kernels import gather


def _check_every_gather(wrap, label):
    rng = np.random.default_rng(0)
    x = rng.integers(-(2**31), 2**31 - 1, (37, 9)).astype("int32")  # any bits
    rows = rng.integers(0, 37, (5, 4)).astype("int32")
    columns = rng.integers(0, 9, (5, 4)).astype("int32")
    one_column = columns[:, :1]  # broadcasts against `rows`
    variable = keras.Variable(x.reshape(-1), trainable=False)  # a layer's index weight

    def run(table):
        return (
            gather.take(table, rows[:, 0]),
            gather.take_along_rows(ops.convert_to_tensor(x[:5]), columns),
            gather.take_cells(table, rows, columns),
            gather.take_cells(table, rows, one_column),
            gather.take_cells(table, rows[:, 0], columns[:, 0]),
            gather.take_cells(ops.reshape(table, (37, 3, 3)), rows, columns % 3),  # rows of 3
        )

    # Runs of 6 edges from each row's start; slots past a row's `count` are
    # 0 (as `_row_slots` makes them) and may read anything.
    flat = x.reshape(-1)
    for rows_, width in ((1, 6), (3, 6), (1, 400)):  # 400 > x.size: the gather path
        starts = rng.integers(-3, flat.size + 3, rows_).astype("int32")
        starts[0] = flat.size - 2  # a run that would pass the end
        count = np.clip(flat.size - starts, 0, width)
        count[starts < 0] = 0
        slots = np.arange(width)
        keep = slots[None, :] < count[:, None]
        edges = np.where(keep, starts[:, None] + slots, 0).astype("int32")
        got = np.asarray(wrap(lambda: gather.take_runs(variable, edges, starts))())
        assert got.shape == edges.shape, label
        np.testing.assert_array_equal(got[keep], flat[edges][keep], err_msg=label)
    for table in (ops.convert_to_tensor(x), keras.Variable(x, trainable=False)):
        got = [np.asarray(value) for value in wrap(lambda: run(table))()]
        want = [
            x[rows[:, 0]],
            np.take_along_axis(x[:5], columns, axis=1),
            x[rows, columns],
            x[rows, one_column],
            x[rows[:, 0], columns[:, 0]],
            x.reshape(37, 3, 3)[rows, columns % 3],
        ]
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w, err_msg=label)


def test_gathers_equal_numpy_indexing_in_every_mode():
    for label, wrap in compiled_modes():
        _check_every_gather(wrap, label)


_JAX_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, sys.argv[1])
    import test_gather as t
    from decoding_oracles import compiled_modes
    for label, wrap in compiled_modes():
        t._check_every_gather(wrap, label)
    print("jax gathers ok")
    """
)


def test_gathers_under_jax():
    pytest.importorskip("jax", reason="JAX is an optional backend (pip install .[jax])")
    run_under("jax", _JAX_SCRIPT, "jax gathers ok")
