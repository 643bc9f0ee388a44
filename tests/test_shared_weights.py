"""A layer's index weights share memory with the index instead of copying it,
and a `.keras` file loads without transient copies of the index.

- `aligned_arrays`: aligned, equal to NumPy's own, zeros unresident;
- on TensorFlow a layer built from a `StaticIndex` holds its arrays' memory
  (no copy), and `index_arrays()` reads them back without one;
- sharing never writes into the index: `set_index`, `set_eligibility` and a
  file load give the layer new values while the index it was built from
  keeps its own (checked against a copy taken first), and the layer answers
  as one built from the new index (the oracle);
- `replace_index(path, index)` answers exactly as `replace_index` of the
  loaded model, with the saved sets carried over or the given ones; inside
  `replacing_index` a load leaves the old index unread (zeros) and reads the
  decoder, and the member item ids and sets only when it carries them; so
  does `load_model_without_index` (its own reader of the file), which leaves
  no scratch copy of the weights behind.
"""

from __future__ import annotations

import os

import keras
import numpy as np
import pytest
from conftest import CONTEXT_VOCAB
from conftest import HISTORY
from conftest import histories

from static_keras import CachedTransformerDecoder
from static_keras import ConstrainedBeamSearch
from static_keras import ConstrainedDecoding
from static_keras import Eligibility
from static_keras import StaticIndex
from static_keras import saving
from static_keras.constraint import index_weights
from static_keras.export import replace_index
from static_keras.export.model_layers import beam_searches
from static_keras.export.refresh import load_model_without_index
from static_keras.index import aligned_arrays
from static_keras.index.catalogue_delta import apply_delta
from static_keras.index.eligibility import EligibilitySets
from static_keras.kernels import execution_plan

ON_TENSORFLOW = keras.config.backend() == "tensorflow"


def _index(seed, n=150, vocab=16, length=3, **kwargs):
    rng = np.random.default_rng(seed)
    rows = np.unique(rng.integers(0, vocab, (n * 3, length)), axis=0)
    rows = rows[rng.permutation(len(rows))[:n]]
    ids = 10**9 + 2 * rng.permutation(n)
    return StaticIndex.build(rows, vocab, item_ids=ids, **kwargs)


def _sets(index, seed):
    rng = np.random.default_rng(seed)
    ids = index.arrays["leaf_item_ids"][: index.num_sequences]
    return EligibilitySets.build(index, {"in_stock": rng.choice(ids, len(ids) // 2, False)})


def _model(index, sets):
    keras.utils.set_random_seed(0)
    decoder = CachedTransformerDecoder(
        index.vocab_size, index.length, context_vocab_size=CONTEXT_VOCAB, hidden_dim=16
    )
    constraint = ConstrainedDecoding(index, eligibility=sets, name="constraint")
    search = ConstrainedBeamSearch(constraint=constraint, decoder=decoder, beam_size=4,
                                   num_results=3)  # fmt: skip
    history = keras.Input((HISTORY,), dtype="int32", name="history")
    return keras.Model(history, search(history))


def _answers(model, inputs):
    (search,) = beam_searches(model)
    plain = search(inputs)
    restricted = search(inputs, eligibility=Eligibility(np.zeros(len(inputs), "int32"), None))
    return [np.asarray(x) for x in (plain["item_ids"], restricted["item_ids"],
                                    plain["scores"], restricted["scores"])]  # fmt: skip


def _assert_same(a, b):
    for x, y in zip(a[:2], b[:2]):
        np.testing.assert_array_equal(x, y)
    for x, y in zip(a[2:], b[2:]):
        np.testing.assert_allclose(x, y, rtol=1e-5)


def _copies(index):
    return {name: np.array(array) for name, array in index.arrays.items()}


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "int32", "int64", "uint32"])
@pytest.mark.parametrize("shape", [(0,), (1,), (1000,), (7, 5)])
def test_aligned_arrays_are_aligned_and_equal_numpy(dtype, shape):
    for make in (aligned_arrays.empty, aligned_arrays.zeros):
        ours = make(shape, dtype)
        assert aligned_arrays.is_aligned(ours) and ours.flags.c_contiguous
        assert ours.shape == shape and ours.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(aligned_arrays.zeros(shape, dtype), np.zeros(shape, dtype))
    np.testing.assert_array_equal(aligned_arrays.full(shape, 3, dtype), np.full(shape, 3, dtype))
    source = np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape)
    copy = aligned_arrays.aligned(source[::-1] if source.ndim == 1 else source.T)
    np.testing.assert_array_equal(copy, source[::-1] if source.ndim == 1 else source.T)
    assert aligned_arrays.is_aligned(copy) and copy.flags.c_contiguous
    kept = aligned_arrays.aligned_copy(source)
    assert aligned_arrays.aligned(kept) is kept  # aligned already: no copy
    swapped = source.astype(source.dtype.newbyteorder(">"))
    native = aligned_arrays.aligned(swapped)
    assert native.dtype.isnative
    np.testing.assert_array_equal(native, source)


