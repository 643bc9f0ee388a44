"""`DenseHead`: the bit-packed dense head of a semantic-ID index.

The first `dense_levels` steps of a `StaticIndex`: a dense-head state is its
own mask row (1 bit per token); after the last dense step the state map
turns a code into a tail state. `ConstrainedDecoding` holds one (a string
set has none); the base layer asks it for the rows of dense-head states.
It reads the layer's weights (`dense_masks`, `dense_states`, and the dense
edge rows of `constraint/dense_edge_rows.py` where the layer keeps them) and,
for requests with eligibility, an `eligible_words` function of the layer's
eligibility filter.
"""

from __future__ import annotations

import numpy as np
from keras import ops

from static_keras.constants import INVALID_STATE
from static_keras.constraint import dense_edge_rows
from static_keras.kernels import candidate_slots
from static_keras.kernels import gather

#: Bit j of an int32 mask word, j = 0..31 (bit 31 is the sign bit).
_BIT_VALUES = (np.uint32(1) << np.arange(32, dtype=np.uint32)).view(np.int32)


class DenseHead:
    """The dense-head kernels of one layer.

    Args:
        layout: the index's `IndexLayout` (`dense_levels > 0`).
        index_weights: the layer's index weights, by name.
        edge_rows: the layer's dense edge rows, by name (empty: none kept).
        eligible_words: `(states, valid, step, request, index_words) ->
            int32 [R, mask_words]`, the bits of each row's eligible codes.
        depth: `states -> int32`, the tokens decoded to reach each state (the
            layer's state numbering).
    """

    def __init__(self, layout, index_weights, edge_rows, eligible_words, depth):
        self.layout = layout
        self.index_weights = index_weights
        self.edge_rows = edge_rows
        self.eligible_words = eligible_words
        self.depth = depth

    def weight_shapes(self) -> dict:
        """The dense edge rows it derives from the index (empty: none kept)."""
        return dense_edge_rows.shapes(self.layout)

    def weight_arrays(self, arrays) -> dict:
        """Their values, from an index's arrays (before the weights exist:
        a layer creates them from these)."""
        if not self.weight_shapes():
            return {}
        return dense_edge_rows.arrays(self.layout, arrays["dense_states"])

    def in_head(self, states):
        return ops.logical_and(
            ops.greater_equal(states, 0), ops.less(states, self.layout.dense_head_states)
        )

    def allowed(self, states, step, eligibility=None):
        """Unpacks the bit-packed mask row of each dense-head state: bool `[R, V]`.

        A dense-head state is its own mask row. With eligibility the row is
        ANDed, word by word, with the set's mask row of that state and with
        the codes the row's exclusions empty, before one unpack.
        """
        layout = self.layout
        if step is None:
            valid = self.in_head(states)
        else:
            valid = ops.greater(states, INVALID_STATE)
        safe = ops.where(valid, states, 0)
        words = gather.take(self.index_weights["dense_masks"], safe)
        if eligibility is not None:  # the eligibility filter's words of each row
            eligible = self.eligible_words(safe, valid, step, eligibility, words)
            words = ops.bitwise_and(words, eligible)
        # Rows of invalid states unpack to nothing: zeroing their words costs
        # `[R, V/32]`, not an `[R, V]` pass.
        words = ops.where(ops.expand_dims(valid, 1), words, 0)
        bits = ops.bitwise_and(ops.expand_dims(words, 2), _BIT_VALUES)
        allowed = ops.reshape(ops.not_equal(bits, 0), (-1, layout.mask_words * 32))
        if layout.mask_words * 32 != layout.vocab_size:
            allowed = allowed[:, : layout.vocab_size]
        return allowed

    def contains(self, states, tokens, step):
        """Reads one bit per row (not the whole mask row)."""
        if step is None:
            valid = self.in_head(states)
        else:
            valid = ops.greater(states, INVALID_STATE)
        masks = self.index_weights["dense_masks"]
        words = gather.take_cells(masks, ops.where(valid, states, 0), ops.right_shift(tokens, 5))
        bits = ops.bitwise_and(ops.right_shift(words, ops.bitwise_and(tokens, 31)), 1)
        return ops.logical_and(valid, ops.equal(bits, 1))

    def next(self, states, tokens, step):
        """Next state in the dense head: the next code's state, or the tail
        state after d tokens. `states` broadcasts against `tokens`.

        Only allowed tokens are asked for (callers mask the others), so the
        state map's -1 for codes outside the set is never read as a state.
        """
        layout = self.layout
        vocab, last = layout.vocab_size, layout.dense_levels - 1
        table = self.index_weights["dense_states"]
        if step is not None:
            head = ops.greater(states, INVALID_STATE)
            codes = (states - layout.dense_mask_offsets[step]) * vocab + tokens
            if step < last:
                return layout.dense_mask_offsets[step + 1] + codes
            tail = gather.take(table, ops.where(head, codes, 0)) + layout.dense_head_states
            return ops.where(head, tail, INVALID_STATE)
        head = self.in_head(states)
        states = ops.where(head, states, 0)
        depth = self.depth(states)
        offsets = ops.convert_to_tensor(list(self.layout.depth_starts), "int32")
        codes = (states - gather.take(offsets, depth)) * vocab + tokens
        at_last = ops.logical_and(ops.equal(depth, last), head)
        tail = gather.take(table, ops.where(at_last, codes, 0)) + layout.dense_head_states
        deeper = gather.take(offsets, depth + 1) + codes
        return ops.where(head, ops.where(at_last, tail, deeper), INVALID_STATE)

    def advance(self, states, tokens, step):
        safe = ops.clip(tokens, 0, self.layout.vocab_size - 1)
        ok = ops.logical_and(ops.equal(safe, tokens), self.contains(states, safe, step))
        return ops.where(ok, self.next(states, safe, step), INVALID_STATE)

    def top_k(self, logits, states, step, k: int, dense_top_k: int, eligibility=None):
        """`(scores, tokens, ok)` `[R, k]`: the best `k` allowed tokens of
        each dense-head row, of which the first `dense_top_k` count."""
        allowed = self.allowed(states, step, eligibility)
        masked = ops.where(allowed, logits, -np.inf)
        scores, tokens = ops.top_k(masked, k, sorted=True)
        ok = gather.take_along_rows(allowed, tokens)
        if dense_top_k < k:
            ok = ops.logical_and(ok, ops.less(ops.arange(k), dense_top_k)[None, :])
        return scores, ops.cast(tokens, "int32"), ok

    def reads_edge_rows(self, step: int, eligibility) -> bool:
        # Requests with eligibility read the mask rows (their set words
        # and exclusions are per mask word); the results are the same.
        return (
            eligibility is None
            and step == self.layout.dense_levels - 1
            and dense_edge_rows.POINTERS in self.edge_rows
        )

    def candidates(self, logits, states, step, k: int, dense_top_k: int, eligibility=None):
        """`(scores, tokens, next_states, ok)` `[R, k]` of dense-head rows: the
        best `k` allowed tokens (the first `dense_top_k` count), or at the
        last dense step the CSR edge rows where it keeps them
        (`reads_edge_rows`)."""
        if step is None or not self.reads_edge_rows(step, eligibility):
            scores, tokens, ok = self.top_k(logits, states, step, k, dense_top_k, eligibility)
            next_states = self.next(ops.expand_dims(states, 1), tokens, step)
            return scores, tokens, next_states, ok
        # The children of a code are consecutive depth-d tail states: B_t
        # slots from its row pointer, as a tail step reads its CSR row.
        layout = self.layout
        valid = ops.greater(states, INVALID_STATE)
        codes = ops.where(valid, states - layout.dense_mask_offsets[step], 0)
        pointers = self.edge_rows[dense_edge_rows.POINTERS]
        start = gather.take(pointers, codes)
        count = ops.where(valid, gather.take(pointers, codes + 1) - start, 0)
        edges, ok = candidate_slots.row_slots(start, count, layout.step_widths[step])
        tokens = gather.take_runs(self.edge_rows[dense_edge_rows.TOKENS], edges, start)
        tokens = ops.cast(tokens, "int32")
        scores = ops.where(ok, gather.take_along_rows(logits, tokens), -np.inf)
        next_states = edges + layout.dense_head_states  # depth-d tail state = edge
        if k < ops.shape(edges)[1]:
            return candidate_slots.best_slots(scores, tokens, next_states, k)
        return scores, tokens, next_states, ok
