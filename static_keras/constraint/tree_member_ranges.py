"""`TreeMemberRanges`: the members below semantic-ID states, as a layer part.

With eligibility sets a semantic-ID layer holds what its member ranges read
(`member_ranges.tree_member_ranges`): the dense-head boundary table, each
member's depth-d code (for a request's exclusions) and, at the dense
depths whose set rows are derived at decode time, the planes those rows
read (`derived_dense_masks`). This part sizes and fills those weights from
an index, answers `ranges`, and keeps the edge slots of a step whose
targets hold an eligible member (`keep`: at an int step a row's targets are
consecutive, so K + 1 member starts bound its K ranges).

`HostBoundaries` computes the host boundary table of an index once (the
layer settles its eligibility windows from it before its weights exist,
then fills them from it) and drops it once the weights hold it.
"""

from __future__ import annotations

from keras import ops

from static_keras.index import dense_eligibility
from static_keras.index import dense_fields
from static_keras.index.static_index import StaticIndex
from static_keras.kernels import derived_dense_masks
from static_keras.kernels import eligibility_kernels
from static_keras.kernels import member_ranges


class HostBoundaries:
    """The host `dense_boundary_table` of an index and the eligibility
    windows it needs, computed once per index."""

    def __init__(self):
        self._cached = None

    def get(self, index):
        if self._cached is None or self._cached[0] is not index:
            layout = index.layout
            table = dense_eligibility.dense_boundary_table(layout, index.arrays)
            windows = dense_fields.layer_windows(layout, table)
            self._cached = (index, table, windows)
        return self._cached[1:]

    def drop(self) -> None:
        self._cached = None  # 16.8 MB at V = 2048, d = 2: the weights hold it now


def resolve_windows(index, given, d: int, boundaries: HostBoundaries) -> tuple:
    """A layer's eligibility windows: the index's when it is given, else the
    config's (checked), else every depth stored."""
    if given is not None:
        given = tuple(given)
        ints = len(given) == d and all(isinstance(w, int) and w >= 0 for w in given)
        suffix = not (d and given[0]) and all(b or not a for a, b in zip(given, given[1:]))
        if not (ints and suffix):
            raise ValueError(
                f"`eligibility_windows` must be {d} ints >= 0, the first 0 and none 0 "
                f"after a positive one. Received: {list(given)}"
            )
    if isinstance(index, StaticIndex):
        windows = tuple(boundaries.get(index)[1])
        if given is not None and given != windows:
            raise ValueError(
                f"`eligibility_windows`={list(given)} but the index needs {list(windows)}"
            )
        return windows
    return given if given is not None else (0,) * d


class TreeMemberRanges:
    """The member-range part of a semantic-ID layer (see the module doc).

    Args:
        layout: the index's `IndexLayout`.
        windows: the layer's eligibility windows.
        index_weights, weights: the layer's index and member-range weights.
        eligibility_filter: the layer's `EligibilityFilter`.
        transitions: the layer's `TreeTransitions`.
        boundaries: the layer's `HostBoundaries`.
    """

    def __init__(self, layout, windows, index_weights, weights, eligibility_filter, transitions,
                 boundaries):  # fmt: skip
        self.layout = layout
        self.windows = windows
        self.index_weights = index_weights
        self.weights = weights
        self.eligibility_filter = eligibility_filter
        self.transitions = transitions
        self.boundaries = boundaries

    def weight_shapes(self) -> dict:
        layout = self.layout
        d = layout.dense_levels
        size = layout.dense_head_states + layout.vocab_size**d + d + 1 if d else 1
        shapes = {"dense_boundaries": (size,)}
        for t, window in enumerate(self.windows):
            if window:  # what a derived row reads of the index (fixed per code)
                codes = layout.vocab_size**t
                planes = derived_dense_masks.CODE_FIELDS, derived_dense_masks.MASK_FIELDS
                shapes[f"dense_code_fields_{t}"] = (planes[0] * codes, window)
                shapes[f"dense_mask_fields_{t}"] = (planes[1] * codes, layout.mask_words)
        if d:  # each member's depth-d code, for a request's exclusions (last:
            # `load_own_variables` fills it in for layers saved before it)
            shapes["dense_member_codes"] = (max(layout.num_members, 1),)
        return shapes

    def weight_arrays(self, index) -> dict:
        table, _ = self.boundaries.get(index)
        # The index's own layout: a new catalogue in the same capacities
        # (`set_index`) has other used sizes than the one built with.
        arrays = dense_fields.member_range_arrays(index.layout, index.arrays, self.windows, table)
        self.boundaries.drop()
        return arrays

    def ranges(self, states, depth):
        return member_ranges.tree_member_ranges(
            self.layout, self.index_weights["indptr"], self.weights["dense_boundaries"], states,
            depth,
        )  # fmt: skip

    def keep(self, request, edges, step):
        if step is None:
            return member_ranges.keep_edges(self, request, edges, step)
        # A row's edges are consecutive (`SparseStep.slots`), and so are their
        # targets: K + 1 member starts bound the K ranges. Slots past a
        # row's count continue from its first edge (one past the depth's
        # end at most), so the last real slot's end is its next sibling's
        # start. Rows with no edge read any state of the depth (masked).
        layout = self.layout
        depth = step + 1
        width = ops.shape(edges)[1]
        first = self.transitions.edge_targets(edges[:, :1])
        states = first + ops.arange(width + 1, dtype="int32")[None, :]
        start = layout.depth_starts[depth]
        states = ops.clip(states, start, start + layout.level_sizes[depth])
        bounds = member_ranges.tree_member_starts(
            layout, self.index_weights["indptr"], states, depth
        )
        weights = self.eligibility_filter.weights
        return eligibility_kernels.keep_mask_between(
            weights["eligibility_words"], weights["eligibility_directory"], request, bounds
        )
