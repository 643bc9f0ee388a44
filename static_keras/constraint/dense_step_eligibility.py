"""A request's eligibility at the dense-head steps of a semantic-ID index.

At a dense step a row reads no ranks: each set carries a mask row per
dense-head state, stored (`eligibility_dense`, built on the host by
`index.dense_eligibility`) at the depths where that is cheap, derived at
decode time at the others (`derived_dense_masks`, from planes the index
fixes); the codes a request's exclusions empty are found once per decode
and cleared from the row. `DenseStepEligibility` holds those kernels for
one layer (the `DenseHead` asks it for each row's eligible words) and sizes
and fills the masks they read; `DenseRequestEligibility` is a request as
these steps read it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from keras import ops

from static_keras.constraint import eligibility_request
from static_keras.index import dense_eligibility
from static_keras.kernels import dense_exclusions
from static_keras.kernels import derived_dense_masks
from static_keras.kernels import gather


@dataclasses.dataclass(frozen=True)
class DenseRequestEligibility(eligibility_request.RequestEligibility):
    """A request set out for a semantic-ID index's steps: the shared fields,
    and the dense-head codes its exclusions empty.

    Fields (beyond `RequestEligibility`'s):
        dense_excluded: int32 `[R / group, d, E + 1]` or None (no
            exclusions): per dense depth, the codes the row's exclusions
            empty (`blocked_dense_codes`), padded; one row per `group` rows.
    """

    dense_excluded: Any = None

    def dense_excluded_rows(self):
        """`dense_excluded` with one row per row (repeated if grouped)."""
        if self.group == 1:
            return self.dense_excluded
        return ops.repeat(self.dense_excluded, self.group, axis=0)


class DenseStepEligibility:
    """The dense-step eligibility kernels of one layer.

    Args:
        layout: the index's `IndexLayout` (`dense_levels > 0`).
        windows: per dense depth, 0 (stored mask rows) or the words a
            derived row reads (`eligibility_windows`).
        eligibility_weights, member_range_weights: the layer's weights.
        depth: `states -> int32`, the tokens decoded to reach each state.
    """

    def __init__(self, layout, windows, eligibility_weights, member_range_weights, depth):
        self.layout = layout
        self.eligibility_windows = windows
        self.eligibility_weights = eligibility_weights
        self.member_range_weights = member_range_weights
        self.depth = depth

    def eligible_words(self, states, valid, step, request, index_words):
        """int32 `[R, mask_words]`: the bits of codes below each dense-head
        state (in range; `valid` says which rows have one) with an
        eligible, non-excluded member. `index_words`: the states' own rows."""
        layout = self.layout
        words = -1  # all bits
        if request.set_ids is not None:
            set_ids = request.set_ids
            restricted = ops.greater_equal(set_ids, 0)
            set_rows = ops.where(restricted, set_ids, 0)
            words = self.set_words(states, step, set_rows, index_words)
            words = ops.where(restricted[:, None], words, -1)
            words = ops.where(ops.greater_equal(set_ids, -1)[:, None], words, 0)
        if getattr(request, "dense_excluded", None) is not None:
            if step is not None and request.group > 1:
                cleared = dense_exclusions.grouped_blocked_words(
                    request.dense_excluded[:, step, :],
                    ops.where(valid, states - layout.dense_mask_offsets[step], -1),
                    request.group,
                    layout.vocab_size,
                    layout.mask_words,
                )
            else:
                cleared = self.blocked_words(states, step, request)
            words = ops.bitwise_and(words, ops.bitwise_invert(cleared))
        return words

    def set_words(self, states, step, set_rows, index_words):
        """int32 `[R, mask_words]`: each dense-head state's mask row in its
        row's set: read at a stored depth, derived at the others."""
        layout, windows = self.layout, self.eligibility_windows
        rows = derived_dense_masks.stored_rows(layout.vocab_size, windows)
        masks = self.eligibility_weights["eligibility_dense"]  # [sets, rows, words]

        def stored(at):
            return gather.take_cells(masks, set_rows, at)

        if step is not None:
            if not windows[step]:
                return stored(states)
            parents = ops.maximum(states - layout.dense_mask_offsets[step], 0)
            return self.derived_words(step, parents, set_rows, index_words)
        levels = windows.count(0)
        if levels == layout.dense_levels:
            return stored(states)
        depth = self.depth(states)
        words = stored(ops.minimum(states, rows - 1))
        for t in range(levels, layout.dense_levels):
            here = ops.equal(depth, t)
            parents = ops.where(here, states - layout.dense_mask_offsets[t], 0)
            derived = self.derived_words(t, parents, set_rows, index_words)
            words = ops.where(here[:, None], derived, words)
        return words

    def derived_words(self, depth, parents, set_rows, index_words):
        weights = self.member_range_weights
        at = dense_eligibility.dense_boundary_offsets(self.layout)[depth] + parents
        first_word = ops.right_shift(gather.take(weights["dense_boundaries"], at), 5)
        return derived_dense_masks.derived_words(
            self.eligibility_weights["eligibility_words"],
            derived_dense_masks.plane_rows(
                weights[f"dense_code_fields_{depth}"], derived_dense_masks.CODE_FIELDS, parents
            ),
            derived_dense_masks.mask_rows(
                weights[f"dense_mask_fields_{depth}"], parents, index_words
            ),
            first_word,
            set_rows,
            index_words,
        )

    def blocked_words(self, states, step, request):
        """`dense_exclusions.blocked_words` of each row's own exclusions."""
        layout = self.layout
        dense_excluded = request.dense_excluded_rows()
        if step is not None:
            blocked = dense_excluded[:, step, :]
            parent = states - layout.dense_mask_offsets[step]
        else:
            depth = ops.minimum(self.depth(states), layout.dense_levels - 1)
            flat = ops.reshape(dense_excluded, (-1, ops.shape(dense_excluded)[2]))
            rows = ops.arange(ops.shape(states)[0], dtype="int32") * layout.dense_levels
            blocked = gather.take(flat, rows + depth)
            starts = ops.convert_to_tensor(list(layout.depth_starts), "int32")
            parent = states - gather.take(starts, depth)
        return dense_exclusions.blocked_words(blocked, parent, layout.vocab_size, layout.mask_words)

    def extend(self, request) -> DenseRequestEligibility:
        """`request` with the codes of each dense depth its exclusions
        empty (`blocked_dense_codes`), found once per decode."""
        if request.excluded is None:
            return DenseRequestEligibility(**_fields(request))
        members = request.excluded
        layout = self.layout
        table = self.member_range_weights["dense_boundaries"]
        offsets = dense_eligibility.dense_boundary_offsets(layout)
        real = ops.less(members, layout.num_members)
        codes = dense_exclusions.dense_codes(
            self.member_range_weights["dense_member_codes"], members, real
        )
        blocked = dense_exclusions.blocked_dense_codes(
            self.eligibility_weights["eligibility_words"],
            self.eligibility_weights["eligibility_directory"],
            request,
            codes,
            table,
            offsets,
            layout.vocab_size,
        )
        return DenseRequestEligibility(**_fields(request), dense_excluded=blocked)

    def mask_shapes(self, num_sets: int) -> dict:
        """The shape of the stored dense-step masks (`eligibility_dense`)."""
        layout = self.layout
        rows = derived_dense_masks.stored_rows(layout.vocab_size, self.eligibility_windows)
        return {"eligibility_dense": (num_sets, rows, layout.mask_words)}

    def mask_arrays(self, sets) -> dict:
        """Their values for `sets` (sets whose words did not change keep their rows)."""
        weights = self.eligibility_weights
        boundaries = ops.convert_to_numpy(self.member_range_weights["dense_boundaries"])
        current = (
            ops.convert_to_numpy(weights["eligibility_words"]),
            ops.convert_to_numpy(weights["eligibility_dense"]),
        )
        masks = dense_eligibility.dense_eligibility_masks(
            self.layout.vocab_size,
            self.layout.dense_levels,
            boundaries,
            sets,
            current,
            stored_levels=self.eligibility_windows.count(0),
        )
        return {"eligibility_dense": masks}

    def extend_refresh_spec(self, spec: dict) -> None:
        """Adds the dense-step masks to an eligibility refresh: derived from
        the sets and the index's `dense_boundaries` for the depths that
        store them (the others derive at decode time)."""
        spec["rewrites"]["eligibility_dense"] = self.eligibility_weights["eligibility_dense"]
        spec["reads"]["dense_boundaries"] = self.member_range_weights["dense_boundaries"]
        spec["derive"] = {
            "vocab_size": self.layout.vocab_size,
            "dense_levels": self.layout.dense_levels,
            "stored_levels": self.eligibility_windows.count(0),
        }


def _fields(request) -> dict:
    return {f.name: getattr(request, f.name) for f in dataclasses.fields(request)}
