"""The last dense step read as CSR rows (`layers.dense_edge_rows`): the rows
against the NumPy index, and a layer with them against one without."""

import itertools

import numpy as np
import pytest
from decoding_oracles import compiled_modes
from keras import ops

from static_keras import ConstrainedDecoding
from static_keras import Eligibility
from static_keras import StaticIndex
from static_keras import beam_search
from static_keras.constraint import dense_edge_rows
from static_keras.index.eligibility import EligibilitySets
from static_keras.index.eligibility import MemberCatalogue


def _index(seed, dense_levels, vocab=9, length=4, n=150):
    rng = np.random.default_rng(seed)
    seqs = rng.integers(0, vocab, size=(n, length))
    seqs[:, 0] = rng.integers(0, 3, n)  # a few wide codes, many absent ones
    return StaticIndex.build(seqs, vocab, dense_levels=dense_levels, item_ids=np.arange(n),
                             on_duplicate_item="first")  # fmt: skip


def _layer(index, rows: bool, monkeypatch, **kwargs):
    """A layer with the edge rows (any width) or without them."""
    with monkeypatch.context() as patch:
        patch.setattr(dense_edge_rows, "WIDTH_FRACTION", 1.0 if rows else 0.0)
        layer = ConstrainedDecoding(index, **kwargs)
    assert (dense_edge_rows.POINTERS in layer.derived_index_weights) == (
        rows and index.layout.dense_levels > 0
    )
    return layer


@pytest.mark.parametrize("dense_levels", [1, 2, 3, 4])
def test_rows_are_the_allowed_tokens_and_states_of_each_code(dense_levels):
    index = _index(dense_levels, dense_levels)
    layout = index.layout
    arrays = dense_edge_rows.arrays(layout, index.arrays["dense_states"])
    pointers, tokens = arrays[dense_edge_rows.POINTERS], arrays[dense_edge_rows.TOKENS]
    step, vocab = dense_levels - 1, layout.vocab_size
    codes = np.arange(vocab**step)
    # Each code of depth d - 1 as its prefix (base-V digits, most significant first).
    prefixes = (codes[:, None] // vocab ** np.arange(step - 1, -1, -1)[None, :]) % vocab
    allowed = index.allowed_tokens(prefixes.astype(np.int32))
    assert pointers[0] == 0 and pointers[-1] == layout.level_sizes[dense_levels]
    for code in codes:
        row = tokens[pointers[code] : pointers[code + 1]]
        assert row.tolist() == np.flatnonzero(allowed[code]).tolist()
        if row.size:
            full = np.concatenate([np.repeat(prefixes[code : code + 1], row.size, 0),
                                   row[:, None]], axis=1)  # fmt: skip
            states = index.walk(full.astype(np.int32))
            want = layout.dense_head_states + np.arange(pointers[code], pointers[code + 1])
            np.testing.assert_array_equal(states, want)


def test_the_layer_keeps_rows_only_where_they_are_narrow():
    narrow = _index(0, 2, vocab=64, n=40)  # at most 40 children of a code, V = 64
    wide = StaticIndex.build(np.stack(np.meshgrid(*[np.arange(4)] * 3), -1).reshape(-1, 3), 4,
                             dense_levels=2)  # fmt: skip
    assert dense_edge_rows.edge_row_step(narrow.layout) == 1
    assert dense_edge_rows.edge_row_step(wide.layout) is None  # 4 of 4 tokens
    assert dense_edge_rows.edge_row_step(_index(0, 0).layout) is None
    assert ConstrainedDecoding(narrow).derived_index_weights
    assert not ConstrainedDecoding(wide).derived_index_weights


@pytest.mark.parametrize("dense_levels", [1, 2, 3])
def test_candidates_with_rows_equal_candidates_without(dense_levels, monkeypatch):
    index = _index(10 + dense_levels, dense_levels)
    with_rows = _layer(index, True, monkeypatch)
    without = _layer(index, False, monkeypatch)
    rng = np.random.default_rng(dense_levels)
    step = dense_levels - 1
    prefixes = np.concatenate([np.unique(index.sequences()[:, :step], axis=0),
                               rng.integers(0, 9, (6, step))]).astype(np.int32)  # fmt: skip
    states = np.asarray(index.walk(prefixes), np.int32) if step else np.zeros(1, np.int32)
    states = np.concatenate([states, [-1]]).astype(np.int32)  # a dead row too
    logits = rng.normal(size=(states.size, 9)).astype("float32")
    logits[:, 4] = logits[:, 2]  # ties keep the lower token first either way
    for top_k in (None, 1, 3):
        got = [np.asarray(x) for x in with_rows.candidates(logits, states, step, dense_top_k=top_k)]
        want = [np.asarray(x) for x in without.candidates(logits, states, step, dense_top_k=top_k)]
        if top_k is None or top_k >= index.step_widths[step]:
            # Uncapped rows come in token order, as at a tail step; mask rows
            # ranked: the same candidates, in (score desc, token) order.
            order = np.array([
                sorted(range(row.size), key=lambda j: (-row[j], tokens[j] % 99))
                for row, tokens in zip(got[0], got[1])
            ])  # fmt: skip
            got = [np.take_along_axis(x, order, axis=1) for x in got]
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)
    # The mask and the whole-vocabulary scores still come from the mask rows.
    assert with_rows.vocabulary_scores(logits, states, step) is None
    np.testing.assert_array_equal(
        np.asarray(with_rows.mask_logits(logits, states, step)),
        np.asarray(without.mask_logits(logits, states, step)),
    )


