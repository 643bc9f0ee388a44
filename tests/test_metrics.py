"""RecallAtK against a plain NumPy oracle, its Keras plumbing and other backends."""

import importlib
import importlib.util
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
from conftest import CONTEXT_VOCAB
from conftest import HISTORY
from conftest import histories
from conftest import make_index

import static_keras
from static_keras import ConstrainedBeamSearch
from static_keras.metrics import RecallAtK
from static_keras.metrics import recall_per_row

recall_module = importlib.import_module("static_keras.metrics.recall_at_k")


def oracle(y_true, y_pred, k, sample_weight=None):
    """Recall@K by sets, row by row: (mean, per-row recalls, rows counted)."""
    y_true = np.asarray(y_true).reshape(len(y_pred), -1)
    weights = np.ones(len(y_pred)) if sample_weight is None else np.asarray(sample_weight)
    recalls, counted = [], []
    for truth, predicted in zip(y_true.tolist(), np.asarray(y_pred).tolist()):
        relevant = {t for t in truth if t >= 0}
        top = {p for p in predicted[:k] if p >= 0}
        counted.append(bool(relevant))
        recalls.append(len(relevant & top) / len(relevant) if relevant else 0.0)
    recalls, counted = np.array(recalls), np.array(counted)
    total = float((recalls * weights * counted).sum())
    count = float((weights * counted).sum())
    return (total / count if count else 0.0), recalls, counted


def random_case(rng, batch, width, predicted, two_d=True, ids=8):
    """Small id range (hits and duplicates), -1 padding, some all-padding rows."""
    shape = (batch, width) if two_d else (batch,)
    y_true = rng.integers(0, ids, shape)
    y_true = np.where(rng.random(shape) < 0.3, -1, y_true)
    y_pred = rng.integers(0, ids, (batch, predicted))
    # Padding at the end of a row, as beam search returns it.
    valid = rng.integers(0, predicted + 1, batch)
    y_pred = np.where(np.arange(predicted)[None, :] < valid[:, None], y_pred, -1)
    return y_true, y_pred


@pytest.mark.parametrize("two_d", [True, False])
@pytest.mark.parametrize("k", [1, 3, 12])
def test_matches_the_oracle_over_random_batches(two_d, k):
    rng = np.random.default_rng(k + 10 * two_d)
    metric = RecallAtK(k)
    totals = []
    for batch, width, predicted in [(1, 1, 1), (7, 3, 4), (33, 5, 10), (16, 2, 6)]:
        y_true, y_pred = random_case(rng, batch, width, predicted, two_d)
        weights = rng.random(batch) * (rng.random(batch) < 0.8)  # some zero weights
        _, recalls, counted = oracle(y_true, y_pred, k)
        got_recall, got_counted = recall_per_row(y_true, y_pred, k)
        np.testing.assert_allclose(np.asarray(got_recall), recalls, rtol=1e-6)
        np.testing.assert_array_equal(np.asarray(got_counted), counted)
        metric.update_state(y_true, y_pred, sample_weight=weights)
        totals.append((recalls * weights * counted, weights * counted))
    expected = sum(t.sum() for t, _ in totals) / sum(c.sum() for _, c in totals)
    np.testing.assert_allclose(float(metric.result()), expected, rtol=1e-5)


def test_duplicates_padding_and_k_beyond_the_predictions():
    y_true = np.array([[4, 4, -1], [-1, -1, -1], [1, 2, 3], [5, -1, 5]])
    y_pred = np.array([[4, 4, 4], [1, 2, 3], [3, 3, -1], [-1, -1, -1]])
    recall, counted = recall_per_row(y_true, y_pred, k=10)
    # Repeated relevant ids count once; a repeated prediction finds one item.
    np.testing.assert_allclose(np.asarray(recall), [1.0, 0.0, 1 / 3, 0.0], rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(counted), [True, False, True, True])
    metric = RecallAtK(10)
    metric.update_state(y_true, y_pred)
    np.testing.assert_allclose(float(metric.result()), (1 + 1 / 3) / 3, rtol=1e-6)
    # Only the first k columns count, not the first k valid ones.
    recall, _ = recall_per_row(np.array([7]), np.array([[-1, 7]]), k=1)
    assert np.asarray(recall).tolist() == [0.0]


