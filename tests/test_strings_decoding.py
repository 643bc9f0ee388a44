"""StringConstrainedDecoding, beam search, logits processor, Keras plumbing."""

import textwrap

import keras
import numpy as np
import pytest

pytest.importorskip("tokenizers", reason="vocabularies are trained with `tokenizers` in the tests")
from backend_subprocess import run_under
from keras import ops
from string_oracles import MEMBERS
from string_oracles import byte_level_vocabulary
from string_oracles import prefix_code
from string_oracles import ranked_tokenizations
from string_oracles import reachable_by_step
from string_oracles import string_step_fn
from string_oracles import string_table

from static_keras import MASKED_LOGIT
from static_keras import CachedTransformerDecoder
from static_keras import ConstrainedBeamSearch
from static_keras import beam_search
from static_keras import constraint_for
from static_keras.strings import StringIndex
from static_keras.strings import StringLogitsProcessor
from static_keras.strings import TokenVocabulary
from static_keras.strings.string_constrained_decoding import StringConstrainedDecoding


@pytest.fixture(scope="module")
def bpe():
    return byte_level_vocabulary()


@pytest.fixture(scope="module")
def index(bpe):
    return StringIndex.from_strings(MEMBERS, bpe, eos_token_id=bpe.eos_token_id)


@pytest.fixture(scope="module")
def tiny():
    tokens = [b"a", b"b", b"c", b"ab", b"bc", b"abc", b"ca", b"</s>"]
    vocab = TokenVocabulary.from_token_bytes(tokens, special=[7], eos_token_id=7)
    members = ["abc", "ab", "cab", "b", "bca"]
    return vocab, members, StringIndex.from_strings(members, vocab)


# The layer against the index ---------------------------------------------------


def test_candidates_mask_and_advance_match_the_index(index):
    layer = constraint_for(index)
    rng = np.random.default_rng(0)
    for step, frontier in enumerate(reachable_by_step(index)):
        states = np.array(sorted(frontier) + [-1], np.int32)
        logits = rng.normal(size=(states.size, index.vocab_size)).astype("float32")
        allowed = index.allowed_tokens(states)
        scores, tokens, nxt = (np.asarray(x) for x in layer(logits, states, step=step))
        assert tokens.shape == (states.size, index.step_widths[step])
        for row in range(states.size):
            valid = tokens[row] >= 0
            assert sorted(tokens[row][valid]) == np.flatnonzero(allowed[row]).tolist()
            np.testing.assert_array_equal(scores[row][valid], logits[row, tokens[row][valid]])
            assert np.all(np.isneginf(scores[row][~valid])) and np.all(nxt[row][~valid] == -1)
            np.testing.assert_array_equal(
                nxt[row][valid],
                index.next_states(np.full(valid.sum(), states[row]), tokens[row][valid]),
            )
        masked = np.asarray(layer(logits, states, step=step, mode="mask"))
        np.testing.assert_array_equal(masked, np.where(allowed, logits, MASKED_LOGIT))
        np.testing.assert_array_equal(np.asarray(layer.mask_logits(logits, states)), masked)
        # advance: allowed tokens, disallowed tokens, out-of-range tokens.
        probe = rng.integers(-1, index.vocab_size + 1, size=states.size)
        expected = index.next_states(states, probe)
        np.testing.assert_array_equal(np.asarray(layer.advance(states, probe, step=step)), expected)
        np.testing.assert_array_equal(np.asarray(layer.advance(states, probe)), expected)


def test_top_k_keeps_the_best_allowed_tokens(index):
    layer = constraint_for(index)
    logits = np.random.default_rng(1).normal(size=(2, index.vocab_size)).astype("float32")
    states = np.zeros(2, np.int32)
    full, tokens, _ = (np.asarray(x) for x in layer.candidates(logits, states, 0))
    best, best_tokens, best_states = (
        np.asarray(x) for x in layer.candidates(logits, states, 0, dense_top_k=3)
    )
    assert best.shape == (2, 3)
    np.testing.assert_array_equal(best, -np.sort(-full, axis=1)[:, :3])
    np.testing.assert_array_equal(
        best_states, index.next_states(np.zeros(6, np.int32), best_tokens.ravel()).reshape(2, 3)
    )


