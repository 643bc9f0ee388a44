"""`AutomatonConstraint`: one decoding step over any compiled token automaton.

The Keras side of the `TokenAutomaton` contract. The base owns everything
the two kinds share: the index as non-trainable weights
(`constraint/index_weights.py`), `set_index`, `get_config`, the candidates and
mask modes, `advance`, `is_finished`, `item_ids`, the eligibility sets
(`EligibilityFilter`) and the export metadata. A kind supplies its parts
(`ConstraintParts`: transitions, optionally a dense head and its
eligibility, member ranges) from `_make_parts`; which part answers a step
is `AutomatonStep`'s choice (`constraint/automaton_step.py`), and the public
step methods here forward to it.

Steps. A Python int `step` is the fast path: every step has its own static
width `B_t` (what the unrolled beam search uses). A scalar int tensor or
None (any decode loop: `ops.while_loop`, `tf.function`, `jax.jit`, a
keras-hub sampler whose rows are at different steps) uses one width for
every step, the widest, and reads where each row is from its state; the
results are the same.
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from static_keras.constants import MASKED_LOGIT
from static_keras.constraint import index_weights
from static_keras.constraint.automaton_step import AutomatonStep
from static_keras.constraint.constraint_parts import ConstraintParts
from static_keras.constraint.decoding_constraint import NOT_GIVEN
from static_keras.constraint.decoding_constraint import DecodingConstraint
from static_keras.constraint.decoding_constraint import StepProposal
from static_keras.constraint.decoding_constraint import dense_top_k_argument
from static_keras.constraint.eligibility_filter import EligibilityFilter
from static_keras.constraint.sparse_step import SparseStep
from static_keras.index import archive
from static_keras.index.automaton import TokenAutomaton
from static_keras.index.eligibility import EligibilitySets
from static_keras.kernels import gather
from static_keras.layers.eligibility_methods import EligibilityMethods

__all__ = ["AutomatonConstraint"]


class AutomatonConstraint(keras.layers.Layer, EligibilityMethods, DecodingConstraint):
    """Restricts one decoding step to the valid continuations of an automaton.

    Each row (batch x beam) carries an int32 state, 0 at the start. At a
    step the layer reads the allowed tokens of each row with a branch-free,
    fixed-width gather and returns either

    - candidates (`mode="candidates"`): `scores, tokens, next_states`, each
      `[R, K_t]`;
    - masked logits (`mode="mask"`): `[R, V]`, disallowed tokens set to the
      finite `MASKED_LOGIT`; move the states on with `advance`.

    Padding candidates (fewer than `K_t` allowed tokens, or a row whose
    state is `INVALID_STATE`) have token -1, score `-inf` and state -1.

    Subclasses: `ConstrainedDecoding` (semantic IDs) and
    `StringConstrainedDecoding` (string sets); `constraint_for(index)` picks
    the one of an index. See the module docstring for what a kind supplies;
    the methods about eligibility sets come from `EligibilityMethods`.
    """

    #: The host class whose arrays this layer holds, and its layout class.
    index_class: type = TokenAutomaton
    layout_class: type = type(None)
    #: Whether `dense_top_k` caps steps outside a dense head (string sets:
    #: every step's rows come from the vocabulary).
    caps_sparse_steps: bool = True

    def __init__(
        self,
        index=None,
        *,
        layout_fields: dict,
        eligibility: EligibilitySets | None = None,
        eligibility_sets: int = 0,
        eligibility_names=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.eligibility_filter = EligibilityFilter(
            eligibility, eligibility_sets, eligibility_names
        )
        self.layout = layout = index_weights.resolve_layout(
            index, layout_fields, self.index_class, self.layout_class, type(self).__name__
        )
        # The weight groups, filled by `build()` in this order (files keep
        # it): the archive arrays, what the dense head derives from them,
        # the sets and what is derived from them, the member ranges.
        self.index_weights, self.derived_index_weights = {}, {}
        self.eligibility_weights, self.member_range_weights = {}, {}
        parts = self._make_parts()
        self.transitions = parts.transitions
        self.dense_head = parts.dense_head
        self.dense_eligibility = parts.dense_eligibility
        self.member_range_part = parts.member_ranges
        self.sparse_step = SparseStep(self.transitions, self.index_weights)
        self.automaton_step = AutomatonStep(
            layout, parts, self.sparse_step, self.caps_sparse_steps,
            self.check_eligibility, self._sparse_keep,
        )  # fmt: skip
        self._pending_index = index
        self.build()

    def build(self, input_shape=None):
        if self.built:
            return
        # With an index at hand its arrays are the weights' initial values
        # (one copy: no zeros first); without one (a `.keras` file loading)
        # the weights start at zeros and the file's values are assigned.
        index, self._pending_index = self._pending_index, None
        values = (None, None, None) if index is None else self._weight_arrays(index)
        shapes = self.layout.array_shapes()
        index_weights.add_weights(self.add_weight, shapes, self.index_weights, values[0])
        derived = {} if self.dense_head is None else self.dense_head.weight_shapes()
        index_weights.add_weights(self.add_weight, derived, self.derived_index_weights, values[1])
        self._build_eligibility(values[2])
        if self.eligibility_filter.pending is not None:
            self._assign_eligibility(self.eligibility_filter.pending, index)
            self.eligibility_filter.pending = None
        self.built = True

    def set_index(self, index: TokenAutomaton) -> None:
        """Loads the arrays of `index`, which must have this layer's layout."""
        if not isinstance(index, self.index_class):
            raise ValueError(
                f"`index` must be a {self.index_class.__name__}. Received: {type(index).__name__}"
            )
        if _graph_shape(index.layout) != _graph_shape(self.layout):
            raise ValueError(
                "The index does not match this layer: index layout "
                f"{index.layout.to_config()} vs layer layout {self.layout.to_config()}"
            )
        arrays, derived, member_ranges = self._weight_arrays(index)
        self.layout = index.layout  # used sizes of a layout with headroom
        index_weights.assign_arrays(self.index_weights, arrays)
        index_weights.assign_arrays(self.derived_index_weights, derived)
        index_weights.assign_arrays(self.member_range_weights, member_ranges)

    def load_own_variables(self, store):
        # Each file value handed to its weight without TensorFlow's two
        # conversion copies, one weight at a time; the zeros they replace
        # were never resident (`index_weights.add_weights`).
        store = index_weights.SharedValues(store)
        wanted = index_weights.weights_to_load(self)
        if wanted is None:
            return super().load_own_variables(store)
        if len(store) != len(self.weights):
            raise ValueError(
                f"Layer {self.name!r} expects {len(self.weights)} weights; the file holds "
                f"{len(store)}"
            )
        wanted = {id(weight) for weight in wanted}
        for position, weight in enumerate(self.weights):
            if id(weight) in wanted:
                weight.assign(store[str(position)])

    def _weight_arrays(self, index) -> tuple[dict, dict, dict]:
        """The values of the index weights, of those the dense head derives
        from them and of the member ranges (where the layer holds sets)."""
        derived = {} if self.dense_head is None else self.dense_head.weight_arrays(index.arrays)
        ranges = self.member_range_part.weight_arrays(index) if self.num_eligibility_sets else {}
        return index.shared_arrays(), derived, ranges

    def get_config(self):
        config = super().get_config()
        config.update(self.layout.to_config())
        if self.num_eligibility_sets:
            config["eligibility_sets"] = self.num_eligibility_sets
            names = self.eligibility_names
            config["eligibility_names"] = None if names is None else list(names)
        return config

    def _build_eligibility(self, member_range_values=None) -> None:
        # Set weights, those a kind derives from the sets, then its member
        # ranges: the order files hold them in.
        part = self.dense_eligibility
        derived = {} if part is None else part.mask_shapes(self.num_eligibility_sets)
        self.eligibility_weights.update(
            self.eligibility_filter.add_weights(self.add_weight, self.layout.num_members, derived)
        )
        if not self.num_eligibility_sets:
            return
        shapes = {n: (s, np.int32) for n, s in self.member_range_part.weight_shapes().items()}
        index_weights.add_weights(
            self.add_weight, shapes, self.member_range_weights, member_range_values
        )

    def index_arrays(self) -> dict[str, np.ndarray]:
        """The device arrays this layer holds, as NumPy arrays of the layout's dtypes."""
        return index_weights.read_arrays(self.index_weights, self.layout.array_shapes())

    def index_metadata(self) -> dict:
        """Format, kind, layout, counts and checksum of the index (for export)."""
        return archive.metadata(self.index_class.kind, self.layout, self.index_arrays())

    # Properties ------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return self.layout.vocab_size

    @property
    def length(self) -> int:
        return self.layout.length

    @property
    def step_widths(self) -> tuple[int, ...]:
        return self.layout.step_widths

    @property
    def eos_token_id(self) -> int | None:
        return self.layout.eos_token_id

    @property
    def has_item_ids(self) -> bool:
        return self.layout.has_item_ids

    # Decoding ----------------------------------------------------------------

    def call(self, logits, states, step=None, mode: str = "candidates", dense_top_k=None,
             eligibility=None, *, top_k=NOT_GIVEN):  # fmt: skip
        dense_top_k = dense_top_k_argument(dense_top_k, top_k, "layer")
        if mode == "candidates":
            return self.candidates(logits, states, step, dense_top_k, eligibility=eligibility)
        if mode == "mask":
            return self.mask_logits(logits, states, step, eligibility=eligibility)
        raise ValueError(f"`mode` must be 'candidates' or 'mask'. Received: mode={mode!r}")

    def num_candidates(self, step=None, dense_top_k: int | None = None, *,
                       top_k=NOT_GIVEN) -> int:  # fmt: skip
        """K_t: candidates per row returned at `step` (the widest for a tensor
        step or None) for `dense_top_k` tokens per beam (`top_k`: its
        deprecated name)."""
        dense_top_k = dense_top_k_argument(dense_top_k, top_k, "num_candidates")
        return self.automaton_step.num_candidates(step, dense_top_k)

    def candidates(self, logits, states, step=None, dense_top_k: int | None = None,
                   eligibility=None, *, top_k=NOT_GIVEN):  # fmt: skip
        """`(scores, tokens, next_states)`, each `[R, K_t]`; see the class doc.

        `dense_top_k`: int or None, tokens kept per row where it caps the
        step (`top_k`: its deprecated name); None keeps every allowed token.

        `eligibility`: None, or an `Eligibility(set_ids int32 [R], excluded int32
        [R, E])` (either may be None): a candidate is kept only if a member of set
        `set_ids[r]` (-1: any member) that is not in `excluded[r]` (member
        numbers padded with `num_members`, `MemberCatalogue.exclusion_members`)
        lies below its next state. Filtered before `dense_top_k`, so the kept
        candidates are the best eligible ones. Needs eligibility sets.
        """
        dense_top_k = dense_top_k_argument(dense_top_k, top_k, "candidates")
        return self.automaton_step.candidates(logits, states, step, dense_top_k, eligibility)

    def propose(self, log_probs, states, step, dense_top_k=None, *, eligibility=None,
                need_next_states=False, rank_rows=False,
                top_k=NOT_GIVEN) -> StepProposal:  # fmt: skip
        """`DecodingConstraint.propose`: at a dense-head int step, the whole
        masked vocabulary (where the search ranks whole rows) or candidates
        without next states; elsewhere `candidates`."""
        dense_top_k = dense_top_k_argument(dense_top_k, top_k, "propose")
        return self.automaton_step.propose(
            log_probs,
            states,
            step,
            dense_top_k,
            eligibility=eligibility,
            need_next_states=need_next_states,
            rank_rows=rank_rows,
        )

    def candidate_tokens(self, logits, states, step=None, dense_top_k: int | None = None,
                         eligibility=None, *, top_k=NOT_GIVEN):  # fmt: skip
        """`(scores, tokens)` of `candidates` at a dense-head int step, whose
        next states are reads of the dense state map (one per candidate:
        `advance` the survivors instead); None elsewhere. `dense_top_k`,
        `eligibility` (and the deprecated `top_k`): as in `candidates`."""
        dense_top_k = dense_top_k_argument(dense_top_k, top_k, "candidate_tokens")
        return self.automaton_step.candidate_tokens(logits, states, step, dense_top_k, eligibility)

    def vocabulary_scores(self, log_probs, states, step, eligibility=None):
        """`[R, V]` scores, `-inf` where disallowed, at a dense-head int step;
        None elsewhere (`propose` then uses `candidates`).
        `eligibility`: as in `candidates`."""
        return self.automaton_step.vocabulary_scores(log_probs, states, step, eligibility)

    def allowed_mask(self, states, step=None, eligibility=None):
        """bool `[R, V]`: the allowed next tokens of each row.

        `eligibility`: as in `candidates`; then only tokens whose next state
        has an eligible, non-excluded member below are allowed.
        """
        return self.automaton_step.allowed_mask(states, step, eligibility)

    def advance(self, states, tokens, step=None):
        """int32 `[R]`: the state after appending `tokens [R]`.

        A token that is not allowed gives `INVALID_STATE`. The sparse part is
        a branch-free binary search in each row's sorted tokens (`SparseStep`).
        """
        return self.automaton_step.advance(states, tokens, step)

    def mask_logits(self, logits, states, step=None, eligibility=None):
        """float32 `[R, V]`: `logits` with disallowed tokens set to `MASKED_LOGIT`
        (`eligibility`: as in `allowed_mask`)."""
        allowed = self.allowed_mask(states, step, eligibility)
        return ops.where(allowed, ops.cast(logits, "float32"), MASKED_LOGIT)

    def is_finished(self, states):
        """bool: whether each state completes a member (a leaf of a semantic-ID
        trie, an accept state of a string set)."""
        states = ops.cast(states, "int32")
        return ops.logical_and(
            ops.greater_equal(states, self.layout.first_member_state),
            ops.less(states, self.layout.state_space),
        )

    def item_ids(self, states):
        """int `[...]`: item ids of finished states, -1 for the others."""
        if not self.layout.has_item_ids:
            raise ValueError("The index of this layer was built without `item_ids`")
        finished = self.is_finished(states)
        member = ops.where(finished, ops.cast(states, "int32") - self.layout.first_member_state, 0)
        ids = gather.take(self.index_weights[self.layout.member_ids_array], member)
        return ops.where(finished, ids, ops.cast(-1, ids.dtype))

    # What a kind supplies ----------------------------------------------------

    def _make_parts(self) -> ConstraintParts:
        """The kind's parts, made once from `self.layout` before any weight
        exists (they read the weight groups, which `build()` fills)."""
        raise NotImplementedError


def _graph_shape(layout):
    """What a layer's graph is traced from (a layout with headroom takes any
    catalogue within its capacities)."""
    shape = getattr(layout, "graph_shape", None)
    return layout if shape is None else shape()
