"""The capped ranking equals a top-k per beam followed by one over the
beams, index for index, in every execution mode."""

from __future__ import annotations

import numpy as np
import pytest
from decoding_oracles import compiled_modes

from static_keras.kernels import capped_top_k


def _oracle(x, k, dense_top_k):
    """Each beam's best `dense_top_k` by (score desc, token asc), then the best `k`
    of the batch row by (score desc, beam, rank in beam): the per-beam form,
    in plain Python. Indices are `beam * V + token`."""
    rows, beams, vocab = x.shape
    values, indices = [], []
    for b in range(rows):
        pool = []
        for m in range(beams):
            best = sorted(range(vocab), key=lambda t: (-x[b, m, t], t))[:dense_top_k]
            pool += [(x[b, m, t], m, rank, t) for rank, t in enumerate(best)]
        pool.sort(key=lambda entry: (-entry[0], entry[1], entry[2]))
        values.append([entry[0] for entry in pool[:k]])
        indices.append([entry[1] * vocab + entry[3] for entry in pool[:k]])
    return np.array(values, np.float32), np.array(indices)


def _scores(kind, shape, rng):
    x = rng.normal(size=shape).astype("float32")
    beams = shape[1]
    if kind == "ties":  # few distinct values: ties within and across beams
        x = np.round(x, 0) + 0.0  # no -0.0: XLA's top-k ranks it below 0.0
    elif kind == "leader":  # one beam far ahead: it fills its cap first
        x[:, 1] += 6.0
    elif kind == "staircase":  # each beam above the next: caps bind in turn
        x += 3.0 * np.arange(beams)[::-1][None, :, None]
    elif kind == "masked":  # a dense mask: most entries -inf, one beam empty
        x[rng.random(shape) < 0.8] = -np.inf
        x[:, 0] = -np.inf
    return x


@pytest.mark.parametrize("kind", ["normal", "ties", "leader", "staircase", "masked"])
@pytest.mark.parametrize(
    "beams, vocab, k, dense_top_k",
    [
        (70, 64, 70, 30),  # the reference's 70 / 30 (3 rankings)
        (12, 100, 12, 5),  # V not a multiple of its block (8): -inf padding
        (6, 32, 6, 1),  # one per beam: k rankings
        (4, 7, 10, 3),  # blocks of one value
        (3, 64, 8, 3),  # fewer blocks (6 of 32) than k
    ],
)
def test_capped_top_k_equals_the_per_beam_form(kind, beams, vocab, k, dense_top_k):
    rng = np.random.default_rng(beams * vocab + k + dense_top_k)
    x = _scores(kind, (2, beams, vocab), rng)
    want_values, want_indices = _oracle(x, k, dense_top_k)
    live = np.isfinite(want_values)  # padding's index is unspecified
    assert capped_top_k._block_size(100) == 8 and capped_top_k._block_size(7) == 1
    for mode, wrap in compiled_modes():
        values, indices = wrap(lambda v: capped_top_k.capped_top_k(v, k, dense_top_k))(x)
        np.testing.assert_array_equal(np.asarray(values), want_values, err_msg=mode)
        np.testing.assert_array_equal(np.asarray(indices)[live], want_indices[live], err_msg=mode)
