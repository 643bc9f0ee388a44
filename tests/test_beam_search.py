"""Constrained beam search against exhaustive ranking of the valid set."""

import itertools
import os
import textwrap

import keras
import numpy as np
import pytest
from backend_subprocess import run_under
from decoding_oracles import TABLE_ROWS
from decoding_oracles import compiled_modes
from decoding_oracles import exhaustive_ranking
from decoding_oracles import prefix_logits
from decoding_oracles import random_table
from keras import ops

from static_keras import CachedTransformerDecoder
from static_keras import ConstrainedBeamSearch
from static_keras import StaticIndex
from static_keras import beam_search
from static_keras import constraint_for
from static_keras.layers import DecodingConstraint


def _check_exact(index, table, out, batch_size):
    expected_tokens, expected_scores = exhaustive_ranking(index.sequences(), table)
    n = len(expected_tokens)
    tokens, scores = np.asarray(out["tokens"]), np.asarray(out["scores"])
    for b in range(batch_size):
        np.testing.assert_array_equal(tokens[b, :n], expected_tokens)
        np.testing.assert_allclose(scores[b, :n], expected_scores, rtol=1e-5, atol=1e-5)
        assert np.all(tokens[b, n:] == -1)
        assert np.all(np.isneginf(scores[b, n:]))


@pytest.mark.parametrize(
    "n,vocab,length,dense_levels",
    [
        (1, 5, 3, "auto"),
        (12, 6, 3, 0),
        (12, 6, 3, 1),
        (12, 6, 3, 3),
        (40, 4, 4, 2),
        (25, 30, 2, 1),
        (9, 1, 4, 2),  # V = 1: one sequence, all zeros
        (15, 40, 1, 0),  # L = 1
        (15, 40, 1, 1),
    ],
)
def test_beam_at_least_n_equals_exhaustive_ranking(n, vocab, length, dense_levels):
    rng = np.random.default_rng(n * 100 + vocab)
    seqs = rng.integers(0, vocab, size=(n, length))
    index = StaticIndex.build(seqs, vocab, dense_levels=dense_levels)
    table = random_table(vocab, seed=n)
    logits_of = prefix_logits(ops.convert_to_tensor(table))
    beam = index.num_sequences + 3  # larger than the set: padding at the end
    out = beam_search(index, lambda p, s: (logits_of(p), s), batch_size=2, beam_size=beam)
    assert np.asarray(out["tokens"]).shape == (2, beam, length)
    assert np.asarray(out["tokens"]).dtype == np.int32
    assert np.asarray(out["scores"]).dtype == np.float32
    _check_exact(index, table, out, batch_size=2)


def test_every_token_at_every_level_and_shared_prefixes():
    grid = np.stack(np.meshgrid(*[np.arange(3)] * 3, indexing="ij"), -1).reshape(-1, 3)
    shared = np.concatenate([np.zeros((5, 5), int), np.arange(5)[:, None]], axis=1)
    for seqs, vocab in ((grid, 3), (shared, 5)):
        index = StaticIndex.build(np.concatenate([seqs, seqs]), vocab)  # with duplicates
        table = random_table(vocab, seed=1)
        logits_of = prefix_logits(ops.convert_to_tensor(table))
        out = beam_search(index, lambda p, s: (logits_of(p), s), batch_size=1, beam_size=len(seqs))
        _check_exact(index, table, out, batch_size=1)