@pytest.mark.parametrize("dense_levels", [1, 2])
def test_beam_search_with_rows_equals_without(dense_levels, monkeypatch):
    index = _index(20 + dense_levels, dense_levels)
    table = ops.convert_to_tensor(np.random.default_rng(3).normal(size=(97, 9)), "float32")

    def step_fn(prefix, state):
        code = ops.sum(prefix * (ops.arange(ops.shape(prefix)[1]) * 7 + 3), axis=1)
        return ops.take(table, code % 97, axis=0), state

    sets = EligibilitySets.build(index, {"third": np.arange(0, 150, 3)})
    catalogue = MemberCatalogue.from_index(index)
    excluded = catalogue.exclusion_members(np.array([[5, 7], [-1, -1]]))
    layers = [_layer(index, rows, monkeypatch, eligibility=sets) for rows in (True, False)]
    for beam, per_beam in ((200, None), (12, 2), (5, None)):
        for eligibility in (None, Eligibility(np.array([0, -1], np.int32), excluded)):
            outs = [
                beam_search(
                    layer, step_fn, 2, beam, dense_top_k=per_beam, eligibility=eligibility
                )  # fmt: skip
                for layer in layers
            ]
            for key in ("tokens", "item_ids"):
                np.testing.assert_array_equal(np.asarray(outs[0][key]), np.asarray(outs[1][key]))
            np.testing.assert_allclose(
                np.asarray(outs[0]["scores"]), np.asarray(outs[1]["scores"]), rtol=1e-6
            )
    # Compiled by XLA, a binding cap is the search's own (`capped_top_k` over
    # the rows' uncapped candidates, or over the mask rows' whole matrix):
    # the same beams as the per-beam top-k run eagerly.
    want = beam_search(layers[1], step_fn, 2, 12, dense_top_k=2)
    for (mode, wrap), layer in itertools.product(list(compiled_modes())[1:], layers):
        out = wrap(lambda: beam_search(layer, step_fn, 2, 12, dense_top_k=2))()
        for key in ("tokens", "item_ids"):
            np.testing.assert_array_equal(np.asarray(out[key]), np.asarray(want[key]), mode)
    # A beam as wide as the set returns every member (exact, no eligibility).
    out = beam_search(layers[0], step_fn, 1, 200)
    assert int((np.asarray(out["item_ids"])[0] >= 0).sum()) == index.num_sequences


def test_a_layer_saved_before_the_rows_loads_with_them(monkeypatch):
    """Layers saved before the edge rows lack those two weights (and, older
    still, `dense_member_codes`): loading derives them from what was saved."""
    index = _index(4, 2, vocab=32, n=60)
    sets = EligibilitySets.build(index, {"a": np.arange(9)})
    layer = _layer(index, True, monkeypatch, eligibility=sets)
    weights = list(layer.weights)
    codes = layer.member_range_weights["dense_member_codes"]
    derived = [*layer.derived_index_weights.values(), codes]
    store = {}
    layer.save_own_variables(store)
    for dropped in (derived[:2], derived):
        older = [store[str(i)] for i, w in enumerate(weights) if not any(w is d for d in dropped)]
        fresh = ConstrainedDecoding.from_config(layer.get_config())
        fresh.load_own_variables({str(i): value for i, value in enumerate(older)})
        for a, b in zip(fresh.weights, weights):
            np.testing.assert_array_equal(ops.convert_to_numpy(a), ops.convert_to_numpy(b))
