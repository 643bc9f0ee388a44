"""`StringMemberRanges`: the members below string-set states, as a layer part.

With eligibility sets a string layer holds each state's member range as two
weights (`member_lo`, `member_hi`, from `StringIndex.member_ranges`), reads
them per state, and keeps the edge slots whose targets hold an eligible,
non-excluded member.
"""

from __future__ import annotations

import numpy as np

from static_keras.kernels import member_ranges


class StringMemberRanges:
    """The member-range part of a `StringConstrainedDecoding`.

    Args:
        layout: the index's `StringIndexLayout`.
        weights: the layer's member-range weights.
        eligibility_filter: the layer's `EligibilityFilter`.
        transitions: the layer's `StringTransitions`.
    """

    def __init__(self, layout, weights, eligibility_filter, transitions):
        self.layout = layout
        self.weights = weights
        self.eligibility_filter = eligibility_filter
        self.transitions = transitions

    def weight_shapes(self) -> dict:
        return {"member_lo": (self.layout.num_states,), "member_hi": (self.layout.num_states,)}

    def weight_arrays(self, index) -> dict:
        lo, hi = index.member_ranges(np.arange(self.layout.num_states))
        return {"member_lo": lo.astype(np.int32), "member_hi": hi.astype(np.int32)}

    def ranges(self, states, depth):
        return member_ranges.string_member_ranges(
            self.weights["member_lo"], self.weights["member_hi"], states
        )

    def keep(self, request, edges, step):
        return member_ranges.keep_edges(self, request, edges, step)
