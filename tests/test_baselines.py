"""The benchmark baselines: each against the exhaustive oracle inside beam_search."""

import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
from keras import ops

from static_keras import StaticIndex
from static_keras import beam_search
from static_keras.baselines import CpuTrie
from static_keras.baselines import HashBitmap
from static_keras.baselines import PPVApproximate
from static_keras.baselines import PPVExact
from static_keras.baselines import SortedPrefixKeys

_TABLE_ROWS = 97
_WEIGHTS = np.array([31, 17, 13, 7, 5, 3, 2, 11])
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TF = keras.config.backend() == "tensorflow"


def _logits_fn(table):
    """A deterministic logits function of the prefix (no two rows tie)."""
    table = ops.convert_to_tensor(table)

    def step_fn(prefix, state):
        t = prefix.shape[1]
        weights = ops.convert_to_tensor(np.array(_WEIGHTS[:t].tolist() or [0], "int32"))
        code = ops.sum(ops.cast(prefix, "int32") * weights[:t], axis=1) + 29 * t
        return ops.take(table, code % _TABLE_ROWS, axis=0), state

    return step_fn


def _oracle(sequences, table):
    """Every distinct valid sequence with its total log-softmax score, best first."""
    sequences = np.unique(np.asarray(sequences), axis=0)
    log_probs = table - table.max(1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(1, keepdims=True))
    scores = np.zeros(len(sequences), np.float64)
    for t in range(sequences.shape[1]):
        code = (sequences[:, :t] * _WEIGHTS[:t]).sum(1) + 29 * t
        scores += log_probs[code % _TABLE_ROWS, sequences[:, t]]
    order = np.argsort(-scores, kind="stable")
    return sequences[order], scores[order]


def _table(vocab, seed):
    return np.random.default_rng(seed).normal(size=(_TABLE_ROWS, vocab)).astype("float32")


def _make(kind, seqs, vocab):
    if kind == "cpu_trie":
        return CpuTrie(seqs, vocab)
    if kind == "ppv_exact":
        return PPVExact(seqs, vocab)
    if kind == "ppv_exact_unrolled":
        return PPVExact(seqs, vocab, search="unrolled")
    if kind == "ppv_approx_all":  # probing every token: exact
        return PPVApproximate(seqs, vocab, num_probe=vocab)
    raise AssertionError(kind)


def _check_exact(out, expected_tokens, expected_scores, batch_size):
    n = len(expected_tokens)
    tokens, scores = np.asarray(out["tokens"]), np.asarray(out["scores"])
    for b in range(batch_size):
        np.testing.assert_array_equal(tokens[b, :n], expected_tokens)
        np.testing.assert_allclose(scores[b, :n], expected_scores, rtol=1e-5, atol=1e-5)
        assert np.all(tokens[b, n:] == -1)
        assert np.all(np.isneginf(scores[b, n:]))


GRID = [
    (1, 5, 3),
    (12, 6, 3),
    (40, 4, 4),
    (25, 30, 2),
    (9, 1, 4),  # V = 1: one sequence, all zeros
    (15, 40, 1),  # L = 1
    (60, 3, 5),  # dense: most of the 3**5 space
]
EXACT_KINDS = ["cpu_trie", "ppv_exact", "ppv_exact_unrolled", "ppv_approx_all"]


@pytest.mark.parametrize("kind", EXACT_KINDS)
@pytest.mark.parametrize("n,vocab,length", GRID)
def test_exact_baselines_equal_exhaustive_ranking(kind, n, vocab, length):
    rng = np.random.default_rng(n * 100 + vocab + length)
    seqs = rng.integers(0, vocab, size=(n, length))  # duplicates included
    table = _table(vocab, seed=n)
    expected_tokens, expected_scores = _oracle(seqs, table)
    beam = len(expected_tokens) + 3
    out = beam_search(_make(kind, seqs, vocab), _logits_fn(table), batch_size=2, beam_size=beam)
    _check_exact(out, expected_tokens, expected_scores, batch_size=2)


@pytest.mark.skipif(not _TF, reason="tf.function is TensorFlow's")
@pytest.mark.parametrize("kind", EXACT_KINDS + ["hash_bitmap"])
def test_graph_and_xla_match_eager(kind):
    import tensorflow as tf

    rng = np.random.default_rng(3)
    vocab, length = 7, 4
    seqs = rng.integers(0, vocab, size=(50, length))
    constraint = HashBitmap(seqs, vocab) if kind == "hash_bitmap" else _make(kind, seqs, vocab)
    table = _table(vocab, seed=3)
    step_fn = _logits_fn(table)
    eager = beam_search(constraint, step_fn, batch_size=2, beam_size=64)
    modes = [False] if kind == "cpu_trie" else [False, True]  # a host callback has no XLA
    for jit in modes:
        run = tf.function(lambda: beam_search(constraint, step_fn, 2, 64), jit_compile=jit)
        out = run()
        np.testing.assert_array_equal(np.asarray(out["tokens"]), np.asarray(eager["tokens"]))
        np.testing.assert_allclose(
            np.asarray(out["scores"]), np.asarray(eager["scores"]), rtol=1e-5, atol=1e-5
        )
    if kind != "hash_bitmap":
        _check_exact(eager, *_oracle(seqs, table), batch_size=2)


