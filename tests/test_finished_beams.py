"""The finished-beam rule (`decoding.finished_beams`) against plain NumPy,
over random flags with all-finished and none-finished batch rows, in
every execution mode."""

from __future__ import annotations

import numpy as np
import pytest
from decoding_oracles import compiled_modes

from static_keras.constants import INVALID_STATE
from static_keras.constants import PAD_TOKEN
from static_keras.decoding import finished_beams

BATCH, BEAMS, WIDTH, EOS = 5, 4, 7, 3


def _flags(rng, p=0.5):
    """bool `[BATCH * BEAMS]`: batch row 0 all True, row 1 all False, the rest random."""
    flags = rng.random((BATCH, BEAMS)) < p
    flags[0], flags[1] = True, False
    return flags.reshape(-1)


def _scores(rng, rows, width):
    scores = rng.normal(size=(rows, width)).astype("float32")
    scores[rng.random((rows, width)) < 0.3] = -np.inf  # padding, disallowed tokens
    return scores


def _only_candidate_reference(scores, forced, column):
    out = scores.copy()
    columns = np.broadcast_to(column, forced.shape)
    for r in np.flatnonzero(forced):
        out[r] = -np.inf
        out[r, columns[r]] = 0.0
    return out


def _repeated_reference(states, finished, beam_size):
    out = np.zeros(states.shape, bool)
    for r in range(states.size):
        first = r - r % beam_size  # the first beam of the batch row
        out[r] = finished[r] and any(
            finished[j] and states[j] == states[r] for j in range(first, r)
        )
    return out


@pytest.mark.parametrize("seed", range(3))
def test_a_finished_row_proposes_only_its_one_candidate_at_no_cost(seed):
    rng = np.random.default_rng(seed)
    rows = BATCH * BEAMS
    scores, forced = _scores(rng, rows, WIDTH), _flags(rng)
    tokens = rng.integers(0, WIDTH, size=rows).astype("int32")
    for mode, wrap in compiled_modes():
        # The search's candidate slots (slot 0) and a sampler's vocabulary
        # columns (a token per row).
        for column in (0, tokens):
            got = wrap(lambda s, f, c=column: finished_beams.only_candidate(s, f, c))(
                scores, forced
            )
            want = _only_candidate_reference(scores, forced, column)
            np.testing.assert_array_equal(np.asarray(got), want, err_msg=mode)
            got = np.asarray(got)
            assert np.all(np.sum(np.isfinite(got[forced]), axis=1) == 1), mode
            np.testing.assert_array_equal(got[~forced], scores[~forced], err_msg=mode)


@pytest.mark.parametrize("seed", range(3))
def test_finished_rows_write_the_filler_and_keep_their_state(seed):
    rng = np.random.default_rng(seed)
    rows = BATCH * BEAMS
    finished = _flags(rng)
    states = rng.integers(0, 50, size=rows).astype("int32")
    slot_tokens = rng.integers(0, WIDTH, size=(rows, WIDTH)).astype("int32")
    slot_states = rng.integers(-1, 50, size=(rows, WIDTH)).astype("int32")
    row_tokens, row_states = slot_tokens[:, 0], slot_states[:, 0]
    for mode, wrap in compiled_modes():
        # Per candidate slot (`[R, W]`, the search) and per row (`[R]`, the samplers).
        for tokens, next_states in ((slot_tokens, slot_states), (row_tokens, row_states)):
            done = finished if tokens.ndim == 1 else finished[:, None]
            for filler in (PAD_TOKEN, EOS):
                got = wrap(lambda f, t, x=filler: finished_beams.finished_tokens(f, x, t))(
                    finished, tokens
                )
                np.testing.assert_array_equal(
                    np.asarray(got), np.where(done, filler, tokens), err_msg=mode
                )
            got = wrap(finished_beams.held_states)(finished, states, next_states)
            own = states if tokens.ndim == 1 else states[:, None]
            np.testing.assert_array_equal(
                np.asarray(got), np.where(done, own, next_states), err_msg=mode
            )


@pytest.mark.parametrize("seed", range(3))
def test_ended_dead_and_repeated_beams(seed):
    rng = np.random.default_rng(seed)
    rows = BATCH * BEAMS
    parent, live = _flags(rng), _flags(rng, p=0.8)
    live[2 * BEAMS : 3 * BEAMS] = False  # a batch row with no live beam
    tokens = rng.integers(0, 2 * EOS, size=rows).astype("int32")
    states = rng.integers(0, 3, size=rows).astype("int32")  # few states: repeats
    for mode, wrap in compiled_modes():
        got = wrap(lambda p, t, v: finished_beams.ended(p, t, EOS, v))(parent, tokens, live)
        want = live & (parent | (tokens == EOS))
        np.testing.assert_array_equal(np.asarray(got), want, err_msg=mode)

        got_tokens, got_states = wrap(lambda v, t, s: finished_beams.bury_dead(v, t, s, EOS))(
            live, tokens, states
        )
        np.testing.assert_array_equal(np.asarray(got_tokens), np.where(live, tokens, EOS))
        np.testing.assert_array_equal(np.asarray(got_states), np.where(live, states, INVALID_STATE))

        finished = want
        got = wrap(lambda s, f: finished_beams.repeated_finished(s, f, BEAMS))(states, finished)
        np.testing.assert_array_equal(
            np.asarray(got), _repeated_reference(states, finished, BEAMS), err_msg=mode
        )