def test_small_beam_results_are_valid_distinct_and_sorted():
    rng = np.random.default_rng(3)
    seqs = rng.integers(0, 50, size=(3000, 5))
    index = StaticIndex.build(seqs, 50, item_ids=np.arange(3000), on_duplicate_item="first")
    table = random_table(50, seed=2)
    logits_of = prefix_logits(ops.convert_to_tensor(table))
    out = beam_search(
        index, lambda p, s: (logits_of(p), s), batch_size=3, beam_size=16, num_results=10
    )
    tokens, scores, ids = (np.asarray(out[k]) for k in ("tokens", "scores", "item_ids"))
    assert tokens.shape == (3, 10, 5) and ids.shape == (3, 10)
    flat = tokens.reshape(-1, 5)
    assert index.contains(flat).all()
    np.testing.assert_array_equal(ids.reshape(-1), index.lookup_item_ids(flat))
    for b in range(3):
        assert len({tuple(row) for row in tokens[b]}) == 10
        assert np.all(np.diff(scores[b]) <= 0)
    # The best result is the true best valid sequence (it survives any beam).
    best_tokens, _ = exhaustive_ranking(index.sequences(), table)
    np.testing.assert_array_equal(tokens[0, 0], best_tokens[0])


def test_state_is_reordered_by_parent_beam():
    """A state that records each chosen token must always equal the prefix."""
    index = StaticIndex.build(np.random.default_rng(4).integers(0, 6, (200, 4)), 6)
    logits_of = prefix_logits(ops.convert_to_tensor(random_table(6, seed=3)))
    mismatches = []

    def step_fn(prefix, history):
        t = prefix.shape[1]
        if t >= 2:  # tokens recorded by earlier calls, after reordering
            recorded = np.asarray(history)[:, : t - 1]
            mismatches.append(int(np.sum(recorded != np.asarray(prefix)[:, : t - 1])))
        if t >= 1:
            history = ops.slice_update(history, (0, t - 1), prefix[:, t - 1 :])
        return logits_of(prefix), history

    history = ops.zeros((2 * 8, 4), "int32")
    out = beam_search(index, step_fn, batch_size=2, beam_size=8, initial_state=history)
    assert mismatches == [0, 0]
    assert index.contains(np.asarray(out["tokens"]).reshape(-1, 4)).all()


def test_first_step_calls_the_decoder_on_one_row_per_batch_row():
    """Step 0 has one live beam per batch row: the decoder gets B rows there
    and R after it, and a state of B rows decodes as its R-row repeat does."""
    index = StaticIndex.build(np.random.default_rng(5).integers(0, 6, (150, 4)), 6)
    table = ops.convert_to_tensor(random_table(6, seed=4))
    calls = []

    def step_fn(prefix, state):
        calls.append((prefix.shape[0], ops.shape(state)[0]))
        # The logits depend on the row's own state, so a misaligned state
        # (wrong row at step 0, wrong parent later) changes the result.
        code = ops.sum(ops.cast(prefix, "int32"), axis=1) * 5 + state[:, 0] * 11 + prefix.shape[1]
        return ops.take(table, code % TABLE_ROWS, axis=0), state

    per_batch = ops.convert_to_tensor(np.array([[1], [4], [9]], "int32"))
    out = beam_search(index, step_fn, batch_size=3, beam_size=5, initial_state=per_batch)
    assert calls == [(3, 3)] + [(15, 15)] * 3
    repeated = ops.convert_to_tensor(np.repeat(np.array([[1], [4], [9]], "int32"), 5, axis=0))
    again = beam_search(index, step_fn, batch_size=3, beam_size=5, initial_state=repeated)
    np.testing.assert_array_equal(np.asarray(out["tokens"]), np.asarray(again["tokens"]))
    np.testing.assert_array_equal(np.asarray(out["scores"]), np.asarray(again["scores"]))
    # Each batch row alone (batch 1, its own state) gives the same beams.
    for b, row in enumerate([1, 4, 9]):
        alone = beam_search(
            index, step_fn, batch_size=1, beam_size=5,
            initial_state=ops.convert_to_tensor(np.array([[row]], "int32")),
        )  # fmt: skip
        np.testing.assert_array_equal(np.asarray(alone["tokens"])[0], np.asarray(out["tokens"])[b])
    with pytest.raises(ValueError, match="initial_state"):
        beam_search(
            index, step_fn, batch_size=3, beam_size=5,
            initial_state=ops.zeros((7, 1), "int32"),
        )  # fmt: skip


