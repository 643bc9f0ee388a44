"""`EligibilityMethods`: the eligibility API of a constraint layer.

What `AutomatonConstraint` offers about the sets it holds: refresh them in
place, read them back, check a request, the member ranges and catalogue
they are over. Every method reads the layer's parts (`eligibility_filter`,
`dense_eligibility`, `member_range_part`) and its index weights; none is a
hook a kind overrides. Kept apart from the layer's construction and step
methods so each file reads as one concern.
"""

from __future__ import annotations

import numpy as np
from keras import ops

from static_keras.constraint import eligibility_request
from static_keras.index.eligibility import EligibilitySets
from static_keras.index.member_catalogue import MemberCatalogue
from static_keras.index.member_catalogue import catalogue_fingerprint
from static_keras.kernels import execution_plan


class EligibilityMethods:
    """The eligibility sets of an `AutomatonConstraint` (see the module doc)."""

    @property
    def num_eligibility_sets(self) -> int:
        return self.eligibility_filter.num_sets

    @property
    def eligibility_names(self):
        return self.eligibility_filter.names

    def set_eligibility(self, eligibility_sets: EligibilitySets) -> None:
        """Assigns new set bits in place (a refresh: no rebuild, no retrace).

        The sets must be over this index's members, as many as the layer
        holds, with the same names (a set id means the same set before and
        after); a layer built without names takes these.
        """
        self._assign_eligibility(eligibility_sets, None)

    def _assign_eligibility(self, eligibility_sets, index) -> None:
        """`set_eligibility`; with the `index` the layer is being built from,
        the catalogue's fingerprint comes from its host arrays instead of a
        read of the weights (a copy of every item id)."""
        fingerprint = ""
        if isinstance(eligibility_sets, EligibilitySets):
            fingerprint = self.catalogue_fingerprint(index)
        part = self.dense_eligibility
        derived = (lambda sets: {}) if part is None else part.mask_arrays
        self.eligibility_filter.assign(
            eligibility_sets, self.layout.num_members, fingerprint, derived
        )

    def eligibility_refresh_spec(self) -> dict:
        """What an eligibility-only refresh of an exported model rewrites
        (`EligibilityFilter.refresh_spec`)."""
        return self.eligibility_filter.refresh_spec(self.dense_eligibility)

    def member_item_ids(self) -> np.ndarray:
        """int64 `[num_members]`: the catalogue item id of each member (the
        member number itself for an index without item ids)."""
        if not self.has_item_ids:
            return np.arange(self.layout.num_members, dtype=np.int64)
        weight = self.index_weights[self.layout.member_ids_array]
        ids = execution_plan.current().primitives.host_array(weight)  # a view where shared
        return ids.astype(np.int64, copy=False)

    def catalogue(self) -> MemberCatalogue:
        """The `MemberCatalogue` of the index this layer holds."""
        ids = self.member_item_ids() if self.has_item_ids else None
        return MemberCatalogue(ids, self.layout.num_members)

    def catalogue_fingerprint(self, index=None) -> str:
        """The fingerprint of this index's member -> item id map: eligibility
        sets over another one are refused (`EligibilitySets.require_catalogue`).
        `index`: the index the layer holds, whose host arrays give the item
        ids without reading them back from the weights."""
        if index is not None and index.layout != self.layout:
            raise ValueError(
                "`index` must be the index this layer holds; its layout differs: "
                f"{index.layout.to_config()} vs {self.layout.to_config()}"
            )
        ids = None
        if self.has_item_ids and index is not None:
            ids = index.arrays[self.layout.member_ids_array]
        elif self.has_item_ids:
            ids = self.member_item_ids()
        return catalogue_fingerprint(ids, self.layout.num_members)

    def eligibility_sets(self) -> EligibilitySets:
        """The sets this layer holds, as a host `EligibilitySets` (a copy)."""
        return self.eligibility_filter.held_sets(ops.convert_to_numpy, self.catalogue())

    def member_ranges(self, states, depth: int | None = None):
        """`(lo, hi)` int32, shape of `states`: the members below each state
        (`TokenAutomaton.member_ranges` on the device; needs eligibility sets).
        `depth`: a Python int when every valid state has that depth."""
        if not self.num_eligibility_sets:
            raise ValueError("Member ranges live with the eligibility sets: eligibility_sets=0")
        return self.member_range_part.ranges(ops.cast(states, "int32"), depth)

    def check_eligibility(self, eligibility, rows=None) -> eligibility_request.RequestEligibility:
        """An `Eligibility` checked against this layer's sets and `rows`
        (the rows they must have, where known; a ValueError or TypeError
        names the problem) and set out for the steps of a decode
        (`eligibility_request.RequestEligibility`, or the subclass its
        dense steps read; returned as is if given)."""
        part = self.dense_eligibility  # the semantic-ID dense head's, or None
        extend = None if part is None else part.extend
        return self.eligibility_filter.check(eligibility, self.layout.num_members, extend, rows)

    def _sparse_keep(self, eligibility, edges, step):
        """bool `[R, B]`: whether each edge slot's target keeps an eligible,
        non-excluded member (`SparseStep.slots` edges; padding slots: any)."""
        return self.member_range_part.keep(eligibility, edges, step)
