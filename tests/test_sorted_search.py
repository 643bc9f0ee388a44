"""`sorted_search`: the same counts as `np.searchsorted` in every execution
mode (the hand search under XLA and on other backends, TF's kernel where
TensorFlow runs op by op)."""

import keras
import numpy as np
import pytest

from static_keras.kernels import execution_plan
from static_keras.kernels import sorted_search

SENTINEL = 2**31 - 1


def rows_and_values(seed: int, width: int):
    """Sorted rows with repeats and a sentinel, values at and between entries."""
    rng = np.random.default_rng(seed)
    rows = np.sort(rng.integers(0, 50, (6, width)), axis=1).astype(np.int32)
    rows[:, -1] = SENTINEL
    values = np.concatenate([rows[:, :3], rng.integers(-2, 55, (6, 9))], axis=1)
    return rows, values.astype(np.int32)


def expected_below(rows, values):
    return np.stack([np.searchsorted(r, v, side="left") for r, v in zip(rows, values)])


def modes():
    """`(name, wrap)` for each way the layer may run on this backend."""
    found = [("eager", lambda fn: fn)]
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        found += [
            ("tf graph", lambda fn: tf.function(fn, jit_compile=False)),
            ("xla", lambda fn: tf.function(fn, jit_compile=True)),
        ]
    elif keras.backend.backend() == "jax":
        import jax

        found.append(("jit", jax.jit))
    return found


@pytest.mark.parametrize("width", [1, 2, 7, 8, 33])
@pytest.mark.parametrize("name, wrap", modes())
def test_count_below_matches_numpy(width, name, wrap):
    rows, values = rows_and_values(width, width)
    got = wrap(lambda r, v: sorted_search.count_below(r, v, 64))(rows, values)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(got), expected_below(rows, values))


def test_rows_of_unknown_width_in_a_tf_graph_and_under_xla():
    """A served signature does not know the exclusion width until run time."""
    if keras.backend.backend() != "tensorflow":
        pytest.skip("TF graphs need the TensorFlow backend")
    import tensorflow as tf

    rows, values = rows_and_values(5, 13)
    spec = [tf.TensorSpec([None, None], tf.int32)] * 2
    for jit in (False, True):
        fn = tf.function(lambda r, v: sorted_search.count_below(r, v, 16),
                         input_signature=spec, jit_compile=jit)  # fmt: skip
        np.testing.assert_array_equal(fn(rows, values).numpy(), expected_below(rows, values))


def test_a_pinned_plan_wins_and_unpins():
    with execution_plan.using(execution_plan.XLA_TPU):
        assert execution_plan.current() is execution_plan.XLA_TPU
    assert execution_plan.current() is not execution_plan.XLA_TPU
    with pytest.raises(ValueError, match="ExecutionPlan"):
        with execution_plan.using("xla"):
            pass


@pytest.mark.parametrize("plan", execution_plan.PLANS, ids=lambda p: p.name)
def test_count_below_is_the_same_under_every_plan(plan):
    rows, values = rows_and_values(3, 13)
    with execution_plan.using(plan):
        got = sorted_search.count_below(rows, values, 16)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(got), expected_below(rows, values))