@pytest.mark.parametrize("dense_levels", [0, 2])
def test_beam_one_is_greedy_over_the_allowed_tokens(dense_levels):
    """With beam 1 no row ever moves (the search skips the parent gathers):
    each batch row, with its own state, must pick its best allowed token at
    every step, and a state that records the tokens must equal the prefix."""
    seqs = np.random.default_rng(6).integers(0, 7, (300, 4))
    index = StaticIndex.build(seqs, 7, dense_levels=dense_levels)
    layer = constraint_for(index)  # weights made outside the compiled functions
    table = random_table(7, seed=5)
    rows = np.array([2, 5, 8, 3], "int32")
    weights = np.array([3, 5, 7, 11])
    mismatches = []

    def step_fn(prefix, state):
        row, history = state
        t = prefix.shape[1]
        if t:  # the tokens the state recorded, one row per beam, are the prefix
            mismatches.append(ops.sum(ops.cast(history[:, : t - 1] != prefix[:, :-1], "int32")))
            history = ops.slice_update(history, (0, t - 1), prefix[:, t - 1 :])
        code = ops.sum(prefix * weights[:t], axis=1) + row * 13 if t else row * 13
        return ops.take(ops.convert_to_tensor(table), code % 97, axis=0), (row, history)

    def search(batch):  # batch 1: one row, which JAX reads as runs (`gather.take_runs`)
        state = (ops.convert_to_tensor(rows[:batch]), ops.zeros((batch, 4), "int32"))
        out = beam_search(layer, step_fn, batch_size=batch, beam_size=1, initial_state=state)
        return out["tokens"][:, 0], out["scores"][:, 0], ops.stack(mismatches[-3:])

    for (mode, wrap), batch in itertools.product(compiled_modes(), (4, 1)):
        tokens, scores, wrong = (np.asarray(x) for x in wrap(lambda: search(batch))())
        assert not wrong.any(), mode
        for b, row in enumerate(rows[:batch]):
            prefix, total = np.zeros(0, int), 0.0
            for t in range(4):
                allowed = np.unique(seqs[(seqs[:, :t] == prefix).all(1), t])
                logits = table[(np.sum(prefix * weights[:t]) + row * 13) % 97]
                log_probs = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
                best = allowed[np.argmax(logits[allowed])]
                prefix, total = np.append(prefix, best), total + log_probs[best]
            np.testing.assert_array_equal(tokens[b], prefix, err_msg=mode)
            np.testing.assert_allclose(scores[b], total, rtol=1e-5, err_msg=mode)


def _cached_setup(seed=0, vocab=12, length=4, n=400):
    rng = np.random.default_rng(seed)
    seqs = rng.integers(0, vocab, size=(n, length))
    index = StaticIndex.build(seqs, vocab, item_ids=np.arange(n) + 7, on_duplicate_item="first")
    keras.utils.set_random_seed(seed)
    decoder = CachedTransformerDecoder(vocab, length, context_vocab_size=30, hidden_dim=16)
    context = rng.integers(0, 30, size=(3, 6)).astype("int32")
    return index, decoder, context


def test_transformer_cache_matches_full_recompute():
    index, decoder, context = _cached_setup()
    rng = np.random.default_rng(1)
    state = decoder.initial_state(context)
    prefix = np.zeros((3, 0), "int32")
    for _ in range(index.length):
        logits, state = decoder(prefix, state)
        full = decoder.full_logits(context, prefix)
        np.testing.assert_allclose(np.asarray(logits), np.asarray(full), atol=1e-5)
        prefix = np.concatenate([prefix, rng.integers(0, 12, (3, 1)).astype("int32")], 1)