def test_item_ids_and_finished_states(index, bpe):
    layer = constraint_for(index)
    states = index.walk([[bpe.token_bytes.index(b"s")], []])
    accept = np.arange(index.layout.accept_offset, index.num_states)
    np.testing.assert_array_equal(np.asarray(layer.item_ids(accept)), index.item_ids(accept))
    assert np.asarray(layer.item_ids(np.append(states, -1))).tolist() == [-1, -1, -1]
    assert np.asarray(layer.is_finished(accept)).all()
    # An accept state allows only EOS, which loops back.
    scores, tokens, nxt = layer.candidates(np.zeros((1, index.vocab_size)), accept[:1], 1)
    assert np.asarray(tokens)[0, 0] == index.eos_token_id and np.asarray(nxt)[0, 0] == accept[0]


def test_never_nan_on_rows_with_nothing_allowed(index):
    layer = constraint_for(index)
    states = np.array([-1, -1], np.int32)
    logits = np.full((2, index.vocab_size), -np.inf, "float32")
    scores, tokens, nxt = (np.asarray(x) for x in layer(logits, states, step=0))
    assert np.all(np.isneginf(scores)) and np.all(tokens == -1) and np.all(nxt == -1)
    masked = np.asarray(layer(np.zeros_like(logits), states, step=0, mode="mask"))
    assert np.all(masked == MASKED_LOGIT)
    assert not np.isnan(np.asarray(ops.softmax(masked))).any()


