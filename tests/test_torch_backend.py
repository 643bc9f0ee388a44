"""The PyTorch backend: decoding steps, exact beam search and `.keras` files.

The checks run in a fresh interpreter with `KERAS_BACKEND=torch` (the
backend is chosen once per process): `run_checks` below is that program.
The expected values come from the host-side indexes (NumPy), from an
exhaustive ranking of every valid sequence computed in NumPy, and from a
`.keras` file that the test process writes under its own backend.
"""

import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import histories
from conftest import make_index
from conftest import make_model

_ROWS = 97
_WEIGHTS = np.array([31, 17, 13, 7, 5, 3, 2, 11, 19, 23, 29, 37])


def _codes(prefix: np.ndarray) -> np.ndarray:
    """The row of the logits table that a prefix `[R, t]` scores with."""
    t = prefix.shape[1]
    return ((prefix.astype(np.int64) * _WEIGHTS[:t]).sum(1) + 29 * t) % _ROWS


def _step_fn(table: np.ndarray):
    """A decoder `step(prefix, state)` whose logits are a function of the prefix."""
    from keras import ops

    tensor = ops.convert_to_tensor(table)
    weights = ops.convert_to_tensor(_WEIGHTS, "int32")

    def step(prefix, state):
        t = prefix.shape[1]
        code = ops.zeros((ops.shape(prefix)[0],), "int32") + 29 * t
        if t:
            code = code + ops.sum(ops.cast(prefix, "int32") * weights[:t], axis=1)
        return ops.take(tensor, ops.mod(code, _ROWS), axis=0), state

    return step


def _exhaustive(sequences: list[tuple[int, ...]], table: np.ndarray):
    """Every sequence with its total log-softmax score under `_step_fn(table)`."""
    shifted = table - table.max(1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(1, keepdims=True))
    scores = []
    for sequence in sequences:
        row = np.array(sequence)[None, :]
        scores.append(sum(log_probs[_codes(row[:, :t])[0], row[0, t]] for t in range(row.shape[1])))
    return np.array(scores)


def _tokenizations(text: bytes, pieces: list[bytes]) -> list[tuple[int, ...]]:
    """Every way to spell `text` with the token ids of `pieces`."""
    if not text:
        return [()]
    return [
        (token,) + rest
        for token, piece in enumerate(pieces)
        if piece and text.startswith(piece)
        for rest in _tokenizations(text[len(piece) :], pieces)
    ]


def _same_candidates(fast, slow):
    """The valid `(token, score, next state)` of each row agree between a
    fixed-width (int step) and an any-step (None / tensor step) call."""
    for row in range(fast[0].shape[0]):
        a = sorted(zip(*(np.asarray(x)[row].tolist() for x in (fast[1], fast[0], fast[2]))))
        b = sorted(zip(*(np.asarray(x)[row].tolist() for x in (slow[1], slow[0], slow[2]))))
        assert [c for c in a if c[0] >= 0] == [c for c in b if c[0] >= 0]


def _check_step(layer, index, prefixes_by_step, rng):
    """Candidates, mask, advance and item ids of `layer` against the host index."""
    from keras import ops

    from static_keras import MASKED_LOGIT

    for t, prefixes in enumerate(prefixes_by_step):
        states = np.zeros(len(prefixes), np.int32)
        for column in range(t):
            states = np.asarray(layer.advance(states, prefixes[:, column], step=column))
        np.testing.assert_array_equal(states, index.walk(prefixes))
        allowed = index.allowed_tokens(states)
        logits = rng.normal(size=(len(states), index.vocab_size)).astype("float32")
        found = [np.asarray(x) for x in layer(logits, states, step=t)]
        scores, tokens, next_states = found
        assert tokens.shape == (len(states), index.step_widths[t])
        for row in range(len(states)):
            valid = tokens[row] >= 0
            assert sorted(tokens[row][valid]) == np.flatnonzero(allowed[row]).tolist()
            np.testing.assert_array_equal(scores[row][valid], logits[row, tokens[row][valid]])
            assert np.isneginf(scores[row][~valid]).all() and (next_states[row][~valid] == -1).all()
            np.testing.assert_array_equal(
                next_states[row][valid],
                index.next_states(np.full(valid.sum(), states[row]), tokens[row][valid]),
            )
        masked = np.where(allowed, logits, MASKED_LOGIT)
        probe = rng.integers(-1, index.vocab_size + 1, size=len(states))
        expected_next = index.next_states(states, probe)
        for step in (t, None, ops.convert_to_tensor(t, "int32")):
            np.testing.assert_array_equal(
                np.asarray(layer(logits, states, step=step, mode="mask")), masked
            )
            np.testing.assert_array_equal(
                np.asarray(layer.advance(states, probe, step=step)), expected_next
            )
            _same_candidates(found, layer(logits, states, step=step))
        if index.has_item_ids:
            np.testing.assert_array_equal(
                np.asarray(layer.item_ids(states)), index.item_ids(states)
            )