@pytest.mark.parametrize("num_probe", [1, 2, 5])
def test_ppv_approximate_returns_valid_sequences_with_their_scores(num_probe):
    rng = np.random.default_rng(num_probe)
    vocab, length = 12, 3
    seqs = rng.integers(0, vocab, size=(80, length))
    table = _table(vocab, seed=num_probe)
    expected_tokens, expected_scores = _oracle(seqs, table)
    score_of = {tuple(t): s for t, s in zip(expected_tokens.tolist(), expected_scores)}
    ppv = PPVApproximate(seqs, vocab, num_probe=num_probe)
    out = beam_search(ppv, _logits_fn(table), batch_size=1, beam_size=100)
    tokens, scores = np.asarray(out["tokens"])[0], np.asarray(out["scores"])[0]
    live = tokens[:, 0] >= 0
    assert np.all(tokens[~live] == -1) and np.all(np.isneginf(scores[~live]))
    for row, score in zip(tokens[live].tolist(), scores[live]):
        assert tuple(row) in score_of  # never an invalid sequence
        np.testing.assert_allclose(score, score_of[tuple(row)], rtol=1e-5, atol=1e-5)
    assert np.all(np.diff(scores[live]) <= 0)
    # With 1 probe per row it follows the greedy path only: fewer than all.
    assert live.sum() <= len(expected_tokens)


def test_ppv_shares_keys_and_counts_prefixes():
    seqs = np.array([[1, 2, 0], [1, 2, 1], [1, 3, 0], [0, 2, 2], [1, 2, 0]])
    keys = SortedPrefixKeys(seqs, 4)
    assert keys.level_sizes == (2, 3, 4)
    index = StaticIndex.build(seqs, 4)
    assert keys.level_sizes == tuple(index.layout.level_sizes[1:])
    exact, approx = PPVExact(keys=keys), PPVApproximate(keys=keys, num_probe=2)
    assert exact.keys is approx.keys and exact.nbytes == keys.nbytes > 0


@pytest.mark.parametrize("n,vocab,length", [(3000, 20, 5), (500, 300, 3), (50, 2, 8)])
def test_hash_bitmap_has_no_false_negatives(n, vocab, length):
    rng = np.random.default_rng(n)
    seqs = rng.integers(0, vocab, size=(n, length))
    for bits, hashes in ((32, 6), (2, 1), (0.5, 2)):  # down to a nearly full bitmap
        bitmap = HashBitmap(seqs, vocab, bits_per_prefix=bits, num_hashes=hashes)
        for t in range(1, length + 1):
            assert bitmap.contains_prefixes(seqs[:, :t]).all()


def test_hash_bitmap_false_positives_are_measurable_and_match_the_device():
    rng = np.random.default_rng(0)
    vocab, length = 16, 4
    seqs = rng.integers(0, vocab, size=(200, length))
    index = StaticIndex.build(seqs, vocab)
    bitmap = HashBitmap(seqs, vocab, bits_per_prefix=2, num_hashes=1)
    probes = rng.integers(0, vocab, size=(4000, length))
    truth = index.contains(probes)
    answer = bitmap.contains_prefixes(probes)
    assert np.all(answer[truth])
    fp_rate = answer[~truth].mean()
    assert 0 < fp_rate < 1  # a 2-bit-per-prefix filter does let some through
    # The device kernel accepts exactly what the host check accepts.
    prefix = seqs[:5, :2]
    states = np.zeros(5, np.int64)
    logits = np.zeros((5, vocab), np.float32)
    for t in range(2):
        _, tokens, next_states = bitmap.candidates(logits, states, t, dense_top_k=vocab)
        tokens, next_states = np.asarray(tokens), np.asarray(next_states)
        for row in range(5):
            accepted = sorted(int(x) for x in tokens[row] if x >= 0)
            queries = np.concatenate(
                [np.repeat(prefix[row : row + 1, :t], vocab, axis=0), np.arange(vocab)[:, None]],
                axis=1,
            )
            assert accepted == np.flatnonzero(bitmap.contains_prefixes(queries)).tolist()
        columns = [list(tokens[row]).index(prefix[row, t]) for row in range(5)]
        states = next_states[np.arange(5), columns]