def test_weights_config_round_trip_and_keras_file(index, tmp_path):
    layer = StringConstrainedDecoding(index, name="strings")
    assert len(layer.trainable_weights) == 0 and len(layer.non_trainable_weights) == 4
    config = layer.get_config()
    assert "index" not in config and config["step_widths"] == list(index.step_widths)
    clone = StringConstrainedDecoding.from_config(config)
    assert clone.layout == layer.layout
    clone.set_index(index)
    logits = np.random.default_rng(2).normal(size=(3, index.vocab_size)).astype("float32")
    states = np.array([0, 0, -1], np.int32)
    for a, b in zip(layer(logits, states, step=0), clone(logits, states, step=0)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # A .keras file carries the index in its weights.
    logits_in = keras.Input((index.vocab_size,))
    states_in = keras.Input((), dtype="int32")
    scores, tokens, nxt = layer(logits_in, states_in, step=1)
    assert tuple(scores.shape) == (None, index.step_widths[1]) and tokens.dtype == "int32"
    masked = layer(logits_in, states_in, mode="mask")
    assert tuple(masked.shape) == (None, index.vocab_size)
    model = keras.Model([logits_in, states_in], [scores, tokens, nxt, masked])
    model.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    for a, b in zip(
        model.predict([logits, states], verbose=0), loaded.predict([logits, states], verbose=0)
    ):
        np.testing.assert_array_equal(a, b)
    restored = [x for x in loaded.layers if isinstance(x, StringConstrainedDecoding)][0]
    assert restored.index_metadata()["device_checksum"] == index.checksum
    with pytest.raises(ValueError, match="does not match"):
        StringConstrainedDecoding(index, num_members=3)
    with pytest.raises(ValueError, match="Missing"):
        StringConstrainedDecoding()
    with pytest.raises(ValueError, match="step"):
        layer(logits, states, step=index.length)
    with pytest.raises(ValueError, match="StringIndex"):
        StringConstrainedDecoding(object())


def test_eager_equals_xla(index):
    layer = constraint_for(index)
    logits = np.random.default_rng(3).normal(size=(4, index.vocab_size)).astype("float32")
    states = np.array([0, 0, 3, -1], np.int32)

    import tensorflow as tf

    @tf.function(jit_compile=True)
    def compiled(logits, states):
        return (
            layer.candidates(logits, states, 1, dense_top_k=4),
            layer.mask_logits(logits, states),
            layer.advance(states, tf.constant([1, 2, 3, 4])),
        )

    (s1, t1, n1), m1, a1 = compiled(logits, states)
    s0, t0, n0 = layer.candidates(logits, states, 1, dense_top_k=4)
    np.testing.assert_array_equal(np.asarray(t0), t1.numpy())
    np.testing.assert_array_equal(np.asarray(n0), n1.numpy())
    np.testing.assert_array_equal(np.asarray(layer.mask_logits(logits, states)), m1.numpy())
    np.testing.assert_array_equal(
        np.asarray(layer.advance(states, np.array([1, 2, 3, 4]))), a1.numpy()
    )


# Beam search -------------------------------------------------------------------


def _assert_results(out, vocab, members, index, sequences, scores, beam_size):
    tokens, got, items = (np.asarray(out[k]) for k in ("tokens", "scores", "item_ids"))
    assert tokens.shape == (2, beam_size, index.length)
    for b in range(2):
        for rank, (sequence, score) in enumerate(zip(sequences, scores)):
            row = list(sequence) + [-1] * (index.length - len(sequence))
            assert tokens[b, rank].tolist() == row
            assert got[b, rank] == pytest.approx(score, abs=1e-4)
            assert members[items[b, rank]] == vocab.decode(sequence).decode()
        assert np.all(tokens[b, len(sequences) :] == -1)
        assert np.all(np.isneginf(got[b, len(sequences) :]))
        assert np.all(items[b, len(sequences) :] == -1)


def test_beam_search_ranks_every_tokenization_exactly(tiny):
    vocab, members, index = tiny
    table = string_table(vocab.vocab_size, seed=4)
    sequences, scores = ranked_tokenizations(vocab, members, index, table)
    assert 8 < len(sequences) <= 32
    out = beam_search(
        index, string_step_fn(table), batch_size=2, beam_size=32, distinct_items=False
    )
    _assert_results(out, vocab, members, index, sequences, scores, 32)


def _capped_beam_oracle(index, table, beam, per_beam):
    """Beam search in plain Python over a string set: the first step keeps
    the best `beam` tokens of its one beam, every later step each live
    beam's best `per_beam` allowed tokens (a finished beam proposes only
    itself); the best `beam` extensions survive, then a finished beam whose
    member a better finished beam holds is dropped. Returns the finished
    `(tokens, score)`, best first."""
    log_probs = table - np.log(np.exp(table).sum(1, keepdims=True))
    beams = [((), 0, 0.0, False)]  # (tokens, state, score, finished)
    for t in range(index.length):
        pool = []
        for tokens, state, score, done in beams:
            if done:
                pool.append((tokens, state, score, True))
                continue
            row = log_probs[prefix_code(tokens)]
            allowed = np.flatnonzero(index.allowed_tokens(np.array([state]))[0])
            options = sorted(allowed, key=lambda token: (-row[token], token))
            for token in options[: beam if t == 0 else per_beam]:
                nxt = int(index.next_states(np.array([state]), np.array([token]))[0])
                eos = token == index.eos_token_id
                pool.append((tokens + (int(token),), nxt, score + row[token], eos))
        pool.sort(key=lambda b: -b[2])
        beams, held = [], set()
        for b in pool[:beam]:
            if b[3] and b[1] in held:
                continue  # the same member, a worse tokenization
            held.update([b[1]] if b[3] else [])
            beams.append(b)
    return [(b[0], b[2]) for b in beams if b[3]]


@pytest.mark.parametrize("per_beam", [1, 2, 3])
def test_dense_top_k_caps_every_step_after_the_first_for_string_sets(tiny, per_beam):
    """A string set has no dense head: `dense_top_k` (tokens per beam) caps
    each beam's candidates at every step after the first."""
    vocab, members, index = tiny
    table = string_table(vocab.vocab_size, seed=6)
    expected = _capped_beam_oracle(index, table, 5, per_beam)
    out = beam_search(index, string_step_fn(table), batch_size=2, beam_size=5, dense_top_k=per_beam)
    tokens, scores = np.asarray(out["tokens"]), np.asarray(out["scores"])
    for b in range(2):
        got = [tuple(t for t in row if t >= 0) for row in tokens[b][np.isfinite(scores[b])]]
        assert got == [t for t, _ in expected]
        np.testing.assert_allclose(
            scores[b][np.isfinite(scores[b])], [s for _, s in expected], atol=1e-4
        )


@pytest.mark.parametrize("beam_size", [32, 8, 5])
def test_beam_search_returns_each_member_once_with_its_best_tokenization(tiny, beam_size):
    vocab, members, index = tiny
    table = string_table(vocab.vocab_size, seed=4)
    sequences, scores = ranked_tokenizations(vocab, members, index, table)
    best, seen = [], set()
    for sequence, score in zip(sequences, scores):  # sorted: the first is the best
        text = vocab.decode(sequence)
        if text not in seen:
            seen.add(text)
            best.append((sequence, score))
    assert len(best) == len(members) < len(sequences)
    # Every beam size that holds all token paths is exact; smaller beams
    # (down to K) must still return distinct members, best first.
    out = beam_search(index, string_step_fn(table), batch_size=2, beam_size=beam_size)
    if beam_size >= len(sequences):
        _assert_results(out, vocab, members, index, *zip(*best), beam_size)
    items = np.asarray(out["item_ids"])
    for b in range(2):
        found = items[b][items[b] >= 0].tolist()
        assert 1 <= len(found) == len(set(found))
        live = np.asarray(out["scores"])[b][: len(found)]
        assert np.all(np.isfinite(live)) and np.all(np.diff(live) <= 1e-6)


def test_beam_search_with_a_bpe_vocabulary_returns_members(index, bpe):
    table = string_table(bpe.vocab_size, seed=5)
    out = beam_search(index, string_step_fn(table), batch_size=3, beam_size=6)
    tokens, scores, items = (np.asarray(out[k]) for k in ("tokens", "scores", "item_ids"))
    for b in range(3):
        live = scores[b][items[b] >= 0]
        assert np.all(np.diff(live) <= 1e-6) and np.all(np.isneginf(scores[b][items[b] < 0]))
        assert len(set(items[b][items[b] >= 0].tolist())) == live.size  # each member once
        for k in range(6):
            if items[b, k] < 0:
                continue
            text = bpe.decode(tokens[b, k]).decode()
            assert text == MEMBERS[items[b, k]]
            row = tokens[b, k].tolist()
            end = row.index(index.eos_token_id)
            assert all(t == -1 for t in row[end + 1 :])


def _model(index, beam_size=4, seed=0):
    keras.utils.set_random_seed(seed)
    decoder = CachedTransformerDecoder(
        index.vocab_size, index.length, context_vocab_size=index.vocab_size, hidden_dim=16
    )
    prompt = keras.Input((6,), dtype="int32", name="prompt")
    search = ConstrainedBeamSearch(index, decoder, beam_size=beam_size)
    return keras.Model(prompt, search(prompt))


SHORT = ["search", "get_weather", "東京都", "🍕🍕", "Home > Kitchen"]


@pytest.mark.slow  # 28 s: the string search's other tests run by default
def test_constrained_beam_search_model_keras_round_trip(bpe, tmp_path):
    index = StringIndex.from_strings(SHORT, bpe, eos_token_id=bpe.eos_token_id, max_length=8)
    model = _model(index)
    prompts = np.random.default_rng(0).integers(1, index.vocab_size, (3, 6)).astype("int32")
    out = model.predict(prompts, verbose=0)
    assert out["tokens"].shape == (3, 4, index.length)
    for b in range(3):
        for k in range(4):
            if out["item_ids"][b, k] >= 0:
                assert bpe.decode(out["tokens"][b, k]).decode() == SHORT[out["item_ids"][b, k]]
    assert (out["item_ids"] >= 0).any()
    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras")
    again = loaded.predict(prompts, verbose=0)
    for name in ("tokens", "scores", "item_ids"):
        np.testing.assert_array_equal(out[name], again[name])


# Logits processor --------------------------------------------------------------


def test_logits_processor_greedy_and_sampling(index, bpe):
    processor = StringLogitsProcessor(index)
    rng = np.random.default_rng(6)
    rows = 16
    for mode in ("greedy", "sample"):
        states, outputs = processor.initial_states(rows), [[] for _ in range(rows)]
        for _ in range(index.length):
            logits = processor.mask_logits(rng.normal(size=(rows, bpe.vocab_size)) * 2, states)
            if mode == "greedy":
                tokens = logits.argmax(axis=1)
            else:
                probs = np.exp(logits - logits.max(1, keepdims=True))
                probs /= probs.sum(1, keepdims=True)
                tokens = np.array([rng.choice(bpe.vocab_size, p=p) for p in probs])
            states = processor.advance(states, tokens)
            for row, token in enumerate(tokens):
                outputs[row].append(int(token))
            if processor.is_finished(states).all():
                break
        assert processor.is_finished(states).all()
        for row, ids in zip(processor.item_ids(states), outputs):
            assert bpe.decode(ids).decode() == MEMBERS[row]


def test_logits_processor_candidates_and_bitmask(index, bpe):
    processor = StringLogitsProcessor(index)
    states = np.array(sorted(reachable_by_step(index)[2]) + [-1])
    logits = np.random.default_rng(7).normal(size=(states.size, bpe.vocab_size)).astype("float32")
    scores, tokens, nxt = processor.candidates(logits, states, top_k=5)
    allowed = processor.allowed(states)
    for row in range(states.size):
        valid = tokens[row] >= 0
        best = np.sort(logits[row][allowed[row]])[::-1][:5]
        np.testing.assert_array_equal(scores[row][valid], best)
        np.testing.assert_array_equal(
            nxt[row][valid],
            index.next_states(np.full(valid.sum(), states[row]), tokens[row][valid]),
        )
    bitmask = processor.fill_bitmask(states)
    words = (bpe.vocab_size + 31) // 32
    assert bitmask.shape == (states.size, words) and bitmask.dtype == np.int32
    unpacked = np.unpackbits(bitmask.view(np.uint8), axis=1, bitorder="little")[:, : bpe.vocab_size]
    np.testing.assert_array_equal(unpacked.astype(bool), allowed)
    out = np.full((states.size + 2, words), -1, np.int32)
    processor.fill_bitmask(states, out)
    np.testing.assert_array_equal(out[: states.size], bitmask)


# Other backends ----------------------------------------------------------------

_JAX_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, sys.argv[1])
    import jax, numpy as np
    from keras import ops
    from string_oracles import MEMBERS, byte_level_vocabulary
    from static_keras import beam_search
    from static_keras import constraint_for
    from static_keras.strings import StringIndex
    vocab = byte_level_vocabulary()
    index = StringIndex.from_strings(MEMBERS, vocab, eos_token_id=vocab.eos_token_id)
    layer = constraint_for(index)
    logits = np.random.default_rng(0).normal(size=(3, vocab.vocab_size)).astype("float32")
    states = np.array([0, 0, -1], np.int32)
    eager = layer.candidates(logits, states, 0, dense_top_k=4)
    jitted = jax.jit(lambda l, s: layer.candidates(l, s, 0, dense_top_k=4))(logits, states)
    for a, b in zip(eager, jitted):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    table = np.random.default_rng(1).normal(size=(1, vocab.vocab_size)).astype("float32")
    table = ops.convert_to_tensor(table)
    step = lambda prefix, state: (ops.repeat(table, ops.shape(prefix)[0], axis=0), state)
    out = jax.jit(lambda: beam_search(index, step, 2, 4))()
    rows = np.asarray(out["tokens"]).reshape(8, -1)
    for row, item in zip(rows, np.asarray(out["item_ids"]).ravel()):
        if item >= 0:
            assert vocab.decode(row).decode() == MEMBERS[item]
    print("jax ok")
    """
)


def test_jax_backend():
    pytest.importorskip("jax", reason="JAX is an optional backend (pip install .[jax])")
    run_under("jax", _JAX_SCRIPT, "jax ok")


def test_bitmask_of_wide_states_matches_allowed_tokens():
    import itertools

    alphabet = b"abcdefghij"
    tokens = [bytes([c]) for c in alphabet]
    tokens += [bytes(p) for p in itertools.product(alphabet, repeat=2)]
    tokens += [bytes(p) for p in itertools.product(alphabet[:6], repeat=3)]
    vocab = TokenVocabulary.from_token_bytes(tokens + [b"<eos>"], special=[len(tokens)])
    rng = np.random.default_rng(8)
    members = sorted({bytes(rng.choice(list(alphabet), 4).tolist()) for _ in range(300)})
    index = StringIndex.from_strings(members, vocab, eos_token_id=len(tokens))
    counts = np.diff(index.arrays["indptr"])
    assert counts[0] > 64, "the root must be a wide state"
    states = np.array(sorted(reachable_by_step(index)[1])[:40] + [0, -1, 0])
    bitmask = StringLogitsProcessor(index).fill_bitmask(states)
    unpacked = np.unpackbits(bitmask.view(np.uint8), axis=1, bitorder="little")
    np.testing.assert_array_equal(
        unpacked[:, : vocab.vocab_size].astype(bool), index.allowed_tokens(states)
    )
    assert not unpacked[:, vocab.vocab_size :].any()