def _prefixes(sequences: list[tuple[int, ...]], t: int, vocab: int, rng) -> np.ndarray:
    """The distinct length-t prefixes of `sequences`, plus random ones (mostly invalid)."""
    valid = sorted({s[:t] for s in sequences if len(s) >= t})
    noise = rng.integers(0, vocab, size=(6, t)).tolist()
    return np.array(valid + noise, np.int32).reshape(len(valid) + len(noise), t)


def _check_semantic_ids(rng):
    from static_keras import StaticIndex
    from static_keras import beam_search
    from static_keras import constraint_for

    vocab, length = 6, 3
    rows = rng.integers(0, vocab, size=(40, length))
    for dense_levels in (0, 2):
        index = StaticIndex.build(
            rows, vocab, item_ids=np.arange(40) + 500, dense_levels=dense_levels,
            on_duplicate_item="first",
        )  # fmt: skip
        members = [tuple(s) for s in index.sequences().tolist()]
        prefixes = [_prefixes(members, t, vocab, rng) for t in range(length)]
        _check_step(constraint_for(index), index, prefixes, rng)

        # Beam >= members: the search ranks every member exactly.
        table = rng.normal(size=(_ROWS, vocab)).astype("float32") * 2
        out = beam_search(index, _step_fn(table), batch_size=2, beam_size=len(members) + 3)
        expected = _exhaustive(members, table)
        order = np.argsort(-expected, kind="stable")
        n = len(members)
        tokens, scores = np.asarray(out["tokens"]), np.asarray(out["scores"])
        for b in range(2):
            np.testing.assert_array_equal(tokens[b, :n], np.array(members)[order])
            np.testing.assert_allclose(scores[b, :n], expected[order], rtol=1e-5, atol=1e-5)
            np.testing.assert_array_equal(
                np.asarray(out["item_ids"])[b, :n], index.lookup_item_ids(np.array(members)[order])
            )
            assert (tokens[b, n:] == -1).all() and np.isneginf(scores[b, n:]).all()
    return index


def _check_strings(rng):
    from static_keras import beam_search
    from static_keras import constraint_for
    from static_keras.strings import StringIndex
    from static_keras.strings import TokenVocabulary

    pieces = [b"a", b"b", b"c", b"ab", b"bc", b"abc", b"ca", b"</s>"]
    vocab = TokenVocabulary.from_token_bytes(pieces, special=[7], eos_token_id=7)
    members = ["abc", "ab", "cab", "b", "bca", "cabc"]
    index = StringIndex.from_strings(members, vocab)
    spelled = {m: [s + (7,) for s in _tokenizations(m.encode(), pieces[:7])] for m in members}
    sequences = [s for m in members for s in spelled[m]]
    assert index.contains(sequences).all() and len(sequences) > 2 * len(members)
    prefixes = [_prefixes(sequences, t, len(pieces), rng) for t in range(index.length)]
    _check_step(constraint_for(index), index, prefixes, rng)

    # Beam >= every partial spelling: each member once, with its best spelling.
    table = rng.normal(size=(_ROWS, len(pieces))).astype("float32") * 2
    out = beam_search(index, _step_fn(table), batch_size=1, beam_size=40, num_results=8)
    best = {}
    for m in members:
        scores = _exhaustive(spelled[m], table)
        best[m] = (scores.max(), spelled[m][int(scores.argmax())])
    ranked = sorted(members, key=lambda m: -best[m][0])
    tokens, scores = np.asarray(out["tokens"])[0], np.asarray(out["scores"])[0]
    ids = np.asarray(out["item_ids"])[0]
    n = len(members)
    for r, m in enumerate(ranked):
        assert tuple(t for t in tokens[r] if t >= 0) == best[m][1], (r, m)
        assert vocab.decode(tokens[r]).decode() == m
        np.testing.assert_allclose(scores[r], best[m][0], rtol=1e-5, atol=1e-5)
        assert ids[r] == index.lookup_item_ids([best[m][1]])[0]
    assert (ids[n:] == -1).all() and np.isneginf(scores[n:]).all()