def test_hash_bitmap_in_beam_search_returns_every_valid_sequence():
    """No false negatives end to end: with a beam over the whole space, every
    valid sequence comes back, ranked as the oracle ranks it."""
    rng = np.random.default_rng(1)
    vocab, length = 4, 3  # 64 possible sequences
    seqs = rng.integers(0, vocab, size=(20, length))
    table = _table(vocab, seed=1)
    expected_tokens, _ = _oracle(seqs, table)
    index = StaticIndex.build(seqs, vocab)
    for bits, hashes in ((32, 6), (1, 1)):  # exact in practice / many false positives
        bitmap = HashBitmap(seqs, vocab, bits_per_prefix=bits, num_hashes=hashes)
        out = beam_search(bitmap, _logits_fn(table), batch_size=1, beam_size=vocab**length)
        tokens = np.asarray(out["tokens"])[0]
        tokens = tokens[tokens[:, 0] >= 0]
        valid = index.contains(tokens)
        np.testing.assert_array_equal(tokens[valid], expected_tokens)


def test_cpu_trie_host_mask_matches_the_index():
    rng = np.random.default_rng(2)
    seqs = rng.integers(0, 9, size=(70, 3))
    index = StaticIndex.build(seqs, 9)
    trie = CpuTrie(seqs, 9)
    np.testing.assert_array_equal(trie.allowed_tokens(np.array([0, -1])), [
        index.allowed_tokens(np.zeros((1, 0), int))[0], np.zeros(9, bool),
    ])  # fmt: skip
    assert trie.num_nodes == 1 + sum(index.layout.level_sizes[1:-1])
    assert trie.host_nbytes() > 0


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda: PPVExact([[0, 1]], 2, search="linear"), "search"),
        (lambda: PPVExact(), "sequences"),
        (lambda: PPVExact([[0, 1]], 2, keys=SortedPrefixKeys([[0, 1]], 2)), "not both"),
        (lambda: PPVApproximate([[0, 1]], 2, num_probe=0), "num_probe"),
        (lambda: HashBitmap([[0, 1]], 2, num_hashes=0), "num_hashes"),
        (lambda: HashBitmap([[0, 1]], 2, bits_per_prefix=0), "bits_per_prefix"),
        (lambda: CpuTrie([[0, 5]], 2), "out of range"),
        (lambda: PPVExact([[0, -1]], 2), "negative"),
        (lambda: HashBitmap([], 2), "empty"),
    ],
)
def test_bad_arguments_raise_clear_errors(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_bad_step_raises():
    ppv = PPVExact([[0, 1]], 2)
    with pytest.raises(ValueError, match="step"):
        ppv.candidates(np.zeros((1, 2), "float32"), np.zeros(1, "int32"), 2)


@pytest.mark.slow  # a JAX subprocess, 23 s: the kernels' JAX tests run by default
def test_baselines_on_jax():
    pytest.importorskip("jax")
    script = textwrap.dedent(
        """
        import os
        os.environ["KERAS_BACKEND"] = "jax"
        import jax
        jax.config.update("jax_enable_x64", True)
        import numpy as np
        from keras import ops
        from static_keras import beam_search
        from static_keras.baselines import CpuTrie, HashBitmap, PPVApproximate, PPVExact

        rng = np.random.default_rng(0)
        vocab, length = 6, 3
        seqs = rng.integers(0, vocab, size=(30, length))
        table = ops.convert_to_tensor(rng.normal(size=(11, vocab)).astype("float32"))

        def step_fn(prefix, state):
            code = ops.sum(ops.cast(prefix, "int32"), axis=1) + 3 * prefix.shape[1]
            return ops.take(table, code % 11, axis=0), state

        results = []
        for constraint in (
            PPVExact(seqs, vocab), PPVExact(seqs, vocab, search="unrolled"),
            PPVApproximate(seqs, vocab, num_probe=vocab), CpuTrie(seqs, vocab),
            HashBitmap(seqs, vocab),
        ):
            out = beam_search(constraint, step_fn, batch_size=1, beam_size=40)
            results.append(np.asarray(out["tokens"]))
            run = jax.jit(lambda: beam_search(constraint, step_fn, 1, 40)["tokens"])
            assert np.array_equal(np.asarray(run()), results[-1])
        for tokens in results[1:]:
            assert np.array_equal(tokens, results[0])
        live = results[0][0][results[0][0][:, 0] >= 0]
        assert len(live) == len(np.unique(seqs, axis=0))
        print("ok")
        """
    )
    env = dict(os.environ, KERAS_BACKEND="jax", PYTHONPATH=_REPO)
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("ok")