def test_cached_decoder_beam_search_equals_uncached():
    """With the KV cache reordered by parent beam, caching changes nothing."""
    index, decoder, context = _cached_setup()
    search = ConstrainedBeamSearch(index, decoder, beam_size=6, num_results=4)
    cached = search(context)

    def full_step(prefix, state):
        return decoder.full_logits(state, prefix), state

    uncached = beam_search(
        index, full_step, batch_size=3, beam_size=6, num_results=4,
        initial_state=ops.convert_to_tensor(np.repeat(context, 6, axis=0)),
    )  # fmt: skip
    np.testing.assert_array_equal(np.asarray(cached["tokens"]), np.asarray(uncached["tokens"]))
    np.testing.assert_allclose(
        np.asarray(cached["scores"]), np.asarray(uncached["scores"]), atol=1e-5
    )
    np.testing.assert_array_equal(
        np.asarray(cached["item_ids"]),
        index.lookup_item_ids(np.asarray(cached["tokens"]).reshape(-1, 4)).reshape(3, 4),
    )


@pytest.mark.slow  # 17 s: the other Keras-file round trips run by default
def test_functional_model_keras_round_trip_and_batch_sizes(tmp_path):
    index, decoder, context = _cached_setup(seed=2)
    inputs = keras.Input((6,), dtype="int32")
    outputs = ConstrainedBeamSearch(index, decoder, beam_size=5, num_results=3)(inputs)
    model = keras.Model(inputs, outputs)
    assert model.get_layer(index=1).trainable_weights  # the decoder trains
    constraint_weights = model.get_layer(index=1).constraint.trainable_weights
    assert constraint_weights == []
    path = os.path.join(tmp_path, "search.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    for batch in (context[:1], context):
        expected = model.predict(batch, verbose=0)
        actual = loaded.predict(batch, verbose=0)
        assert set(expected) == {"tokens", "scores", "item_ids"}
        for key in expected:
            np.testing.assert_array_equal(expected[key], actual[key])
        assert expected["tokens"].shape == (len(batch), 3, 4)


def test_scores_and_item_ids_outputs_like_keras_rs(tmp_path):
    index, decoder, context = _cached_setup(seed=3)
    inputs = keras.Input((6,), dtype="int32")
    full = ConstrainedBeamSearch(index, decoder, beam_size=5, num_results=3)
    pair = ConstrainedBeamSearch(
        constraint=full.constraint, decoder=decoder, beam_size=5, num_results=3,
        outputs="scores_and_item_ids",
    )  # fmt: skip
    only = ConstrainedBeamSearch(index, decoder, beam_size=5, num_results=3, outputs="item_ids")
    expected = full(context)
    scores, ids = pair(context)
    np.testing.assert_array_equal(np.asarray(scores), np.asarray(expected["scores"]))
    np.testing.assert_array_equal(np.asarray(ids), np.asarray(expected["item_ids"]))
    np.testing.assert_array_equal(np.asarray(only(context)), np.asarray(expected["item_ids"]))
    model = keras.Model(inputs, pair(inputs))
    model.save(os.path.join(tmp_path, "pair.keras"))
    loaded = keras.saving.load_model(os.path.join(tmp_path, "pair.keras"))
    for a, b in zip(model.predict(context, verbose=0), loaded.predict(context, verbose=0)):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="`outputs` must be one of"):
        ConstrainedBeamSearch(index, decoder, outputs="ids")
    plain = StaticIndex.build(index.sequences(), index.vocab_size)
    with pytest.raises(ValueError, match="needs an index with item ids"):
        ConstrainedBeamSearch(plain, decoder, outputs="item_ids")
    with pytest.raises(ValueError, match="needs an index with item ids; this search has no index"):
        ConstrainedBeamSearch(decoder=decoder, length=4, outputs="scores_and_item_ids")


