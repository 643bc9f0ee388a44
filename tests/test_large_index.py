"""Large sets (slow): the index against np.unique / searchsorted oracles."""

import numpy as np
import pytest

from static_keras import ConstrainedDecoding
from static_keras import StaticIndex
from static_keras import beam_search

pytestmark = pytest.mark.slow


def _prefix_keys(rows, t, vocab):
    keys = np.zeros(len(rows), dtype=object if vocab**t >= 2**63 else np.int64)
    for column in range(t):
        keys = keys * vocab + rows[:, column].astype(np.int64)
    return keys


@pytest.mark.parametrize("skewed", [False, True])
def test_two_million_rows_against_unique_oracle(skewed):
    rng = np.random.default_rng(7)
    vocab, length, n = 2048, 8, 2_000_000
    if skewed:  # popular heads: long shared prefixes, wide and narrow rows
        rows = np.minimum(rng.zipf(1.2, size=(n, length)) - 1, vocab - 1)
    else:
        rows = rng.integers(0, vocab, size=(n, length))
    index = StaticIndex.build(rows, vocab)
    unique = np.unique(rows, axis=0)
    assert index.num_sequences == len(unique)

    sizes = [len(np.unique(unique[:, :t], axis=0)) for t in range(length + 1)]
    assert index.layout.level_sizes == tuple(sizes)
    assert index.num_states == sum(sizes)

    # Members and near-misses (last token changed).
    sample = unique[rng.choice(len(unique), 20_000, replace=False)]
    assert index.contains(sample).all()
    near = sample.copy()
    near[:, -1] = (near[:, -1] + rng.integers(1, vocab, len(near))) % vocab
    members = {tuple(r) for r in unique[np.isin(unique[:, 0], near[:, 0])]}
    expected = np.array([tuple(r) in members for r in near])
    np.testing.assert_array_equal(index.contains(near), expected)

    # allowed_tokens at every depth for sampled member prefixes.
    layer = ConstrainedDecoding(index)
    for t in range(length):
        prefixes = sample[:300, :t]
        allowed = index.allowed_tokens(prefixes)
        lo = np.searchsorted(_prefix_keys(unique, t, vocab), _prefix_keys(prefixes, t, vocab))
        for row in range(0, 300, 37):
            start = lo[row]
            stop = start
            while stop < len(unique) and np.array_equal(unique[stop, :t], prefixes[row]):
                stop += 1
            assert np.array_equal(np.flatnonzero(allowed[row]), np.unique(unique[start:stop, t])), (
                t,
                row,
            )
        assert allowed.sum(1).max() <= index.step_widths[t]

    # Beam search over the large index: every result is a member.
    table = rng.normal(size=(101, vocab)).astype("float32")

    def step_fn(prefix, state):
        code = np.asarray(prefix).astype(np.int64).sum(1) * 7 + prefix.shape[1]
        return table[code % 101], state

    out = beam_search(layer, step_fn, batch_size=2, beam_size=70)
    tokens = np.asarray(out["tokens"]).reshape(-1, length)
    assert index.contains(tokens).all()
    for b in range(2):
        batch = np.asarray(out["tokens"])[b]
        assert len({tuple(r) for r in batch}) == 70
