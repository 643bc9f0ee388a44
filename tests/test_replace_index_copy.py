"""`replace_index` builds the copy without tracing the search again, and the
copy is the one a traced `clone_model` builds: same output specs, config and
answers.

- a built search's output specs follow from its settings
  (`ConstrainedBeamSearch.compute_output_spec`: the search is not run on
  symbolic inputs), for every `outputs` mode, with and without item ids and
  eligibility sets, string sets, ops downstream of the search, and a search
  called twice; the reference traces the search as Keras does;
- the layer's dense boundary table (walked once per tail state) equals the
  table walked once per code.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
from conftest import CONTEXT_VOCAB
from conftest import HISTORY
from conftest import histories
from keras import ops

from static_keras import CachedTransformerDecoder
from static_keras import ConstrainedBeamSearch
from static_keras import ConstrainedDecoding
from static_keras import StaticIndex
from static_keras.decoding import constrained_beam_search
from static_keras.decoding.beam_search import beam_search
from static_keras.export import replace_index
from static_keras.index import member_ranges
from static_keras.index.dense_eligibility import dense_boundary_table
from static_keras.index.eligibility import EligibilitySets
from static_keras.strings import StringIndex
from static_keras.strings import TokenVocabulary


def _index(seed, n=120, vocab=16, length=3, item_ids=True, **kwargs):
    rng = np.random.default_rng(seed)
    rows = np.unique(rng.integers(0, vocab, (n * 3, length)), axis=0)
    rows = rows[rng.permutation(len(rows))[:n]]
    ids = 10**9 + 2 * rng.permutation(n) if item_ids else None
    return StaticIndex.build(rows, vocab, item_ids=ids, **kwargs)


def _decoder(index):
    keras.utils.set_random_seed(0)
    return CachedTransformerDecoder(
        index.vocab_size, index.length, context_vocab_size=CONTEXT_VOCAB, hidden_dim=16
    )


def _traced_copy(model, index, **kwargs):
    """The reference: `replace_index` with the search's symbolic call traced
    (Keras' own `compute_output_spec`, which runs the whole search)."""
    own = ConstrainedBeamSearch.compute_output_spec
    ConstrainedBeamSearch.compute_output_spec = keras.layers.Layer.compute_output_spec
    try:
        return replace_index(model, index, **kwargs)
    finally:
        ConstrainedBeamSearch.compute_output_spec = own


def _specs(model):
    return [(tuple(x.shape), x.dtype) for x in keras.tree.flatten(model.output)]


def _check_same_copy(model, index, inputs, *, traced, **kwargs):
    calls = []

    def counted(*args, **kw):
        calls.append(args)
        return beam_search(*args, **kw)

    constrained_beam_search.beam_search = counted
    try:
        copy = replace_index(model, index, **kwargs)
    finally:
        constrained_beam_search.beam_search = beam_search
    assert bool(calls) == traced
    reference = _traced_copy(model, index, **kwargs)
    assert _specs(copy) == _specs(reference) == _specs(model)
    assert copy.get_config() == reference.get_config()
    keras.tree.assert_same_structure(copy.output, reference.output)
    assert type(copy.output) is type(reference.output)
    for layer in copy.layers:
        assert "compute_output_spec" not in vars(layer)
    got, want = copy.predict(inputs, verbose=0), reference.predict(inputs, verbose=0)
    for a, b in zip(keras.tree.flatten(got), keras.tree.flatten(want)):
        np.testing.assert_array_equal(a, b)
    return copy


@pytest.mark.parametrize("outputs", ["dict", "scores_and_item_ids", "item_ids"])
def test_the_copy_is_the_traced_one_for_every_output_mode(outputs):
    old, new = _index(0), _index(1, n=90)
    sets = EligibilitySets.build(old, {"half": old.lookup_item_ids(old.sequences())[::2]})
    constraint = ConstrainedDecoding(old, eligibility=sets, name="constraint")
    search = ConstrainedBeamSearch(
        constraint=constraint, decoder=_decoder(old), beam_size=4, num_results=3, outputs=outputs
    )
    history = keras.Input((HISTORY,), dtype="int32", name="history")
    model = keras.Model(history, search(history))
    copy = _check_same_copy(model, new, histories(3), traced=False)
    (layer,) = [la for la in copy.layers if isinstance(la, ConstrainedBeamSearch)]
    assert layer.constraint.eligibility_sets().names == ("half",)
    assert layer.decoder is search.decoder


def test_the_copy_without_item_ids_or_sets_and_with_ops_downstream():
    old, new = _index(2, item_ids=False), _index(3, n=70, item_ids=False)
    search = ConstrainedBeamSearch(old, _decoder(old), beam_size=4)
    history = keras.Input((HISTORY,), dtype="int32", name="history")
    found = search(history)
    best = keras.layers.Dense(2, name="head")(ops.cast(found["tokens"][:, 0], "float32"))
    model = keras.Model(history, {"best": best, "scores": ops.exp(found["scores"])})
    _check_same_copy(model, new, histories(2), traced=False)


def test_the_copy_of_a_string_set_model():
    vocab = TokenVocabulary.from_token_bytes([bytes([65 + i]) for i in range(16)], special=[15])
    old = StringIndex.from_strings(["AB", "ABC", "CD", "E"], vocab, eos_token_id=15, max_length=4)
    new = StringIndex.from_strings(["AC", "D", "EF"], vocab, eos_token_id=15, max_length=4)
    search = ConstrainedBeamSearch(old, _decoder(old), beam_size=3)
    history = keras.Input((HISTORY,), dtype="int32", name="history")
    model = keras.Model(history, search(history))
    _check_same_copy(model, new, histories(2), traced=False)


def test_a_search_called_twice_is_not_traced_either():
    old, new = _index(4), _index(5, n=60)
    search = ConstrainedBeamSearch(old, _decoder(old), beam_size=4, outputs="item_ids")
    a = keras.Input((HISTORY,), dtype="int32", name="a")
    b = keras.Input((HISTORY,), dtype="int32", name="b")
    model = keras.Model([a, b], [search(a), search(b)])
    _check_same_copy(model, new, [histories(2), histories(2, seed=1)], traced=False)


@pytest.mark.parametrize(
    "settings",
    [
        dict(beam_size=4),
        dict(beam_size=4, num_results=2, outputs="scores_and_item_ids"),
        dict(beam_size=2, outputs="item_ids"),
        dict(beam_size=3, length=3),  # unconstrained
    ],
    ids=["dict", "scores_and_item_ids", "item_ids", "unconstrained"],
)
@pytest.mark.parametrize("kind", ["item ids", "no item ids", "strings"])
def test_a_built_search_knows_its_output_specs_as_a_trace_finds_them(settings, kind):
    if kind == "strings":
        vocab = TokenVocabulary.from_token_bytes([bytes([65 + i]) for i in range(16)], special=[15])
        index = StringIndex.from_strings(["AB", "ABC", "E"], vocab, eos_token_id=15, max_length=4)
    else:
        index = _index(6, item_ids=kind == "item ids")
    settings = dict(settings)
    if settings.get("length"):
        settings["length"] = index.length
    if settings.get("outputs", "dict") != "dict" and not index.has_item_ids:
        with pytest.raises(ValueError, match="needs an index with item ids"):
            ConstrainedBeamSearch(index, _decoder(index), **settings)
        return
    search = ConstrainedBeamSearch(
        None if "length" in settings else index, _decoder(index), **settings
    )
    search(histories(2))  # builds the decoder
    context = keras.KerasTensor((None, HISTORY), dtype="int32")
    known = keras.tree.flatten(search.compute_output_spec(context))
    traced = keras.tree.flatten(keras.layers.Layer.compute_output_spec(search, context))
    assert [(x.shape, x.dtype) for x in known] == [(x.shape, x.dtype) for x in traced]


@pytest.mark.parametrize(
    "n, vocab, length, dense_levels",
    [(300, 16, 4, None), (5000, 4, 9, None), (1000, 256, 3, None), (800, 64, 3, 2),
     (20, 2, 2, None), (300, 16, 4, 1), (300, 16, 4, 0), (3000, 64, 1, None)],
)  # fmt: skip
def test_the_dense_boundary_table_walks_each_tail_state_once(n, vocab, length, dense_levels):
    rows = np.random.default_rng(n).integers(0, vocab, (n, length))
    kwargs = {} if dense_levels is None else {"dense_levels": dense_levels}
    index = StaticIndex.build(rows, vocab, on_duplicate_item="first", **kwargs)
    layout, arrays = index.layout, index.arrays
    d = layout.dense_levels
    # Oracle: every one of the V**d + 1 entries walked down on its own.
    if d == 0:
        expected = np.zeros(1, np.int32)
    else:
        tables = member_ranges.dense_first_members(layout, arrays)
        first_state = np.concatenate([[0], np.cumsum(arrays["dense_states"] >= 0)])
        depth = np.full(first_state.size, d, np.int64)
        tables.append(member_ranges.first_tail_members(layout, arrays, first_state, depth))
        expected = np.concatenate(tables).astype(np.int32)
    table = dense_boundary_table(layout, arrays)
    assert table.dtype == expected.dtype
    np.testing.assert_array_equal(table, expected)