@pytest.mark.skipif(keras.config.backend() != "tensorflow", reason="jit_compile is TF's")
def test_eager_equals_xla_compiled_search():
    import tensorflow as tf

    index, decoder, context = _cached_setup(seed=3)
    search = ConstrainedBeamSearch(index, decoder, beam_size=7, num_results=5)
    eager = search(context)
    compiled = tf.function(search, jit_compile=True)(tf.constant(context))
    np.testing.assert_array_equal(np.asarray(eager["tokens"]), compiled["tokens"].numpy())
    np.testing.assert_allclose(np.asarray(eager["scores"]), compiled["scores"].numpy(), atol=1e-5)
    np.testing.assert_array_equal(np.asarray(eager["item_ids"]), compiled["item_ids"].numpy())


def test_unconstrained_search_is_plain_top_k():
    table = random_table(5, seed=4)
    logits_of = prefix_logits(ops.convert_to_tensor(table))
    grid = np.stack(np.meshgrid(*[np.arange(5)] * 3, indexing="ij"), -1).reshape(-1, 3)
    out = beam_search(None, lambda p, s: (logits_of(p), s), batch_size=1, beam_size=125, length=3)
    expected_tokens, expected_scores = exhaustive_ranking(grid, table)
    np.testing.assert_array_equal(np.asarray(out["tokens"])[0], expected_tokens)
    np.testing.assert_allclose(np.asarray(out["scores"])[0], expected_scores, atol=1e-5)


def _per_beam_top_k_oracle(sequences, vocab, length, table, beam, per_beam, dense_levels):
    """Beam search in plain Python: the first step keeps the best `beam`
    tokens of its one beam; later steps below `dense_levels` keep each
    beam's best `per_beam` valid tokens, deeper steps all valid tokens; the
    best `beam` extensions survive. `sequences=None`: unconstrained."""
    weights = np.array([31, 17, 13, 7, 5, 3, 2, 11])
    log_probs = table - table.max(1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(1, keepdims=True))
    beams = [((), 0.0)]
    for t in range(length):
        pool = []
        for prefix, score in beams:
            code = int(np.dot(np.array(prefix, np.int64), weights[:t])) + 29 * t
            row = log_probs[code % TABLE_ROWS]
            if sequences is None:
                valid = range(vocab)
            else:
                valid = {int(s[t]) for s in sequences if tuple(s[:t]) == prefix}
            options = sorted(valid, key=lambda token: -row[token])
            if t == 0:
                options = options[:beam]
            elif t < dense_levels:
                options = options[:per_beam]
            pool.extend((prefix + (token,), score + row[token]) for token in options)
        beams = sorted(pool, key=lambda item: -item[1])[:beam]
    return np.array([p for p, _ in beams]), np.array([s for _, s in beams], np.float32)


def test_tokens_per_beam_applies_per_beam_after_the_first_step():
    # The reference setting: beam 70, 30 tokens per beam at dense steps. 50
    # sequences with 50 distinct first tokens all come back (the first step
    # keeps 70 candidates, not 30).
    rng = np.random.default_rng(7)
    vocab, length = 64, 4
    seqs = np.concatenate(
        [rng.permutation(vocab)[:50, None], rng.integers(0, vocab, (50, length - 1))], axis=1
    )
    index = StaticIndex.build(seqs, vocab, dense_levels=2)
    table = random_table(vocab, seed=7)
    logits_of = prefix_logits(ops.convert_to_tensor(table))
    out = beam_search(
        index, lambda p, s: (logits_of(p), s), batch_size=2, beam_size=70, dense_top_k=30
    )
    _check_exact(index, table, out, batch_size=2)
    # Wider rows than 30 at the dense step: equal to the per-beam oracle.
    seqs = np.concatenate([rng.integers(0, 3, (400, 1)), rng.integers(0, vocab, (400, 2))], 1)
    index = StaticIndex.build(seqs, vocab, dense_levels=2)
    tokens, scores = _per_beam_top_k_oracle(index.sequences(), vocab, 3, table, 40, 5, 2)
    # Compiled (XLA), the cap is applied by rankings of the whole batch row
    # (`capped_top_k`); op by op, by a top-k per beam. Both are the oracle.
    layer = constraint_for(index)  # weights made outside the compiled function
    assert not layer.derived_index_weights  # rows of ~56 of 64 tokens: the mask rows
    for mode, wrap in compiled_modes():
        out = wrap(
            lambda: beam_search(
                layer, lambda p, s: (logits_of(p), s), batch_size=1, beam_size=40, dense_top_k=5
            )
        )()
        np.testing.assert_array_equal(np.asarray(out["tokens"])[0], tokens, err_msg=mode)
        np.testing.assert_allclose(np.asarray(out["scores"])[0], scores, atol=1e-5)