def test_all_padding_rows_and_zero_weights_leave_the_mean_unchanged():
    metric = RecallAtK(2)
    metric.update_state(np.array([[-1, -1], [-1, -1]]), np.array([[1, 2], [3, 4]]))
    assert float(metric.result()) == 0.0  # nothing counted yet, and no NaN
    metric.update_state(np.array([1, 9]), np.array([[1, 2], [3, 4]]), sample_weight=[1.0, 0.0])
    assert float(metric.result()) == 1.0
    metric.update_state(np.array([9, -1]), np.array([[1, 2], [9, 9]]), sample_weight=[[3.0], [5.0]])
    np.testing.assert_allclose(float(metric.result()), 1 / 4, rtol=1e-6)


# Ids equal modulo 2**32: a comparison in int32 would merge them.
BIG_TRUE = np.array([2**40, 3, 2**40 + 2**33], np.int64)
BIG_PRED = np.array([[2**40 + 2**33, 2**40], [1, 2], [2**40 + 2**33, 0]], np.int64)


def test_mixed_integer_dtypes_and_tensor_inputs():
    metric = RecallAtK(1)
    metric.update_state(BIG_TRUE, BIG_PRED)
    np.testing.assert_allclose(float(metric.result()), 1 / 3, rtol=1e-6)
    metric.reset_state()
    metric.update_state(BIG_TRUE, keras.ops.convert_to_tensor(BIG_PRED))
    np.testing.assert_allclose(float(metric.result()), 1 / 3, rtol=1e-6)
    metric.reset_state()
    metric.update_state(
        keras.ops.convert_to_tensor(np.array([3, 1], np.int32)),
        keras.ops.convert_to_tensor(np.array([[3, 1], [0, 1]], np.int64)),
    )
    assert float(metric.result()) == 0.5


def test_reset_state():
    rng = np.random.default_rng(3)
    first = random_case(rng, 20, 3, 5)
    second = random_case(rng, 20, 3, 5)
    metric = RecallAtK(3)
    metric.update_state(*first)
    metric.reset_state()
    assert float(metric.result()) == 0.0
    metric.update_state(*second)
    np.testing.assert_allclose(float(metric.result()), oracle(*second, 3)[0], rtol=1e-6)
    assert [v.name for v in metric.variables] == ["total", "count"]


def test_config_round_trip():
    metric = RecallAtK(5, name="r5", dtype="float64")
    config = metric.get_config()
    assert config == {"name": "r5", "dtype": "float64", "k": 5}
    again = RecallAtK.from_config(config)
    assert (again.k, again.name, again.dtype) == (5, "r5", "float64")
    serialized = keras.saving.serialize_keras_object(RecallAtK(3))
    assert serialized["registered_name"] == "static_keras>RecallAtK"
    restored = keras.saving.deserialize_keras_object(serialized)
    assert isinstance(restored, RecallAtK) and restored.k == 3 and restored.name == "recall_at_3"
    assert static_keras.RecallAtK is RecallAtK


def test_bad_arguments():
    for k in (0, -1, 2.0, True, None):
        with pytest.raises(ValueError, match="`k` must be a positive integer"):
            RecallAtK(k)
    with pytest.raises(ValueError, match="integer item ids"):
        RecallAtK(2).update_state(np.array([1.0]), np.array([[1, 2]]))
    with pytest.raises(ValueError, match=r"\[B\] or \[B, T\]"):
        RecallAtK(2).update_state(np.array([1]), np.array([1, 2]))


class HistoryScores(keras.layers.Layer):
    """A small step decoder: the logits at step t embed the t-th history item."""

    def __init__(self, vocab_size, **kwargs):
        super().__init__(**kwargs)
        self.embedding = keras.layers.Embedding(CONTEXT_VOCAB, vocab_size)

    def call(self, prefix, state):
        return self.embedding(state[:, prefix.shape[1] % HISTORY]), state


def _item_id_model(beam_size=4):
    index = make_index(1)
    keras.utils.set_random_seed(0)
    decoder = HistoryScores(index.vocab_size)
    history = keras.Input((HISTORY,), dtype="int32", name="history")
    search = ConstrainedBeamSearch(index, decoder, beam_size=beam_size, outputs="item_ids")
    return keras.Model(history, search(history))


