"""The named steps of a constrained beam search, one function each.

`beam_search` is a loop over them: `step_rows` (which rows propose, and
under which eligibility), `expand` (the constraint's `StepProposal`, as
log-probabilities, finished beams proposing only themselves), `rank` (the
best `beam_size` extensions of each batch row), `reorder` (the survivors'
tokens, states and history, by parent) and `finish` (only ended beams of a
variable-length set, sorted; item ids). Rows are batch-major: beam `m` of
batch row `b` is row `b * beam_size + m`. What finished and dead beams do
is `finished_beams`' rule, shared with the keras-hub samplers.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import keras
import numpy as np
from keras import ops

from static_keras.constants import INVALID_STATE
from static_keras.constants import PAD_TOKEN
from static_keras.decoding import finished_beams
from static_keras.kernels import capped_top_k
from static_keras.kernels import execution_plan
from static_keras.kernels import gather
from static_keras.kernels import two_stage_top_k


@dataclasses.dataclass(frozen=True)
class Search:
    """What is fixed for one decode."""

    constraint: Any  # a DecodingConstraint
    batch_size: Any  # int, or a scalar int tensor
    beam_size: int
    dense_top_k: int
    distinct_items: bool
    batch_index: Any  # int32 [B, 1]: 0..B-1
    eligibility: Any = None  # per batch row (the first step), or None
    beam_eligibility: Any = None  # the same per beam row (every later step)

    @property
    def eos(self):
        return self.constraint.eos_token_id


@dataclasses.dataclass(frozen=True)
class Beams:
    """The beams between steps: R = B x beam_size rows (B at the first step)."""

    scores: Any  # float32 [R], None before the first step
    states: Any  # int32 [R]
    prefix: Any  # int32 [rows, t]
    finished: Any  # bool [R]
    decoder_state: Any


@dataclasses.dataclass(frozen=True)
class Rows:
    """The rows that propose at one step."""

    states: Any  # int32 [rows]
    scores: Any  # float32 [rows]
    beams: int  # candidate rows per batch row: 1 at the first step
    dense_top_k: int  # tokens per beam
    eligibility: Any


@dataclasses.dataclass(frozen=True)
class Extensions:
    """Every (row, candidate) extension of one step, ranked next."""

    total: Any  # float32 [B, beams, width]: the beam's score plus the token's
    tokens: Any  # int32 [rows, width], or None: the column is the token
    next_states: Any  # int32 [rows, width], or None: `advance` the survivors
    dense_top_k: int | None  # tokens per beam where that cap binds, else None
    needs_cap: bool  # whether `rank` still caps each beam at `dense_top_k`


def step_rows(search: Search, beams: Beams, step: int) -> Rows:
    """The first step has one live beam per batch row: only its candidates
    are scored and ranked, and all of its best `beam_size` survive."""
    if step == 0:
        batch = search.batch_size
        zeros = ops.zeros((batch,), dtype="int32"), ops.zeros((batch,), dtype="float32")
        return Rows(*zeros, 1, search.beam_size, search.eligibility)
    return Rows(
        beams.states, beams.scores, search.beam_size, search.dense_top_k, search.beam_eligibility
    )


def expand(search: Search, beams: Beams, rows: Rows, logits, step: int) -> Extensions:
    """The constraint's proposal for `rows`, scored as total log-probabilities."""
    # log-softmax = (logits - max) - log(sum(exp(logits - max))): candidates
    # are picked on the shifted logits (the same order within a row) and the
    # normaliser is subtracted from their scores only, so no [R, V]
    # log-prob matrix is written.
    logits, normaliser = shift_and_normaliser(ops.cast(logits, "float32"))
    eos, beam_size = search.eos, search.beam_size
    # `dense_top_k` goes to the constraint under its own name, None where it
    # cannot bind: a beam never gives more than `beam_size` survivors.
    binds = rows.dense_top_k < beam_size or (eos is not None and step > 0)
    dense_top_k = rows.dense_top_k if binds else None
    # A binding cap by rankings of whole batch rows (`capped_top_k`) where
    # the plan says so, for fixed-length sets; else a top-k per beam.
    plan = execution_plan.current()
    rank_rows = dense_top_k is not None and eos is None and plan.rank_capped_beams_by_row
    proposal = search.constraint.propose(
        logits,
        rows.states,
        step,
        dense_top_k,
        eligibility=rows.eligibility,
        need_next_states=eos is not None,
        rank_rows=rank_rows,
    )
    scores = proposal.scores - normaliser  # -inf (padding, disallowed) stays -inf
    tokens, next_states = proposal.tokens, proposal.next_states
    width = ops.shape(scores)[1]
    if eos is not None and step > 0:  # a finished beam proposes only itself, in slot 0
        done = beams.finished
        scores = finished_beams.only_candidate(scores, done, 0)
        tokens = finished_beams.finished_tokens(done, PAD_TOKEN, tokens)
        next_states = finished_beams.held_states(done, beams.states, next_states)
    total = ops.reshape(ops.expand_dims(rows.scores, 1) + scores, (-1, rows.beams, width))
    return Extensions(total, tokens, next_states, dense_top_k, proposal.needs_cap)