def test_the_build_allocates_its_large_arrays_aligned():
    for headroom in (0.0, 0.2):
        index = _index(1, headroom=headroom, dense_levels=1)
        for name in ("tokens", "indptr", "leaf_item_ids"):
            assert aligned_arrays.is_aligned(index.shared_arrays()[name]), (name, headroom)


@pytest.mark.skipif(not ON_TENSORFLOW, reason="TensorFlow shares host memory (DLPack)")
def test_an_index_read_from_its_file_is_aligned_and_a_layer_shares_it(tmp_path):
    """`StaticIndex.load` (what `static-keras publish --index` reads) fills
    aligned buffers: the layer's weights take them as they are, where
    NumPy's own read would cost a copy of every array (GBs at 10^8)."""
    index = _index(4, headroom=0.1, dense_levels=1)
    index.save(tmp_path / "index.npz")
    loaded = StaticIndex.load(tmp_path / "index.npz")
    assert loaded.checksum == index.checksum
    for name, array in loaded.shared_arrays().items():
        assert aligned_arrays.is_aligned(array), name
        np.testing.assert_array_equal(array, index.shared_arrays()[name])
    held = ConstrainedDecoding(loaded).index_arrays()
    for name in ("tokens", "indptr", "leaf_item_ids"):
        assert held[name].ctypes.data == loaded.shared_arrays()[name].ctypes.data, name


@pytest.mark.skipif(not ON_TENSORFLOW, reason="TensorFlow shares host memory (DLPack)")
def test_a_layer_holds_the_index_memory_and_reads_it_back_without_copies():
    index = _index(2, headroom=0.1, dense_levels=1)
    layer = ConstrainedDecoding(index, eligibility=_sets(index, 3))
    shared = index.shared_arrays()
    held = layer.index_arrays()
    for name in ("tokens", "indptr", "leaf_item_ids"):
        assert held[name].ctypes.data == shared[name].ctypes.data, name
        np.testing.assert_array_equal(held[name], index.arrays[name])
    # An array that is not aligned, or read-only, is copied once, and still equal.
    value = execution_plan.current().primitives.weight_value
    odd = np.arange(101, dtype=np.int32)[1:]
    frozen = np.arange(64, dtype=np.int64)
    frozen.flags.writeable = False
    np.testing.assert_array_equal(np.asarray(value(odd)), odd)
    np.testing.assert_array_equal(np.asarray(value(frozen)), frozen)
    odd[0] = -5  # a copy: the tensor keeps the old value
    assert int(np.asarray(value(odd))[0]) == -5


def test_new_values_never_write_into_the_index_the_layer_was_built_from():
    old = _index(4, headroom=0.5, dense_levels=1)
    before = _copies(old)
    sets = _sets(old, 5)
    model = _model(old, sets)
    (search,) = beam_searches(model)
    inputs = histories(6, seed=1)
    expected_old = _answers(model, inputs)
    # set_index: a new catalogue within the capacities (a delta), values only.
    rows = old.sequences()
    ids = old.lookup_item_ids(rows)
    taken = {tuple(r) for r in rows.tolist()}
    free = [r for r in np.ndindex(*(old.vocab_size,) * old.length) if r not in taken]
    added = [free[i] for i in np.random.default_rng(0).choice(len(free), 10, replace=False)]
    fitted = apply_delta(old, add_sequences=added, add_item_ids=np.arange(10) + 7,
                         remove_item_ids=ids[::5])  # fmt: skip
    assert fitted.layout.graph_shape() == old.layout.graph_shape()
    new_sets = _sets(fitted, 7)
    search.constraint.set_index(fitted)
    search.constraint.set_eligibility(new_sets)
    for name, array in old.arrays.items():
        np.testing.assert_array_equal(array, before[name], err_msg=name)
    _assert_same(_answers(model, inputs), _answers(_model(fitted, new_sets), inputs))
    # The old index still answers as before through a layer built over it.
    _assert_same(_answers(_model(old, sets), inputs), expected_old)


