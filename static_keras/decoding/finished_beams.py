"""Finished and dead beams: one rule for every decode loop.

`beam_search` (`beam_steps.expand` and `reorder`), the keras-hub
`ConstrainedBeamSampler` and the keras-hub `ConstrainedSampler` all take
these functions, so what a finished row does is written once:

- **A finished row proposes only itself** (`only_candidate`): exactly one
  candidate, a filler token, at 0 added log-probability; every other
  candidate is `-inf`. Its score never changes, so a complete member keeps
  competing with the live beams at its final score. The filler is
  `PAD_TOKEN` in the search's results (positions after a member's EOS are
  -1) and the end token a sampler writes into `generate()`'s output (the
  EOS of a string set; the end or stop token of a semantic-ID set). A
  sampler forces a row still inside its prompt the same way, with its
  prompt token.
- **It writes the filler** (`finished_tokens`) **and keeps its state**
  (`held_states`): the filler never advances the automaton.
- **A beam ends** when its parent had ended or it appended EOS, and only
  while it is alive (`ended`); once ended it stays ended. (The samplers
  read "ended" off the automaton instead: `is_finished(state)`.)
- **A dead row** (score `-inf`: fewer valid extensions than beams) writes
  the filler and holds `INVALID_STATE` (`bury_dead`).
- **Each member once** (`distinct_items`): a finished beam whose state a
  better finished beam of the same batch row holds is dropped
  (`repeated_finished`).

Every function is elementwise over rows (`R = batch x beam`, batch-major)
with static shapes; `finished` flags are bool `[R]` and broadcast over a
trailing candidate axis where the other arguments have one.
"""

from __future__ import annotations

import numpy as np
from keras import ops

from static_keras.constants import INVALID_STATE


def only_candidate(scores, forced, column):
    """float32 `[R, W]`: `scores` on the rows that go on; a `forced` row's
    only candidate is column `column` (a Python int, or int `[R]`: one per
    row) at 0, every other column `-inf`.

    Args:
        scores: float32 `[R, W]`, what each candidate adds to its row's score
            (candidate slots, or the whole vocabulary).
        forced: bool `[R]`, the finished (or otherwise forced) rows.
        column: the forced rows' one candidate: a slot, or a token id when
            the columns are the vocabulary.
    """
    width = ops.shape(scores)[1]
    if not isinstance(column, (int, np.integer)):
        column = ops.expand_dims(column, 1)
    only = ops.equal(ops.arange(width, dtype="int32")[None, :], column)
    alone = ops.where(only, 0.0, -np.inf)
    return ops.where(ops.expand_dims(forced, 1), alone, scores)


def finished_tokens(finished, filler, tokens):
    """`tokens` (int `[R]` or `[R, W]`) with every token of a finished row
    replaced by `filler` (a Python int, or int `[R]`)."""
    return ops.where(_rows(finished, tokens), _rows(filler, tokens), tokens)


def held_states(finished, states, next_states):
    """`next_states` (int32 `[R]` or `[R, W]`) with a finished row's entries
    replaced by its own state `states [R]`: the filler does not advance it."""
    return ops.where(_rows(finished, next_states), _rows(states, next_states), next_states)


def ended(parent_ended, tokens, eos: int, live):
    """bool `[R]`: the beams that hold a complete member after a step, from
    their parents' flags, the tokens they appended and whether they live."""
    return ops.logical_and(live, ops.logical_or(parent_ended, ops.equal(tokens, eos)))


def bury_dead(live, tokens, states, filler):
    """`(tokens, states)`, each `[R]`: a dead row (`live` False) writes
    `filler` and holds `INVALID_STATE`; a live one keeps both."""
    return ops.where(live, tokens, filler), ops.where(live, states, INVALID_STATE)


def repeated_finished(states, finished, beam_size: int):
    """bool `[R]`: finished beams whose state a better finished beam of the
    same batch row holds (beams are sorted by score within a row)."""
    states = ops.reshape(states, (-1, beam_size))
    finished = ops.reshape(finished, (-1, beam_size))
    both = ops.logical_and(ops.expand_dims(finished, 2), ops.expand_dims(finished, 1))
    same = ops.logical_and(ops.equal(ops.expand_dims(states, 2), ops.expand_dims(states, 1)), both)
    before = ops.arange(beam_size)[:, None] > ops.arange(beam_size)[None, :]  # [i, j]: j < i
    return ops.reshape(ops.any(ops.logical_and(same, before[None]), axis=2), (-1,))


def _rows(x, like):
    """`x` (a per-row `[R]` tensor, or a Python scalar) shaped to broadcast
    against `like` (`[R]` or `[R, W]`)."""
    if isinstance(x, (int, np.integer)) or len(like.shape) == 1:
        return x
    return ops.expand_dims(x, 1)
