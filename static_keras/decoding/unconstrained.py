"""`Unconstrained`: the beam search's baseline, every token allowed."""

from __future__ import annotations

from keras import ops

from static_keras.constraint.decoding_constraint import DecodingConstraint
from static_keras.constraint.decoding_constraint import StepProposal


class Unconstrained(DecodingConstraint):
    """Plain top-k over the vocabulary for `length` steps (`beam_search`
    with `index=None`): the search the constraint is measured against."""

    def __init__(self, length: int):
        self.length = length

    def candidates(self, log_probs, states, step, dense_top_k=None):
        width = ops.shape(log_probs)[1]
        width = width if dense_top_k is None else min(dense_top_k, width)
        scores, tokens = ops.top_k(log_probs, width)
        tokens = ops.cast(tokens, "int32")
        return scores, tokens, ops.zeros_like(tokens)

    def propose(self, log_probs, states, step, dense_top_k, *, eligibility=None,
                need_next_states=False, rank_rows=False) -> StepProposal:  # fmt: skip
        if dense_top_k is None or rank_rows:  # the whole vocabulary: the column is the token
            return StepProposal(log_probs, needs_cap=dense_top_k is not None)
        return StepProposal(*self.candidates(log_probs, states, step, dense_top_k))

    def advance(self, states, tokens, step):
        return ops.zeros_like(tokens)