def test_a_keras_file_loads_the_same_weights(tmp_path):
    index = _index(8, headroom=0.1)
    sets = _sets(index, 9)
    model = _model(index, sets)
    before = _copies(index)
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = saving.load_model(path)
    inputs = histories(5, seed=2)
    _assert_same(_answers(loaded, inputs), _answers(model, inputs))
    for a, b in zip(model.weights, loaded.weights):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=a.path)
    for name, array in index.arrays.items():
        np.testing.assert_array_equal(array, before[name], err_msg=name)


@pytest.mark.parametrize("given_sets", [False, True])
def test_replace_index_from_a_path_answers_as_from_the_loaded_model(tmp_path, given_sets):
    old = _index(10, headroom=0.1)
    model = _model(old, _sets(old, 11))
    path = str(tmp_path / "m.keras")
    model.save(path)
    new = _index(12)
    eligibility = _sets(new, 13) if given_sets else None
    expected = replace_index(saving.load_model(path), new, eligibility=eligibility)
    got = replace_index(path, new, eligibility=eligibility)
    inputs = histories(6, seed=3)
    _assert_same(_answers(got, inputs), _answers(expected, inputs))
    (got_search,), (expected_search,) = beam_searches(got), beam_searches(expected)
    assert got_search.constraint.eligibility_sets().sizes() == (
        expected_search.constraint.eligibility_sets().sizes()
    )
    assert got_search.constraint.layout == new.layout


def _keras_loader(path, carry_sets):
    with index_weights.replacing_index(carry_sets=carry_sets):
        return saving.load_model(path)


@pytest.mark.parametrize("loader", [_keras_loader, load_model_without_index])
@pytest.mark.parametrize("carry_sets", [False, True])
def test_a_load_that_replaces_the_index_leaves_it_unread(tmp_path, carry_sets, loader):
    index = _index(14, headroom=0.1)
    sets = _sets(index, 15)
    model = _model(index, sets)
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = loader(path, carry_sets=carry_sets)
    assert sorted(os.listdir(tmp_path)) == ["m.keras"]  # no scratch copy left
    (search,) = beam_searches(loaded)
    (saved,) = beam_searches(model)
    constraint = search.constraint
    read = set()
    if carry_sets:  # the member item ids and the sets: what carries them over
        kept = [constraint.index_weights["leaf_item_ids"], *constraint.eligibility_weights.values()]
        read = {id(w) for w in kept}
    for weight, original in zip(constraint.weights, saved.constraint.weights):
        value = np.asarray(weight)
        if id(weight) in read:
            np.testing.assert_array_equal(value, np.asarray(original), err_msg=weight.path)
        else:
            assert not value.any(), weight.path  # never loaded
    for weight, original in zip(search.decoder.weights, saved.decoder.weights):
        np.testing.assert_array_equal(np.asarray(weight), np.asarray(original))
    if carry_sets:
        assert constraint.eligibility_sets().sizes() == sets.sizes()
    # Outside the context a load reads everything again.
    again = beam_searches(saving.load_model(path))[0].constraint
    np.testing.assert_array_equal(again.index_arrays()["tokens"], index.arrays["tokens"])


def test_replace_index_refuses_a_path_that_is_not_a_keras_file(tmp_path):
    new = _index(16)
    not_zip = tmp_path / "index.npy"
    np.save(not_zip, np.arange(3))
    no_config = tmp_path / "other.keras"
    import zipfile

    with zipfile.ZipFile(no_config, "w") as archive:
        archive.writestr("model.weights.h5", b"")
    for path, message in (
        (tmp_path / "missing.keras", "not one"),
        (not_zip, "not one"),
        (no_config, "without Keras's config.json"),
    ):
        with pytest.raises(ValueError, match=f"`model`.*{message}"):
            replace_index(path, new)
        with pytest.raises(ValueError, match="`model`"):
            replace_index(str(path), new)
    assert sorted(os.listdir(tmp_path)) == ["index.npy", "other.keras"]  # nothing written
