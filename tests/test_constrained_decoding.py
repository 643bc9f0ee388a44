"""ConstrainedDecoding: one step against the NumPy index, and Keras plumbing."""

import os

import keras
import numpy as np
import pytest
from keras import ops

from static_keras import MASKED_LOGIT
from static_keras import ConstrainedDecoding
from static_keras import StaticIndex
from static_keras.constraint import dense_edge_rows


def _random_index(seed, n=60, vocab=7, length=4, dense_levels="auto", item_ids=False):
    rng = np.random.default_rng(seed)
    seqs = rng.integers(0, vocab, size=(n, length))
    ids = rng.permutation(n) + 10 if item_ids else None
    return StaticIndex.build(
        seqs, vocab, dense_levels=dense_levels, item_ids=ids, on_duplicate_item="first"
    )


def _walk(layer, prefixes):
    """States after `prefixes [n, t]`, advanced one token at a time."""
    states = np.zeros(len(prefixes), np.int32)
    for t in range(prefixes.shape[1]):
        states = np.asarray(layer.advance(states, prefixes[:, t], step=t))
    return states


def _probe_prefixes(index, t, rng):
    members = np.unique(index.sequences()[:, :t], axis=0)
    noise = rng.integers(0, index.vocab_size, size=(8, t))
    return np.concatenate([members, noise]).astype(np.int32)


@pytest.mark.parametrize("dense_levels", [0, 1, 2, 3, 4])
def test_candidates_and_mask_match_index(dense_levels):
    index = _random_index(1, dense_levels=dense_levels)
    layer = ConstrainedDecoding(index)
    rng = np.random.default_rng(0)
    for t in range(index.length):
        prefixes = _probe_prefixes(index, t, rng)
        expected = index.allowed_tokens(prefixes)
        states = _walk(layer, prefixes)
        logits = rng.normal(size=(len(prefixes), index.vocab_size)).astype("float32")

        scores, tokens, next_states = (np.asarray(x) for x in layer(logits, states, step=t))
        assert tokens.shape == (len(prefixes), index.step_widths[t])
        for row in range(len(prefixes)):
            valid = tokens[row] >= 0
            assert sorted(tokens[row][valid]) == list(np.flatnonzero(expected[row]))
            np.testing.assert_array_equal(scores[row][valid], logits[row, tokens[row][valid]])
            assert np.all(np.isneginf(scores[row][~valid]))
            assert np.all(next_states[row][~valid] == -1)
            assert np.all(next_states[row][valid] >= 0)
            # The next state of each candidate equals advancing by its token.
            advanced = np.asarray(
                layer.advance(np.full(valid.sum(), states[row]), tokens[row][valid], step=t)
            )
            np.testing.assert_array_equal(advanced, next_states[row][valid])

        masked = np.asarray(layer(logits, states, step=t, mode="mask"))
        np.testing.assert_array_equal(masked, np.where(expected, logits, MASKED_LOGIT))
        np.testing.assert_array_equal(np.asarray(layer.allowed_mask(states, step=t)), expected)


def test_walk_matches_membership_and_item_ids():
    index = _random_index(2, item_ids=True)
    layer = ConstrainedDecoding(index)
    rng = np.random.default_rng(1)
    probes = np.concatenate([index.sequences(), rng.integers(0, 7, size=(40, 4))])
    states = _walk(layer, probes)
    np.testing.assert_array_equal(states >= 0, index.contains(probes))
    np.testing.assert_array_equal(np.asarray(layer.item_ids(states)), index.lookup_item_ids(probes))


def test_dense_top_k_keeps_best_valid_tokens():
    index = StaticIndex.build(np.arange(12).reshape(12, 1) % 10, 10, dense_levels=1)
    layer = ConstrainedDecoding(index)
    logits = np.arange(10, dtype="float32")[None]
    scores, tokens, _ = layer(logits, np.zeros(1, "int32"), step=0, dense_top_k=3)
    assert np.asarray(tokens).tolist() == [[9, 8, 7]]
    assert layer.num_candidates(0, dense_top_k=3) == 3


def test_invalid_rows_are_padding_and_never_nan():
    index = _random_index(3)
    layer = ConstrainedDecoding(index)
    states = np.array([-1, -1], np.int32)
    logits = np.zeros((2, index.vocab_size), "float32")
    for t in range(index.length):
        scores, tokens, next_states = (np.asarray(x) for x in layer(logits, states, step=t))
        assert np.all(tokens == -1) and np.all(next_states == -1)
        assert np.all(np.isneginf(scores))
        masked = np.asarray(layer(logits, states, step=t, mode="mask"))
        assert np.all(masked == MASKED_LOGIT)
        softmax = np.asarray(ops.softmax(masked, axis=-1))
        assert np.all(np.isfinite(softmax))