class _CandidatesOnly(DecodingConstraint):
    """A layer's candidates without its whole-vocabulary scores: forces the
    per-beam top-k path at dense steps."""

    def __init__(self, layer):
        self.layer = layer
        self.length = layer.length
        self.has_item_ids = layer.has_item_ids

    def candidates(self, log_probs, states, step, dense_top_k=None):
        return self.layer.candidates(log_probs, states, step, dense_top_k=dense_top_k)

    def item_ids(self, states):
        return self.layer.item_ids(states)


@pytest.mark.parametrize("dense_levels", [0, 1, 2, 3])
def test_whole_vocabulary_ranking_equals_per_beam_candidates(dense_levels):
    # Dense steps with no binding cap rank every (beam, token) of a batch row
    # in one top-k; that must be the per-beam top-k's result exactly, also
    # when the beam is narrower than the set.
    from static_keras import ConstrainedDecoding

    rng = np.random.default_rng(dense_levels)
    vocab = 12
    seqs = rng.integers(0, vocab, size=(300, 4))
    layer = ConstrainedDecoding(
        StaticIndex.build(seqs, vocab, dense_levels=dense_levels, item_ids=np.arange(300),
                          on_duplicate_item="first")
    )  # fmt: skip
    logits_of = prefix_logits(ops.convert_to_tensor(random_table(vocab, seed=3)))
    for beam, per_beam in ((7, None), (7, 9), (40, None)):
        outs = [
            beam_search(c, lambda p, s: (logits_of(p), s), 3, beam, dense_top_k=per_beam)
            for c in (layer, _CandidatesOnly(layer))
        ]
        for key in ("tokens", "item_ids"):
            np.testing.assert_array_equal(np.asarray(outs[0][key]), np.asarray(outs[1][key]))
        np.testing.assert_allclose(
            np.asarray(outs[0]["scores"]), np.asarray(outs[1]["scores"]), rtol=1e-6
        )
        assert layer.vocabulary_scores(np.zeros((1, vocab)), np.zeros(1), 0) is not None or (
            dense_levels == 0
        )


def test_unconstrained_baseline_uses_the_same_tokens_per_beam():
    vocab = 9
    table = random_table(vocab, seed=5)
    logits_of = prefix_logits(ops.convert_to_tensor(table))
    for (beam, per_beam), (mode, wrap) in itertools.product(
        ((12, 3), (20, 9), (5, 2)), compiled_modes()
    ):
        out = wrap(
            lambda: beam_search(
                None,
                lambda p, s: (logits_of(p), s),
                batch_size=1,
                beam_size=beam,
                length=3,
                dense_top_k=per_beam,
            )
        )()
        tokens, scores = _per_beam_top_k_oracle(None, vocab, 3, table, beam, per_beam, 3)
        np.testing.assert_array_equal(np.asarray(out["tokens"])[0], tokens, err_msg=mode)
        np.testing.assert_allclose(np.asarray(out["scores"])[0], scores, atol=1e-5)


