"""`ConstrainedDecoding`: one STATIC decoding step as a Keras 3 layer."""

from __future__ import annotations

from keras import ops

from static_keras.api_export import static_keras_export
from static_keras.constants import INVALID_STATE
from static_keras.constants import MASKED_LOGIT
from static_keras.constants import PAD_TOKEN
from static_keras.index import dense_eligibility
from static_keras.index.layout import IndexLayout
from static_keras.index.static_index import StaticIndex
from static_keras.layers import dense_edge_rows
from static_keras.layers import dense_step_eligibility
from static_keras.layers import derived_dense_masks
from static_keras.layers import eligibility_step
from static_keras.layers import gather
from static_keras.layers import weight_upgrades
from static_keras.layers.automaton_constraint import AutomatonConstraint
from static_keras.layers.dense_head import DenseHead
from static_keras.layers.dense_step_eligibility import DenseStepEligibility

__all__ = ["INVALID_STATE", "MASKED_LOGIT", "PAD_TOKEN", "ConstrainedDecoding"]


@static_keras_export
class ConstrainedDecoding(AutomatonConstraint):
    """Restricts one decoding step to the valid continuations of a `StaticIndex`.

    The semantic-ID kind of `AutomatonConstraint`. Each row (batch x beam)
    carries an int32 decoding state (`StaticIndex.walk`): a dense-head state
    is its own mask row, a tail state its CSR row. At step `t` the layer
    reads the valid next tokens of each row with a branch-free, fixed-width
    gather and returns either

    - candidates (`mode="candidates"`): `scores, tokens, next_states`, each
      `[R, K_t]`. In the CSR tail `K_t = B_t` (`index.step_widths[t]`): the
      vectorised node transition kernel gathers `B_t` slots from each row's
      CSR start and masks the slots past its end. In the dense head (the first
      `dense_levels` steps) the bit-packed mask row is unpacked and the
      `K_t = min(top_k, B_t)` best valid tokens are kept (`top_k` defaults to
      `B_t`: all of them).
    - masked logits (`mode="mask"`): `[R, V]`, invalid tokens set to
      `MASKED_LOGIT`; advance the states with `advance(states, tokens, step)`.

    Padding candidates (a row with fewer than `K_t` valid tokens, or a row
    whose state is `INVALID_STATE`) have token -1, score `-inf` and next state
    -1. The initial state of every row is 0.

    The index arrays are non-trainable weights created in `build()` from the
    layout integers in the config; their values come from the `index`
    argument (not part of the config), or from a `.keras` file's weights.

    Args:
        index: `StaticIndex` or None. The valid set. When None, the layout
            arguments below must be given and the weights are loaded later
            (this is how `from_config` rebuilds the layer).
        vocab_size, length, dense_levels, level_sizes, step_widths,
        has_item_ids: the index layout (see `IndexLayout`). Taken from
            `index` when it is given; if given too they must match it.
        eligibility: `EligibilitySets` or None. Sets a request can be
            restricted to (`candidates(..., eligibility=...)`); refresh them
            in place with `set_eligibility`.
        eligibility_sets, eligibility_names: int and list of str: how many
            sets the layer holds and their names (from `eligibility` when
            given; what the config keeps). 0 (the default) adds no weights.
        eligibility_windows: list of `dense_levels` ints or None: per dense
            depth, 0 (the sets store its mask rows) or the words of set bits
            a row derived at decode time reads
            (`layers.derived_dense_masks`). Chosen from `index` when it is
            given (derived where stored rows would cost more than half a
            bit per member); what the config keeps. None without an index:
            every depth stored.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        logits: float `[R, V]`, scores of the next token (log-probs or
            logits; cast to float32).
        states: int32 `[R]`, states after the prefix of each row.
        step: the number of tokens decoded: a Python int in `[0, length)`
            (the fast path: static per-step widths), or a scalar int tensor
            or None (inside `ops.while_loop`, `tf.function`, `jax.jit` or a
            sampler whose rows are at different steps: the widest step's
            shapes, each row's depth read from its state; same results).
        mode: `"candidates"` or `"mask"`. Defaults to `"candidates"`.
        top_k: int or None. Candidates kept per row at a dense step.

    Returns:
        `"candidates"`: tuple `(scores float32, tokens int32, next_states
        int32)`, each `[R, K_t]`. `"mask"`: float32 `[R, V]`.

    Example:

    >>> import numpy as np
    >>> index = StaticIndex.build([[1, 2], [1, 3], [0, 2]], vocab_size=4)
    >>> layer = ConstrainedDecoding(index)
    >>> logits = np.log(np.full((1, 4), 0.25, "float32"))
    >>> scores, tokens, states = layer(logits, np.zeros(1, "int32"), step=0)
    >>> sorted(np.asarray(tokens)[0].tolist())
    [0, 1]
    >>> masked = layer(logits, np.asarray(index.walk([[1]]), "int32"), mode="mask")
    >>> (np.asarray(masked)[0] > -1e8).tolist()  # step=None: read from the state
    [False, False, True, True]

    References:
        Su et al., "Vectorizing the Trie: Efficient Constrained Decoding for
        LLM-based Generative Retrieval on Accelerators" (arXiv:2602.22647).
    """

    index_class = StaticIndex
    layout_class = IndexLayout
    # Tokens per beam (`top_k`) cap the dense steps, whose width is the
    # vocabulary; a CSR step returns its B_t slots, as in the reference.
    caps_sparse_steps = False

    def __init__(
        self,
        index: StaticIndex | None = None,
        *,
        vocab_size: int | None = None,
        length: int | None = None,
        dense_levels: int | None = None,
        level_sizes: list[int] | None = None,
        step_widths: list[int] | None = None,
        has_item_ids: bool | None = None,
        eligibility_windows: list[int] | None = None,
        **kwargs,
    ):
        self._host_boundaries = None
        # Per dense depth, 0 (the sets store its mask rows) or the words a
        # derived row reads (`derived_dense_masks`): settled here, before the
        # weights are sized, from the index when given.
        self.eligibility_windows = ()
        if kwargs.get("eligibility") is not None or kwargs.get("eligibility_sets"):
            d = index.layout.dense_levels if isinstance(index, StaticIndex) else dense_levels
            if d is not None:
                self.eligibility_windows = self._resolve_windows(index, eligibility_windows, d)
        layout_fields = {
            "vocab_size": vocab_size,
            "length": length,
            "dense_levels": dense_levels,
            "level_sizes": level_sizes,
            "step_widths": step_widths,
            "has_item_ids": has_item_ids,
        }
        super().__init__(index, layout_fields=layout_fields, **kwargs)
        layout = self.layout
        self.dense_step_eligibility = None
        if layout.dense_levels and self.num_eligibility_sets:
            self.dense_step_eligibility = DenseStepEligibility(
                layout, self.eligibility_windows, self.eligibility_weights,
                self.member_range_weights, self._depth,
            )  # fmt: skip
        if layout.dense_levels:
            part = self.dense_step_eligibility
            self.dense_head = DenseHead(
                layout, self.index_weights, self.derived_index_weights,
                None if part is None else part.eligible_words, self._depth,
            )  # fmt: skip
        # Per-depth constants of the any-step kernels (tensor step or None).
        depths = range(layout.length + 1)
        self._depth_tables = {
            "depth_start": list(layout.depth_starts),
            "has_indptr": [t in layout.indptr_offsets for t in depths],
            "indptr_offset": [layout.indptr_offsets.get(t, 0) for t in depths],
            "edge_offset": [layout.edge_offsets.get(t, 0) for t in depths],
        }

    @property
    def dense_levels(self) -> int:
        return self.layout.dense_levels

    def get_config(self):
        config = super().get_config()
        if self.num_eligibility_sets and self.layout.dense_levels:
            config["eligibility_windows"] = list(self.eligibility_windows)
        return config

    # Kernels -----------------------------------------------------------------

    def _depth(self, states):
        """Tokens decoded to reach each (non-negative) state: one comparison per
        depth against `layout.depth_starts`, as `StaticIndex.depth` does."""
        depth = ops.zeros_like(states)
        for start in self.layout.depth_starts[1:]:
            depth = depth + ops.cast(ops.greater_equal(states, start), "int32")
        return depth

    def _rows(self, states, step):
        """CSR row of each tail state: `(start, count)`, count 0 elsewhere."""
        layout = self.layout
        if step is not None:
            valid = ops.greater(states, INVALID_STATE)
            first = layout.dense_head_states + layout.tail_state_offsets[step]
            local = ops.where(valid, states - first, 0)
            if step in layout.indptr_offsets:
                rows = layout.indptr_offsets[step] + local
                indptr = self.index_weights["indptr"]
                start = ops.cast(gather.take(indptr, rows), "int32")
                count = ops.cast(gather.take(indptr, rows + 1), "int32") - start
            else:  # every state at this depth has exactly one child
                start = layout.edge_offsets[step] + local
                count = ops.ones_like(start)
            return start, ops.where(valid, count, 0)
        # Any step: each row's depth from its state, then per-depth constants.
        inner = ops.logical_and(
            ops.greater_equal(states, layout.dense_head_states),
            ops.less(states, layout.first_leaf_state),
        )
        states = ops.where(inner, states, layout.dense_head_states)
        depth = self._depth(states)
        table = {k: ops.convert_to_tensor(v, "int32") for k, v in self._depth_tables.items()}
        local = states - gather.take(table["depth_start"], depth)
        start = gather.take(table["edge_offset"], depth) + local
        count = ops.ones_like(start)
        if layout.indptr_offsets:
            indptr = self.index_weights["indptr"]
            last = indptr.shape[0] - 2
            rows = ops.clip(gather.take(table["indptr_offset"], depth) + local, 0, last)
            row_start = ops.cast(gather.take(indptr, rows), "int32")
            row_count = ops.cast(gather.take(indptr, rows + 1), "int32") - row_start
            branching = ops.cast(gather.take(table["has_indptr"], depth), "bool")
            start = ops.where(branching, row_start, start)
            count = ops.where(branching, row_count, count)
        return ops.where(inner, start, 0), ops.where(inner, count, 0)

    def _derived_index_shapes(self):
        return dense_edge_rows.shapes(self.layout)

    def _derived_index_arrays(self, arrays):
        if not self.derived_index_weights:
            return {}
        return dense_edge_rows.arrays(self.layout, arrays["dense_states"])

    def eligibility_refresh_spec(self) -> dict:
        """Also the dense-step masks (`eligibility_dense`), derived from the
        sets and the index's `dense_boundaries`, for the depths that store
        them (`eligibility_windows`; the others derive at decode time)."""
        spec = super().eligibility_refresh_spec()
        if "eligibility_dense" in self.eligibility_weights:
            spec["rewrites"]["eligibility_dense"] = self.eligibility_weights["eligibility_dense"]
            spec["reads"]["dense_boundaries"] = self.member_range_weights["dense_boundaries"]
            spec["derive"] = {
                "vocab_size": self.layout.vocab_size,
                "dense_levels": self.layout.dense_levels,
                "stored_levels": self.eligibility_windows.count(0),
            }
        return spec

    def _member_range_shapes(self):
        layout = self.layout
        d = layout.dense_levels
        size = layout.dense_head_states + layout.vocab_size**d + d + 1 if d else 1
        shapes = {"dense_boundaries": (size,)}
        for t, window in enumerate(self.eligibility_windows):
            if window:  # what a derived row reads of the index (fixed per code)
                codes = layout.vocab_size**t
                planes = derived_dense_masks.CODE_FIELDS, derived_dense_masks.MASK_FIELDS
                shapes[f"dense_code_fields_{t}"] = (planes[0] * codes, window)
                shapes[f"dense_mask_fields_{t}"] = (planes[1] * codes, layout.mask_words)
        if d:  # each member's depth-d code, for a request's exclusions (last:
            # `load_own_variables` fills it in for layers saved before it)
            shapes["dense_member_codes"] = (max(layout.num_members, 1),)
        return shapes

    def load_own_variables(self, store):
        # Files of earlier versions lack weights added since: one explicit step.
        return super().load_own_variables(weight_upgrades.upgraded_store(self, store))

    def _member_range_arrays(self, index):
        if not self.num_eligibility_sets:
            return {}
        layout = self.layout
        table, _ = self._boundaries_and_windows(index)
        offsets = dense_eligibility.dense_boundary_offsets(layout)
        for t, held in enumerate(self.eligibility_windows):
            if not held:  # stored rows fit any index
                continue
            size = layout.vocab_size**t
            needed = derived_dense_masks.widest_range(table[offsets[t] : offsets[t] + size + 1])
            if needed > held:
                raise ValueError(
                    f"The index does not fit this layer's eligibility windows: a code of "
                    f"depth {t} needs {needed} words, the layer reads {held} "
                    f"({list(self.eligibility_windows)}); build a layer for this index"
                )
        arrays = {"dense_boundaries": table}
        if layout.dense_levels:
            arrays["dense_member_codes"] = dense_eligibility.dense_member_codes(layout, table)
        for t, window in enumerate(self.eligibility_windows):
            if window:
                fields = derived_dense_masks.code_fields(
                    layout.vocab_size, layout.num_members, table, offsets, t, window
                )
                first = layout.dense_mask_offsets[t]
                rows = index.arrays["dense_masks"][first : first + layout.vocab_size**t]
                masks = derived_dense_masks.mask_fields(rows)
                arrays[f"dense_code_fields_{t}"] = derived_dense_masks.planes_first(fields)
                arrays[f"dense_mask_fields_{t}"] = derived_dense_masks.planes_first(masks)
        self._drop_host_boundaries()
        return arrays

    def _boundaries_and_windows(self, index):
        """The host `dense_boundary_table` of `index` and the eligibility
        windows it needs (computed once per index)."""
        if self._host_boundaries is None or self._host_boundaries[0] is not index:
            layout = index.layout
            table = dense_eligibility.dense_boundary_table(layout, index.arrays)
            windows = derived_dense_masks.eligibility_windows(
                layout.vocab_size,
                layout.dense_levels,
                layout.num_members,
                table,
                dense_eligibility.dense_boundary_offsets(layout),
            )
            self._host_boundaries = (index, table, windows)
        return self._host_boundaries[1:]

    def _drop_host_boundaries(self):
        self._host_boundaries = None  # 16.8 MB at V = 2048, d = 2: weights hold it now

    def _resolve_windows(self, index, given, d: int):
        """The layer's eligibility windows: the index's when it is given,
        else the config's (checked), else every depth stored."""
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
            windows = tuple(self._boundaries_and_windows(index)[1])
            if given is not None and given != windows:
                raise ValueError(
                    f"`eligibility_windows`={list(given)} but the index needs {list(windows)}"
                )
            return windows
        return given if given is not None else (0,) * d

    def _sparse_keep(self, eligibility, edges, step):
        if step is None:
            return super()._sparse_keep(eligibility, edges, step)
        # A row's edges are consecutive (`_sparse_slots`), and so are their
        # targets: K + 1 member starts bound the K ranges. Slots past a
        # row's count continue from its first edge (one past the depth's
        # end at most), so the last real slot's end is its next sibling's
        # start. Rows with no edge read any state of the depth (masked).
        layout = self.layout
        depth = step + 1
        width = ops.shape(edges)[1]
        states = self._edge_targets(edges[:, :1]) + ops.arange(width + 1, dtype="int32")[None, :]
        start = layout.depth_starts[depth]
        states = ops.clip(states, start, start + layout.level_sizes[depth])
        bounds = eligibility_step.tree_member_starts(
            layout, self.index_weights["indptr"], states, depth
        )
        return eligibility_step.keep_mask_between(
            self.eligibility_weights["eligibility_words"],
            self.eligibility_weights["eligibility_directory"],
            eligibility,
            bounds,
        )

    def _member_ranges(self, states, depth):
        return eligibility_step.tree_member_ranges(
            self.layout,
            self.index_weights["indptr"],
            self.member_range_weights["dense_boundaries"],
            states,
            depth,
        )

    def _eligibility_mask_shapes(self):
        if not self.layout.dense_levels:
            return {}
        windows = self.eligibility_windows
        return dense_step_eligibility.mask_shapes(self.layout, windows, self.num_eligibility_sets)

    def _eligibility_mask_arrays(self, eligibility_sets):
        if not self.layout.dense_levels:
            return {}
        return dense_step_eligibility.mask_arrays(
            self.layout,
            self.eligibility_windows,
            self.eligibility_weights,
            self.member_range_weights,
            eligibility_sets,
        )

    def _dense_exclusions(self, set_ids, members, before):
        """The codes of each dense depth a request's exclusions empty, found
        once per decode (`DenseStepEligibility.exclusions`), or None."""
        part = self.dense_step_eligibility
        return None if part is None else part.exclusions(set_ids, members, before)

    def _same_members(self, step) -> bool:
        # A tree's members all end at depth L: an only child holds all of
        # its parent's members. Step 0 has no entered parent to rely on.
        return step is not None and step > 0 and self.layout.step_widths[step] == 1

    def _edge_targets(self, edges):
        # Tree numbering: edge k leads to tail state n_d + k.
        layout = self.layout
        return edges + (layout.dense_head_states + layout.level_sizes[layout.dense_levels])