def test_advance_rejects_invalid_tokens():
    index = StaticIndex.build([[0, 1], [2, 3]], 5, dense_levels=1)
    layer = ConstrainedDecoding(index)
    states = np.asarray(layer.advance(np.zeros(4, "int32"), np.array([0, 1, 7, -3]), step=0))
    assert (states >= 0).tolist() == [True, False, False, False]
    states = np.asarray(layer.advance(np.array([states[0]] * 2), np.array([1, 3]), step=1))
    assert (states >= 0).tolist() == [True, False]


def test_weights_config_and_counts():
    index = _random_index(4, item_ids=True)
    layer = ConstrainedDecoding(index)
    assert layer.trainable_weights == []
    # The index's 5 arrays, and the last dense step's edge rows (derived).
    derived = dense_edge_rows.arrays(index.layout, index.arrays["dense_states"])
    assert sorted(derived) == sorted(layer.derived_index_weights)
    assert len(layer.non_trainable_weights) == len(index.arrays) + 2 == 7
    for weight in layer.weights:
        name = weight.path.split("/")[-1]
        np.testing.assert_array_equal(np.asarray(weight), {**index.arrays, **derived}[name])
    config = layer.get_config()
    assert "index" not in config
    assert len(str(config)) < 1000  # layout integers only, no data
    clone = ConstrainedDecoding.from_config(config)
    assert clone.layout == layer.layout
    clone.set_index(index)
    logits = np.random.default_rng(0).normal(size=(3, 7)).astype("float32")
    states = np.zeros(3, "int32")
    for a, b in zip(layer(logits, states, step=0), clone(logits, states, step=0)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_symbolic_call_shapes():
    index = _random_index(5)
    layer = ConstrainedDecoding(index)
    logits = keras.Input((index.vocab_size,))
    states = keras.Input((), dtype="int32")
    for t in range(index.length):
        scores, tokens, next_states = layer(logits, states, step=t)
        assert tuple(scores.shape) == (None, index.step_widths[t])
        assert tokens.dtype == "int32" and next_states.dtype == "int32"
        assert scores.dtype == "float32"
    masked = layer(logits, states, step=1, mode="mask")
    assert tuple(masked.shape) == (None, index.vocab_size)


def test_keras_file_round_trip(tmp_path):
    index = _random_index(6, item_ids=True)
    logits_in = keras.Input((index.vocab_size,))
    states_in = keras.Input((), dtype="int32")
    layer = ConstrainedDecoding(index)
    outputs = layer(logits_in, states_in, step=2)
    model = keras.Model([logits_in, states_in], list(outputs))
    path = os.path.join(tmp_path, "model.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(5, index.vocab_size)).astype("float32")
    states = _walk(layer, index.sequences()[:5, :2].astype(np.int32))
    for a, b in zip(
        model.predict([logits, states], verbose=0), loaded.predict([logits, states], verbose=0)
    ):
        np.testing.assert_array_equal(a, b)


def test_mismatched_layout_and_bad_arguments():
    index = _random_index(7)
    other = _random_index(8)
    with pytest.raises(ValueError, match="`vocab_size` is 7 in the index and 9"):
        ConstrainedDecoding(index, vocab_size=9)
    layer = ConstrainedDecoding(index)
    with pytest.raises(ValueError, match="does not match this layer"):
        layer.set_index(other)
    with pytest.raises(ValueError, match="Missing"):
        ConstrainedDecoding(vocab_size=3)
    with pytest.raises(ValueError, match="`step` must lie in"):
        layer(np.zeros((1, 7), "float32"), np.zeros(1, "int32"), step=4)
    with pytest.raises(ValueError, match="`step` must be an int, a scalar int tensor or None"):
        layer.advance(np.zeros(1, "int32"), np.zeros(1, "int32"), step=1.0)
    with pytest.raises(ValueError, match="`mode`"):
        layer(np.zeros((1, 7), "float32"), np.zeros(1, "int32"), step=0, mode="dense")
    with pytest.raises(ValueError, match="without `item_ids`"):
        layer.item_ids(np.zeros(1, "int32"))


@pytest.mark.skipif(keras.config.backend() != "tensorflow", reason="jit_compile is TF's")
def test_eager_equals_xla():
    import tensorflow as tf

    index = _random_index(9, n=300, vocab=11, length=5, dense_levels=2)
    layer = ConstrainedDecoding(index)
    rng = np.random.default_rng(0)
    for t in range(index.length):
        prefixes = _probe_prefixes(index, t, rng)
        states = _walk(layer, prefixes)
        logits = rng.normal(size=(len(prefixes), index.vocab_size)).astype("float32")
        compiled = tf.function(lambda x, s, t=t: layer(x, s, step=t), jit_compile=True)
        compiled_mask = tf.function(
            lambda x, s, t=t: layer(x, s, step=t, mode="mask"), jit_compile=True
        )
        for a, b in zip(layer(logits, states, step=t), compiled(logits, states)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        np.testing.assert_array_equal(
            np.asarray(layer(logits, states, step=t, mode="mask")),
            np.asarray(compiled_mask(logits, states)),
        )