def test_the_constraints_old_top_k_keyword_still_works_with_a_warning():
    """`dense_top_k` is the setting's one name, from `beam_search` to the
    constraint's step methods; `top_k`, its old name there, still works."""
    rng = np.random.default_rng(3)
    index = StaticIndex.build(rng.integers(0, 6, size=(40, 3)), 6, dense_levels=2)
    layer = constraint_for(index)
    logits = rng.normal(size=(4, 6)).astype("float32")
    states = np.zeros(4, "int32")

    def same(got, want):
        for g, w in zip(got, want):
            np.testing.assert_array_equal(np.asarray(g), np.asarray(w))

    want = layer.candidates(logits, states, 0, dense_top_k=3)
    assert np.asarray(want[0]).shape == (4, 3)
    with pytest.warns(DeprecationWarning, match="pass `dense_top_k=...`"):
        same(layer.candidates(logits, states, 0, top_k=3), want)
    with pytest.warns(DeprecationWarning, match="layer"):
        same(layer(logits, states, step=0, top_k=3), want)
    with pytest.warns(DeprecationWarning, match="num_candidates"):
        assert layer.num_candidates(0, top_k=3) == layer.num_candidates(0, dense_top_k=3) == 3
    with pytest.warns(DeprecationWarning, match="candidate_tokens"):
        same(
            layer.candidate_tokens(logits, states, 0, top_k=3),
            layer.candidate_tokens(logits, states, 0, dense_top_k=3),
        )
    proposal = layer.propose(logits, states, 0, dense_top_k=3)
    with pytest.warns(DeprecationWarning, match="propose"):
        old = layer.propose(logits, states, 0, top_k=3)
    same((old.scores, old.tokens), (proposal.scores, proposal.tokens))
    with pytest.raises(TypeError, match="deprecated name"):
        layer.candidates(logits, states, 0, dense_top_k=3, top_k=3)


def test_bad_arguments():
    index = StaticIndex.build([[0, 1]], 2)

    def step(p, s):
        return ops.zeros((ops.shape(p)[0], 2)), s

    with pytest.raises(ValueError, match="`beam_size` must be a positive integer"):
        beam_search(index, step, 1, 0)
    with pytest.raises(ValueError, match="`num_results` must be at most"):
        beam_search(index, step, 1, 2, num_results=3)
    with pytest.raises(ValueError, match="needs `length`"):
        beam_search(None, step, 1, 2)
    with pytest.raises(ValueError, match="`batch_size` must be a positive integer"):
        beam_search(index, step, 0, 2)
    with pytest.raises(ValueError, match="needs a `decoder`"):
        ConstrainedBeamSearch(index, None)
    with pytest.raises(ValueError, match="not both"):
        ConstrainedBeamSearch(index, keras.layers.Identity(), length=2)


_JAX_SCRIPT = textwrap.dedent(
    """
    import jax, numpy as np
    from static_keras import StaticIndex, CachedTransformerDecoder, ConstrainedBeamSearch
    import keras
    rng = np.random.default_rng(0)
    seqs = rng.integers(0, 9, size=(150, 4))
    index = StaticIndex.build(seqs, 9, item_ids=np.arange(150), on_duplicate_item="first",
                              dense_levels=2)
    decoder = CachedTransformerDecoder(9, 4, context_vocab_size=20, hidden_dim=16)
    search = ConstrainedBeamSearch(index, decoder, beam_size=6, num_results=4)
    context = rng.integers(0, 20, size=(2, 5)).astype("int32")
    eager = search(context)
    jitted = jax.jit(lambda c: search(c))(context)
    for key in ("tokens", "item_ids"):
        assert np.array_equal(np.asarray(eager[key]), np.asarray(jitted[key])), key
    tokens = np.asarray(eager["tokens"]).reshape(-1, 4)
    assert index.contains(tokens).all()
    assert np.array_equal(index.lookup_item_ids(tokens), np.asarray(eager["item_ids"]).reshape(-1))
    print("jax ok")
    """
)


