"""`AutomatonStep`: which part of a constraint answers a decoding step.

An `AutomatonConstraint` holds its kind's parts (`ConstraintParts`): the
sparse step over CSR rows, and for semantic IDs a dense head. For each
question about a step (candidates, a whole masked row, the allowed mask,
the next states) this picks the part, or for a tensor step or None (rows
at different steps) asks both and keeps each row's answer, and applies a
request's eligibility: checked once (`check_eligibility`), then read by the
dense head's rows or, at sparse steps, by `sparse_keep` on the edge slots.
The layer's public methods (`AutomatonConstraint.candidates`, ...) say what
each answer is; this module is how it is found.
"""

from __future__ import annotations

import numpy as np
from keras import ops

from static_keras.constants import INVALID_STATE
from static_keras.constants import PAD_TOKEN
from static_keras.constraint.decoding_constraint import StepProposal
from static_keras.constraint.step_argument import static_step


class AutomatonStep:
    """Answers one decoding step from a kind's parts (see the module doc).

    Args:
        layout: the index layout.
        parts: the kind's `ConstraintParts`.
        sparse_step: the `SparseStep` over the kind's transitions.
        caps_sparse_steps: whether `dense_top_k` caps steps outside a dense head.
        check_eligibility: `(eligibility, rows) -> RequestEligibility`.
        sparse_keep: `(request, edges, step) -> bool [R, B]`, the edge slots
            whose targets keep an eligible, non-excluded member.
    """

    def __init__(self, layout, parts, sparse_step, caps_sparse_steps, check_eligibility,
                 sparse_keep):  # fmt: skip
        self.layout = layout
        self.transitions = parts.transitions
        self.dense_head = parts.dense_head
        self.sparse_step = sparse_step
        self.caps_sparse_steps = caps_sparse_steps
        self.check_eligibility = check_eligibility
        self._sparse_keep = sparse_keep

    def num_candidates(self, step=None, dense_top_k: int | None = None) -> int:
        """`AutomatonConstraint.num_candidates`."""
        t = self._static_step(step)
        if t is None:
            return max(self.num_candidates(u, dense_top_k) for u in range(self.layout.length))
        width = self.layout.step_widths[t]
        if dense_top_k is not None and self._caps_step(t):
            return max(1, min(int(dense_top_k), width))
        return width

    def candidates(self, logits, states, step=None, dense_top_k: int | None = None,
                   eligibility=None):  # fmt: skip
        """`AutomatonConstraint.candidates`."""
        t = self._static_step(step)
        logits = ops.cast(logits, "float32")
        states = ops.cast(states, "int32")
        k = self.num_candidates(t, dense_top_k)
        if eligibility is not None:
            eligibility = self.check_eligibility(eligibility, ops.shape(states)[0])
        if t is not None and self._is_dense(t):
            found = self.dense_head.candidates(logits, states, t, k, k, eligibility)
        else:
            caps = t is None or self._caps_step(t)
            keep = self._sparse_keep_fn(eligibility, t)
            found = self.sparse_step.candidates(logits, states, t, k, caps, keep)
            if t is None and self.layout.dense_levels:
                # Dense rows keep at most `dense_top_k` of the (wider) k slots.
                dense_top_k = k if dense_top_k is None else max(1, min(int(dense_top_k), k))
                dense = self.dense_head.candidates(
                    logits, states, None, k, dense_top_k, eligibility
                )
                here = ops.expand_dims(self.dense_head.in_head(states), 1)
                found = [ops.where(here, d, s) for d, s in zip(dense, found)]
        scores, tokens, next_states, ok = found
        ok = ops.logical_and(ok, ops.greater(next_states, INVALID_STATE))
        ok = ops.logical_and(ok, ops.greater(scores, -np.inf))
        scores = ops.where(ok, scores, -np.inf)
        tokens = ops.where(ok, tokens, PAD_TOKEN)
        next_states = ops.where(ok, next_states, INVALID_STATE)
        return scores, tokens, next_states

    def propose(self, log_probs, states, step, dense_top_k, *, eligibility=None,
                need_next_states=False, rank_rows=False) -> StepProposal:  # fmt: skip
        """`AutomatonConstraint.propose`."""
        if dense_top_k is None or rank_rows:
            scores = self.vocabulary_scores(log_probs, states, step, eligibility)
            if scores is not None:
                return StepProposal(scores, needs_cap=dense_top_k is not None)
        t = self._static_step(step)
        if rank_rows and t is not None and self._caps_step(t):
            found = self.candidates(log_probs, states, step, None, eligibility)
            return StepProposal(*found, needs_cap=True)
        if not need_next_states:
            found = self.candidate_tokens(log_probs, states, step, dense_top_k, eligibility)
            if found is not None:
                return StepProposal(*found)
        return StepProposal(*self.candidates(log_probs, states, step, dense_top_k, eligibility))

    def candidate_tokens(self, logits, states, step=None, dense_top_k: int | None = None,
                         eligibility=None):  # fmt: skip
        """`AutomatonConstraint.candidate_tokens`."""
        found = self._mask_row_step(states, step, eligibility)
        if found is None:
            return None
        t, states, eligibility = found
        k = self.num_candidates(t, dense_top_k)
        logits = ops.cast(logits, "float32")
        scores, tokens, ok = self.dense_head.top_k(logits, states, t, k, k, eligibility)
        ok = ops.logical_and(ok, ops.greater(scores, -np.inf))
        return ops.where(ok, scores, -np.inf), ops.where(ok, tokens, PAD_TOKEN)

    def vocabulary_scores(self, log_probs, states, step, eligibility=None):
        """`AutomatonConstraint.vocabulary_scores`."""
        found = self._mask_row_step(states, step, eligibility)
        if found is None:
            return None
        t, states, eligibility = found
        allowed = self.dense_head.allowed(states, t, eligibility)
        return ops.where(allowed, ops.cast(log_probs, "float32"), -np.inf)

    def _mask_row_step(self, states, step, eligibility):
        """`(t, states, eligibility)` set out for a dense int step read from
        mask rows, or None for any other step."""
        t = self._static_step(step)
        if t is None or not self._is_dense(t) or self.dense_head.reads_edge_rows(t, eligibility):
            return None
        if eligibility is not None:
            eligibility = self.check_eligibility(eligibility, ops.shape(states)[0])
        return t, ops.cast(states, "int32"), eligibility

    def allowed_mask(self, states, step=None, eligibility=None):
        """`AutomatonConstraint.allowed_mask`."""
        t = self._static_step(step)
        states = ops.cast(states, "int32")
        if eligibility is not None:
            eligibility = self.check_eligibility(eligibility, ops.shape(states)[0])
        if t is not None and self._is_dense(t):
            return self.dense_head.allowed(states, t, eligibility)
        keep = self._sparse_keep_fn(eligibility, t)
        allowed = self.sparse_step.allowed(states, t, self.layout.vocab_size, keep)
        if t is None and self.layout.dense_levels:
            here = ops.expand_dims(self.dense_head.in_head(states), 1)
            allowed = ops.where(here, self.dense_head.allowed(states, None, eligibility), allowed)
        return allowed

    def advance(self, states, tokens, step=None):
        """`AutomatonConstraint.advance`."""
        t = self._static_step(step)
        states = ops.cast(states, "int32")
        tokens = ops.cast(tokens, "int32")
        if t is not None and self._is_dense(t):
            return self.dense_head.advance(states, tokens, t)
        next_states = self.sparse_step.advance(states, tokens, t)
        if t is None and self.layout.dense_levels:
            here = self.dense_head.in_head(states)
            dense = self.dense_head.advance(states, tokens, None)
            next_states = ops.where(here, dense, next_states)
        return next_states

    def _is_dense(self, step: int) -> bool:
        return step < self.layout.dense_levels

    def _caps_step(self, step: int) -> bool:
        """Whether `dense_top_k` caps the candidates of int `step`."""
        return self._is_dense(step) or self.caps_sparse_steps

    def _sparse_keep_fn(self, eligibility, step):
        """`edges -> bool [R, B]` for `SparseStep`: the slots whose target keeps
        an eligible member; None when every slot does (no request, or
        entered rows whose children hold all their members)."""
        if eligibility is None:
            return None
        if eligibility.entered and self.transitions.same_members(step):
            return None
        return lambda edges: self._sparse_keep(eligibility, edges, step)

    def _static_step(self, step) -> int | None:
        return static_step(step, self.layout.length)