def _targets(predicted, rng):
    """One relevant id per row: a predicted one at a random rank, or a miss."""
    rows = np.arange(len(predicted))
    picked = predicted[rows, rng.integers(0, predicted.shape[1], len(predicted))]
    return np.where(rng.random(len(predicted)) < 0.7, picked, 99_999)


def no_loss(y_true, y_pred):
    """Keras needs a loss to evaluate on TensorFlow and torch; decoding has none."""
    return keras.ops.zeros(keras.ops.shape(y_pred)[:1])


def test_compile_and_evaluate_on_a_beam_search_model():
    model = _item_id_model()
    x = histories(24, seed=5)
    predicted = model.predict(x, batch_size=8, verbose=0)
    assert predicted.shape == (24, 4) and (predicted >= 0).all()
    rng = np.random.default_rng(0)
    y = _targets(predicted, rng)
    weights = rng.random(24).astype("float32")
    model.compile(
        loss=no_loss,
        metrics=[RecallAtK(1), RecallAtK(3)],
        weighted_metrics=[RecallAtK(3, name="weighted_recall_at_3")],
    )
    got = model.evaluate(x, y, sample_weight=weights, batch_size=8, verbose=0, return_dict=True)
    np.testing.assert_allclose(got["recall_at_1"], oracle(y, predicted, 1)[0], rtol=1e-6)
    np.testing.assert_allclose(got["recall_at_3"], oracle(y, predicted, 3)[0], rtol=1e-6)
    np.testing.assert_allclose(
        got["weighted_recall_at_3"], oracle(y, predicted, 3, weights)[0], rtol=1e-5
    )
    assert 0.0 < got["recall_at_1"] < got["recall_at_3"] < 1.0


_BACKEND_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, sys.argv[1])
    import keras, numpy as np
    from test_metrics import BIG_PRED, BIG_TRUE
    from test_metrics import _item_id_model, _targets, no_loss, oracle, random_case
    from conftest import histories
    from static_keras.metrics import RecallAtK
    assert keras.config.backend() == sys.argv[2]
    rng = np.random.default_rng(1)
    for k in (1, 4, 20):
        metric = RecallAtK(k)
        y_true, y_pred = random_case(rng, 30, 4, 6, ids=6)
        weights = rng.random(30)
        metric.update_state(y_true, y_pred, sample_weight=weights)
        np.testing.assert_allclose(
            float(metric.result()), oracle(y_true, y_pred, k, weights)[0], rtol=1e-5
        )
    metric = RecallAtK(1)
    if keras.config.backend() == "jax":  # 32-bit unless jax_enable_x64
        try:
            metric.update_state(BIG_TRUE, BIG_PRED)
            raise AssertionError("ids beyond int32 must be refused on JAX x32")
        except ValueError as error:
            assert "jax_enable_x64" in str(error)
    else:
        metric.update_state(BIG_TRUE, BIG_PRED)
        np.testing.assert_allclose(float(metric.result()), 1 / 3, rtol=1e-6)
    model = _item_id_model()
    x = histories(16, seed=5)
    predicted = np.asarray(model.predict(x, batch_size=8, verbose=0))
    y = _targets(predicted, rng)
    model.compile(loss=no_loss, metrics=[RecallAtK(2)])
    got = model.evaluate(x, y, batch_size=8, verbose=0, return_dict=True)
    np.testing.assert_allclose(got["recall_at_2"], oracle(y, predicted, 2)[0], rtol=1e-6)
    print("metric ok on", keras.config.backend())
    """
)


@pytest.mark.slow  # two fresh processes; tests/test_torch_backend.py covers torch by default
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_other_backends(backend):
    if importlib.util.find_spec(backend) is None:
        hint = {"jax": "pip install .[jax]", "torch": "pip install torch==2.13.0"}[backend]
        pytest.skip(f"{backend} is not installed ({hint})")
    tests = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run(
        [sys.executable, "-c", _BACKEND_SCRIPT, tests, backend],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"metric ok on {backend}" in result.stdout
