"""Atomic publishing of versions and index-only refreshes."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import make_index
from conftest import make_model

from static_keras.export import list_versions
from static_keras.export import publish
from static_keras.export import read_metadata
from static_keras.export import replace_index


def _checkpoint(path):
    reader = tf.train.load_checkpoint(os.path.join(path, "variables", "variables"))
    return {
        key: reader.get_tensor(key)
        for key in reader.get_variable_to_shape_map()
        if key.endswith("VARIABLE_VALUE")
    }


def test_versions_are_numbered_kept_and_never_overwritten(small_model, tmp_path):
    _, model = small_model
    base = tmp_path / "recs"
    published = [publish(model, base, keep=2).version for _ in range(3)]
    assert published == [1, 2, 3]
    assert list_versions(base) == [2, 3]
    assert sorted(os.listdir(base)) == ["2", "3"]  # no temporary directories left
    with pytest.raises(ValueError, match="already exists"):
        publish(model, base, version=3)
    assert publish(model, base, version=10, keep=None).version == 10
    assert list_versions(base) == [2, 3, 10]


def test_failed_export_publishes_nothing(small_model, tmp_path):
    _, model = small_model
    inputs = keras.Input((3,), name="x")
    broken = keras.Model(inputs, keras.layers.Dense(2)(inputs))  # no named outputs
    base = tmp_path / "recs"
    with pytest.raises(ValueError, match="dict of named outputs"):
        publish(broken, base)
    assert os.listdir(base) == []
    info = publish(model, base, xla=True, warmup_batch_sizes=(1,))
    assert info.version == 1 and read_metadata(info.path)["xla"] is True


def test_index_only_refresh_keeps_decoder_weights(tmp_path):
    old_index, new_index = make_index(4), make_index(5, n=250)
    old_model = make_model(old_index)
    decoder = old_model.layers[1].decoder
    new_model = replace_index(old_model, new_index)
    assert new_model.layers[1].decoder is decoder
    base = tmp_path / "recs"
    first = publish(old_model, base)
    second = publish(new_model, base)
    assert (first.version, second.version) == (1, 2)
    old_meta, new_meta = read_metadata(first.path), read_metadata(second.path)
    assert old_meta["indexes"][0]["checksum"] == old_index.checksum
    assert new_meta["indexes"][0]["checksum"] == new_index.checksum
    old_vars, new_vars = _checkpoint(first.path), _checkpoint(second.path)
    decoder_values = {tuple(np.asarray(v).ravel()[:8]) for v in decoder.weights}
    old_decoder = [k for k, v in old_vars.items() if tuple(v.ravel()[:8]) in decoder_values]
    assert len(old_decoder) == len(decoder.weights)
    for key in old_decoder:
        np.testing.assert_array_equal(old_vars[key], new_vars[key])


def test_bad_arguments(small_model, tmp_path):
    _, model = small_model
    with pytest.raises(ValueError, match="`version` must be a positive integer"):
        publish(model, tmp_path, version=0)
    with pytest.raises(ValueError, match="`keep` must be"):
        publish(model, tmp_path, keep=0)


def test_replace_index_checks_the_model(small_model):
    _, model = small_model
    with pytest.raises(ValueError, match="vocab_size is 32 in the index and 16 in the model"):
        replace_index(model, make_index(6, vocab=32))