@pytest.mark.slow  # a JAX subprocess: 20 s on 2 cores; other JAX tests stay in the default run
def test_jax_backend():
    pytest.importorskip("jax", reason="JAX is an optional backend (pip install .[jax])")
    run_under("jax", _JAX_SCRIPT, "jax ok")


class _DenseAutomaton(DecodingConstraint):
    """A toy variable-length constraint: a dense [states, V] transition table.

    Members are token sequences ending with EOS; used to test the beam search's
    EOS handling independently of any index type.
    """

    def __init__(self, members, vocab, eos, max_length):
        table = {(): 0}
        for member in members:
            for t in range(1, len(member) + 1):
                table.setdefault(tuple(member[:t]), len(table))
        transitions = np.full((len(table), vocab), -1, np.int32)
        for prefix, state in table.items():
            if prefix:
                transitions[table[prefix[:-1]], prefix[-1]] = state
        self.transitions = ops.convert_to_tensor(transitions)
        self.vocab, self.eos_token_id, self.length = vocab, eos, max_length

    def candidates(self, log_probs, states, step, dense_top_k=None):
        safe = ops.maximum(states, 0)
        nxt = ops.take(self.transitions, safe, axis=0)  # [R, V]
        ok = ops.logical_and(ops.greater_equal(nxt, 0), ops.expand_dims(states >= 0, 1))
        scores, tokens = ops.top_k(ops.where(ok, log_probs, -np.inf), self.vocab)
        nxt = ops.take_along_axis(nxt, tokens, axis=1)
        valid = ops.greater(scores, -np.inf)
        return (
            scores,
            ops.where(valid, ops.cast(tokens, "int32"), -1),
            ops.where(valid, nxt, -1),
        )


def test_eos_constraint_ranks_variable_length_members_exactly():
    vocab, eos = 6, 5
    members = [[1, eos], [1, 2, eos], [1, 2, 3, 4, eos], [0, 0, eos], [3, eos], [2, 2, 2, eos]]
    automaton = _DenseAutomaton(members, vocab, eos, max_length=5)
    table = random_table(vocab, seed=7)
    logits_of = prefix_logits(ops.convert_to_tensor(table))
    out = beam_search(automaton, lambda p, s: (logits_of(p), s), batch_size=2, beam_size=8)
    padded = np.full((len(members), 5), -1)
    for i, member in enumerate(members):
        padded[i, : len(member)] = member
    weights = np.array([31, 17, 13, 7, 5, 3, 2, 11])
    log_probs = table - table.max(1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(1, keepdims=True))
    expected = []
    for member in members:
        total = np.float32(0)
        for t, token in enumerate(member):
            code = int((np.array(member[:t], dtype=int) * weights[:t]).sum()) + 29 * t
            total += log_probs[code % TABLE_ROWS, token]
        expected.append(total)
    order = np.argsort(-np.array(expected), kind="stable")
    tokens, scores = np.asarray(out["tokens"]), np.asarray(out["scores"])
    for b in range(2):
        np.testing.assert_array_equal(tokens[b, : len(members)], padded[order])
        np.testing.assert_allclose(scores[b, : len(members)], np.array(expected)[order], atol=1e-5)
        assert np.all(tokens[b, len(members) :] == -1)
        assert np.all(np.isneginf(scores[b, len(members) :]))


def test_eos_beams_that_run_out_of_steps_are_dropped():
    vocab, eos = 4, 3
    members = [[0, 0, 0, 0, eos], [1, eos]]
    automaton = _DenseAutomaton(members, vocab, eos, max_length=3)  # the long one never ends
    out = beam_search(
        automaton, lambda p, s: (ops.zeros((ops.shape(p)[0], vocab)), s), 1, beam_size=4
    )
    assert np.asarray(out["tokens"])[0].tolist() == [[1, 3, -1]] + [[-1, -1, -1]] * 3