def _check_keras_file(index, tmp):
    import keras

    import static_keras.saving
    from static_keras import CachedTransformerDecoder
    from static_keras import ConstrainedBeamSearch

    history = np.random.default_rng(0).integers(0, 20, (3, 5)).astype("int32")
    keras.utils.set_random_seed(0)
    decoder = CachedTransformerDecoder(
        index.vocab_size, index.length, context_vocab_size=20, hidden_dim=16
    )
    context = keras.Input((5,), dtype="int32")
    search = ConstrainedBeamSearch(index, decoder, beam_size=4, num_results=3)
    model = keras.Model(context, search(context))
    expected = model.predict(history, verbose=0)
    assert expected["tokens"].shape == (3, 3, index.length)
    assert index.contains(expected["tokens"].reshape(-1, index.length)).all()
    path = os.path.join(tmp, "search.keras")
    model.save(path)
    loaded = static_keras.saving.load_model(path)
    got = loaded.predict(history, verbose=0)
    for name in ("tokens", "scores", "item_ids"):
        np.testing.assert_array_equal(np.asarray(got[name]), np.asarray(expected[name]))

    pair = ConstrainedBeamSearch(
        index, decoder, beam_size=4, num_results=3, outputs="scores_and_item_ids"
    )
    scores, ids = keras.Model(context, pair(context)).predict(history, verbose=0)
    np.testing.assert_array_equal(np.asarray(scores), expected["scores"])
    np.testing.assert_array_equal(np.asarray(ids), expected["item_ids"])


def _write_keras_file(tmp: str) -> None:
    """A `ConstrainedBeamSearch` model saved under this process's backend, and its outputs."""
    import keras

    model = make_model(make_index(1))
    expected = model.predict(histories(3), verbose=0)
    model.save(os.path.join(tmp, "foreign.keras"))
    np.savez(
        os.path.join(tmp, "foreign.npz"),
        backend=keras.config.backend(),
        **{name: np.asarray(value) for name, value in expected.items()},
    )


def _check_foreign_keras_file(tmp: str) -> None:
    """The file `_write_keras_file` wrote (under another backend) decodes the same here."""
    import static_keras.saving

    expected = np.load(os.path.join(tmp, "foreign.npz"))
    got = static_keras.saving.load_model(os.path.join(tmp, "foreign.keras"))
    got = got.predict(histories(3), verbose=0)
    np.testing.assert_array_equal(np.asarray(got["tokens"]), expected["tokens"])
    np.testing.assert_array_equal(np.asarray(got["item_ids"]), expected["item_ids"])
    # Float kernels differ between backends in the last bits.
    np.testing.assert_allclose(np.asarray(got["scores"]), expected["scores"], atol=1e-5)
    assert (expected["item_ids"] >= 0).all(), str(expected["backend"])


def run_checks(tmp: str) -> None:
    """The program the test runs under `KERAS_BACKEND=torch`."""
    import keras

    assert keras.config.backend() == "torch", keras.config.backend()
    rng = np.random.default_rng(0)
    index = _check_semantic_ids(rng)
    _check_strings(rng)
    _check_keras_file(index, tmp)
    _check_foreign_keras_file(tmp)
    print("torch ok")


@pytest.mark.slow  # a torch subprocess, 23 s: the torch kernel test runs by default
def test_torch_backend(tmp_path):
    if importlib.util.find_spec("torch") is None:
        pytest.skip("PyTorch is not installed (pip install torch==2.13.0)")
    _write_keras_file(str(tmp_path))  # under the suite's backend (TensorFlow by default)
    tests = os.path.dirname(os.path.abspath(__file__))
    script = f"import sys; sys.path.insert(0, {tests!r})\nimport test_torch_backend\n"
    script += f"test_torch_backend.run_checks({str(tmp_path)!r})\n"
    env = dict(os.environ, KERAS_BACKEND="torch", TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert "torch ok" in result.stdout


def test_tokenizations_enumerate_every_spelling():
    pieces = [b"a", b"b", b"ab", b"ba"]
    assert sorted(_tokenizations(b"aba", pieces)) == [(0, 1, 0), (0, 3), (2, 0)]
    assert _tokenizations(b"c", pieces) == []
    assert _tokenizations(b"", pieces) == [()]