def rank(search: Search, rows: Rows, ext: Extensions):
    """`(scores [B, M], choice [B, M])`: each batch row's best extensions,
    `choice` a position in its `beams x width` candidates."""
    beam_size, width = search.beam_size, ops.shape(ext.total)[2]
    if ext.needs_cap:  # whole rows or uncapped candidates, `dense_top_k` per beam
        scores, choice = capped_top_k.capped_top_k(ext.total, beam_size, ext.dense_top_k)
    else:
        total = ops.reshape(ext.total, (-1, rows.beams * width))
        if rows.beams * width < beam_size:  # the first step, fewer candidates than beams
            pad = [[0, 0], [0, beam_size - rows.beams * width]]
            total = ops.pad(total, pad, constant_values=-np.inf)
        scores, choice = two_stage_top_k.top_k(total, beam_size)  # long rows: two stages
    return scores, ops.minimum(choice, rows.beams * width - 1)  # padding: dead


def reorder(search: Search, beams: Beams, rows: Rows, ext: Extensions, ranked, step: int):
    """The survivors as `Beams`: tokens appended, states moved on, history,
    finished flags and decoder state taken from each survivor's parent."""
    constraint, beam_size = search.constraint, search.beam_size
    scores, choice = ranked
    width = ops.shape(ext.total)[2]
    batch_index = search.batch_index
    if rows.beams == 1:
        # One candidate row per batch row (the first step, or beam 1): every
        # survivor's parent is known before ranking; with beam 1 none moves.
        column = choice
        parent = None if beam_size == 1 else ops.repeat(batch_index[:, 0], beam_size)
    else:
        beam = choice // width  # the parent beam within its batch row
        column = choice - beam * width
        parent = ops.reshape(batch_index * rows.beams + beam, (-1,))

    def parents_of(x):
        return x if parent is None else gather.take(x, parent)

    live = ops.reshape(ops.greater(scores, -np.inf), (-1,))
    scores = ops.reshape(scores, (-1,))
    if ext.tokens is None:  # ranked the whole vocabulary: the column is the token
        token = ops.reshape(column, (-1,))
        next_state = constraint.advance(parents_of(rows.states), token, step)
    else:
        flat_choice = ops.reshape(batch_index * (rows.beams * width) + choice, (-1,))
        token = gather.take(ops.reshape(ext.tokens, (-1,)), flat_choice)
        if ext.next_states is None:  # dead rows' padding tokens advance to -1
            next_state = constraint.advance(parents_of(rows.states), token, step)
        else:
            next_state = gather.take(ops.reshape(ext.next_states, (-1,)), flat_choice)
    token, states = finished_beams.bury_dead(live, token, next_state, PAD_TOKEN)
    prefix = ops.concatenate([parents_of(beams.prefix), ops.expand_dims(token, 1)], axis=1)
    finished = beams.finished
    if search.eos is not None:
        finished = finished_beams.ended(parents_of(finished), token, search.eos, live)
        if search.distinct_items:
            repeat = finished_beams.repeated_finished(states, finished, beam_size)
            scores = ops.where(repeat, -np.inf, scores)
            finished = ops.logical_and(finished, ops.logical_not(repeat))
    state = beams.decoder_state
    if step + 1 < constraint.length and state is not None and parent is not None:
        state = keras.tree.map_structure(lambda x: ops.take(x, parent, axis=0), state)
    return Beams(scores, states, prefix, finished, state)


def finish(search: Search, beams: Beams, num_results: int) -> dict:
    """`{"tokens", "scores"[, "item_ids"]}`, `num_results` per batch row."""
    constraint, beam_size = search.constraint, search.beam_size
    scores, states, prefix = beams.scores, beams.states, beams.prefix
    if search.eos is not None:
        # Only beams that emitted EOS are members; the others ran out of steps.
        base = ops.expand_dims(ops.arange(search.batch_size, dtype="int32") * beam_size, 1)
        scores = ops.where(beams.finished, scores, -np.inf)
        scores, order = ops.top_k(ops.reshape(scores, (-1, beam_size)), beam_size)
        order = ops.reshape(base + ops.cast(order, "int32"), (-1,))
        scores = ops.reshape(scores, (-1,))
        prefix = ops.take(prefix, order, axis=0)
        states = ops.take(states, order)
    live = ops.greater(scores, -np.inf)
    tokens = ops.where(ops.expand_dims(live, 1), prefix, PAD_TOKEN)
    result = {
        "tokens": ops.reshape(tokens, (-1, beam_size, constraint.length))[:, :num_results],
        "scores": ops.reshape(scores, (-1, beam_size))[:, :num_results],
    }
    if constraint.has_item_ids:
        ids = constraint.item_ids(ops.where(live, states, INVALID_STATE))
        result["item_ids"] = ops.reshape(ids, (-1, beam_size))[:, :num_results]
    return result


def shift_and_normaliser(logits):
    """`(shifted [R, V], normaliser [R, 1])`, float32: each row minus its max,
    and `log(sum(exp(shifted)))`; `shifted - normaliser` is the log-softmax."""
    shifted = logits - ops.max(logits, axis=1, keepdims=True)
    return shifted, ops.log(ops.sum(ops.exp(shifted), axis=1, keepdims=True))
