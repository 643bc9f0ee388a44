"""`AutomatonConstraint`: one decoding step over any compiled token automaton.

The Keras side of the `TokenAutomaton` contract. The base owns everything
the two kinds share: index tensors as non-trainable weights created in
`build()` from the layout integers of the config, `set_index`,
`get_config`, the candidates and mask modes, `advance`, `is_finished`,
`item_ids` and the export metadata. A kind supplies its parts
(`ConstraintParts`, from `_make_parts`, called once after the layout is
known and before any weight exists; the parts read the weight groups,
which `build()` fills):

- its transitions (where a state's CSR row is and where an edge leads),
  which the shared sparse kernels (`layers/sparse_step.py`) read;
- optionally a bit-packed dense head (`layers/dense_head.py`, semantic IDs),
  which answers the steps it covers and derives weights from the index,
  and the eligibility of those steps (`layers/dense_step_eligibility.py`),
  which derives weights from the sets;
- its member ranges (`layers/tree_member_ranges.py`,
  `strings/string_member_ranges.py`), which eligibility sets read: the
  weights they need, the range below a state, the edge slots to keep.

Which part answers a step is `AutomatonStep`'s choice
(`layers/automaton_step.py`); the public step methods here forward to it.

Steps. A Python int `step` is the fast path: every step has its own static
width `B_t` (what the unrolled beam search uses). A scalar int tensor or
None (any decode loop: `ops.while_loop`, `tf.function`, `jax.jit`, a
keras-hub sampler whose rows are at different steps) uses one width for
every step, the widest, and reads where each row is from its state; the
results are the same.
"""

from __future__ import annotations

import dataclasses
import importlib

import keras
import numpy as np
from keras import ops

from static_keras.constants import MASKED_LOGIT
from static_keras.index import archive
from static_keras.index.automaton import TokenAutomaton
from static_keras.index.eligibility import EligibilitySets
from static_keras.index.member_catalogue import MemberCatalogue
from static_keras.index.member_catalogue import catalogue_fingerprint
from static_keras.layers import eligibility_request
from static_keras.layers import gather
from static_keras.layers.automaton_step import AutomatonStep
from static_keras.layers.decoding_constraint import DecodingConstraint
from static_keras.layers.decoding_constraint import StepProposal
from static_keras.layers.eligibility_filter import EligibilityFilter
from static_keras.layers.sparse_step import SparseStep

__all__ = ["AutomatonConstraint", "ConstraintParts", "constraint_for"]

#: automaton kind -> "module:Class" of its constraint layer.
LAYER_CLASSES = {
    "semantic_ids": "static_keras.layers.constrained_decoding:ConstrainedDecoding",
    "strings": "static_keras.strings.string_constrained_decoding:StringConstrainedDecoding",
}


def constraint_for(index, name: str | None = None) -> "AutomatonConstraint":
    """The constraint layer of `index` (a `TokenAutomaton`); a layer is returned as is.

    Example:

    >>> from static_keras import StaticIndex
    >>> layer = constraint_for(StaticIndex.build([[0, 1]], vocab_size=2))
    >>> type(layer).__name__
    'ConstrainedDecoding'
    """
    if isinstance(index, AutomatonConstraint):
        return index
    if not isinstance(index, TokenAutomaton):
        raise ValueError(
            "`index` must be a TokenAutomaton (StaticIndex, StringIndex) or an "
            f"AutomatonConstraint layer. Received: {type(index).__name__}"
        )
    module, cls = LAYER_CLASSES[index.kind].split(":")
    return getattr(importlib.import_module(module), cls)(index, name=name)


@dataclasses.dataclass
class ConstraintParts:
    """What a kind supplies to `AutomatonConstraint` (see the module doc).

    transitions: `rows`, `edge_targets`, `width`, `same_members`
        (`layers/sparse_step.py`).
    dense_head: a `DenseHead`, or None: no dense head.
    dense_eligibility: a `DenseStepEligibility`, or None: the dense head's
        steps need no eligibility weights of their own.
    member_ranges: `weight_shapes()`, `weight_arrays(index)`,
        `ranges(states, depth)`, `keep(request, edges, step)`: what
        eligibility sets read of the kind's states.
    """

    transitions: object
    dense_head: object = None
    dense_eligibility: object = None
    member_ranges: object = None


class AutomatonConstraint(keras.layers.Layer, DecodingConstraint):
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
    the one of an index. See the module docstring for what a kind supplies.
    """

    #: The host class whose arrays this layer holds, and its layout class.
    index_class: type = TokenAutomaton
    layout_class: type = type(None)
    #: Whether `top_k` caps steps outside a dense head (string sets: every
    #: step's rows come from the vocabulary).
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
        name = type(self).__name__
        self.eligibility_filter = EligibilityFilter(
            eligibility, eligibility_sets, eligibility_names
        )
        if index is not None:
            if not isinstance(index, self.index_class):
                raise ValueError(
                    f"`index` must be a {self.index_class.__name__}. "
                    f"Received: {type(index).__name__}"
                )
            layout = index.layout
            expected = layout.to_config()
            for field, value in layout_fields.items():
                if value is None:
                    continue
                value = list(value) if isinstance(value, (list, tuple)) else value
                if value != expected[field]:
                    raise ValueError(
                        f"The index does not match this layer: `{field}` is "
                        f"{expected[field]} in the index and {value} in the layer"
                    )
        else:
            missing = [field for field, value in layout_fields.items() if value is None]
            if missing:
                raise ValueError(
                    f"{name} needs an `index`, or every layout argument to load one "
                    f"into. Missing: {missing}"
                )
            layout = self.layout_class.create(**layout_fields)
        if layout.state_space > np.iinfo(np.int32).max:
            raise ValueError(
                f"The index has {layout.state_space} decoding states; int32 states hold "
                f"at most {np.iinfo(np.int32).max}"
            )
        self.layout = layout
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
        for name, (shape, dtype) in self.layout.array_shapes().items():
            self.index_weights[name] = self.add_weight(
                name=name,
                shape=shape,
                dtype=_device_dtype(dtype),
                initializer="zeros",
                trainable=False,
            )
        derived = {} if self.dense_head is None else self.dense_head.weight_shapes()
        for name, (shape, dtype) in derived.items():
            self.derived_index_weights[name] = self.add_weight(
                name=name, shape=shape, dtype=_device_dtype(dtype), initializer="zeros",
                trainable=False,
            )  # fmt: skip
        self._build_eligibility()
        if self._pending_index is not None:
            self.set_index(self._pending_index)
            self._pending_index = None
        if self.eligibility_filter.pending is not None:
            self.set_eligibility(self.eligibility_filter.pending)
            self.eligibility_filter.pending = None
        self.built = True

    def set_index(self, index: TokenAutomaton) -> None:
        """Loads the arrays of `index`, which must have this layer's layout."""
        if not isinstance(index, self.index_class):
            raise ValueError(
                f"`index` must be a {self.index_class.__name__}. Received: {type(index).__name__}"
            )
        if index.layout != self.layout:
            raise ValueError(
                "The index does not match this layer: index layout "
                f"{index.layout.to_config()} vs layer layout {self.layout.to_config()}"
            )
        for name, array in index.arrays.items():
            weight = self.index_weights[name]
            values = array.astype(weight.dtype, copy=False)
            if values.dtype != array.dtype and not np.array_equal(values, array):
                raise ValueError(
                    f"Index array {name!r} holds values beyond {weight.dtype}; "
                    "on JAX enable 64-bit with jax_enable_x64"
                )
            weight.assign(values)
        if self.dense_head is not None:
            for name, array in self.dense_head.weight_arrays(index.arrays).items():
                self.derived_index_weights[name].assign(array)
        if self.num_eligibility_sets:
            for name, array in self.member_range_part.weight_arrays(index).items():
                self.member_range_weights[name].assign(array)

    def get_config(self):
        config = super().get_config()
        config.update(self.layout.to_config())
        if self.num_eligibility_sets:
            config["eligibility_sets"] = self.num_eligibility_sets
            names = self.eligibility_names
            config["eligibility_names"] = None if names is None else list(names)
        return config

    # Eligibility sets ---------------------------------------------------------

    def _build_eligibility(self) -> None:
        # Set weights, those a kind derives from the sets, then its member
        # ranges: the order files hold them in.
        part = self.dense_eligibility
        derived = {} if part is None else part.mask_shapes(self.num_eligibility_sets)
        self.eligibility_weights.update(
            self.eligibility_filter.add_weights(self.add_weight, self.layout.num_members, derived)
        )
        if not self.num_eligibility_sets:
            return
        for name, shape in self.member_range_part.weight_shapes().items():
            self.member_range_weights[name] = self.add_weight(
                name=name, shape=shape, dtype="int32", initializer="zeros", trainable=False
            )

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
        fingerprint = (
            self.catalogue_fingerprint() if isinstance(eligibility_sets, EligibilitySets) else ""
        )
        part = self.dense_eligibility
        derived = (lambda sets: {}) if part is None else part.mask_arrays
        self.eligibility_filter.assign(
            eligibility_sets, self.layout.num_members, fingerprint, derived
        )

    def eligibility_refresh_spec(self) -> dict:
        """What an eligibility-only refresh of an exported model rewrites.

        `{"rewrites": {role: variable}, "reads": {role: variable}, "derive":
        dict or None}`: the variables holding the sets (roles
        `eligibility_words`, `eligibility_directory`), any variables derived
        from them with what they are derived from (`reads`) and how
        (`derive`: the settings of the host builder). The roles are the
        names an exported model's metadata records (`export.eligibility`).
        """
        if not self.num_eligibility_sets:
            raise ValueError("This layer holds no eligibility sets")
        names = ("eligibility_words", "eligibility_directory")
        spec = {"rewrites": {n: self.eligibility_weights[n] for n in names}, "reads": {},
                "derive": None}  # fmt: skip
        if self.dense_eligibility is not None:
            self.dense_eligibility.extend_refresh_spec(spec)
        return spec

    def member_item_ids(self) -> np.ndarray:
        """int64 `[num_members]`: the catalogue item id of each member (the
        member number itself for an index without item ids)."""
        if not self.has_item_ids:
            return np.arange(self.layout.num_members, dtype=np.int64)
        weight = self.index_weights[self.layout.member_ids_array]
        return np.asarray(ops.convert_to_numpy(weight)).astype(np.int64)

    def catalogue(self) -> MemberCatalogue:
        """The `MemberCatalogue` of the index this layer holds."""
        ids = self.member_item_ids() if self.has_item_ids else None
        return MemberCatalogue(ids, self.layout.num_members)

    def catalogue_fingerprint(self) -> str:
        """The fingerprint of this index's member -> item id map: eligibility
        sets over another one are refused (`EligibilitySets.require_catalogue`)."""
        ids = self.member_item_ids() if self.has_item_ids else None
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
        """`(set_ids, excluded)` checked against this layer's sets and `rows`
        (the rows they must have, where known; a ValueError or TypeError
        names the problem) and set out for the steps of a decode
        (`eligibility_request.RequestEligibility`, returned as is if given)."""
        return self.eligibility_filter.check(
            eligibility, self.layout.num_members, self._dense_exclusions, rows
        )

    def _dense_exclusions(self, set_ids, members, before):
        # What the dense steps read of a request's exclusions, once per decode.
        part = self.dense_eligibility
        return None if part is None else part.exclusions(set_ids, members, before)

    def _sparse_keep(self, eligibility, edges, step):
        """bool `[R, B]`: whether each edge slot's target keeps an eligible,
        non-excluded member (`SparseStep.slots` edges; padding slots: any)."""
        return self.member_range_part.keep(eligibility, edges, step)

    def index_arrays(self) -> dict[str, np.ndarray]:
        """The device arrays this layer holds, as NumPy arrays of the layout's dtypes."""
        shapes = self.layout.array_shapes()
        return {
            name: np.asarray(ops.convert_to_numpy(weight)).astype(shapes[name][1], copy=False)
            for name, weight in self.index_weights.items()
        }

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

    def call(self, logits, states, step=None, mode: str = "candidates", top_k=None,
             eligibility=None):  # fmt: skip
        if mode == "candidates":
            return self.candidates(logits, states, step, top_k=top_k, eligibility=eligibility)
        if mode == "mask":
            return self.mask_logits(logits, states, step, eligibility=eligibility)
        raise ValueError(f"`mode` must be 'candidates' or 'mask'. Received: mode={mode!r}")

    def num_candidates(self, step=None, top_k: int | None = None) -> int:
        """K_t: candidates per row returned at `step` (the widest for a tensor
        step or None)."""
        return self.automaton_step.num_candidates(step, top_k)

    def candidates(self, logits, states, step=None, top_k: int | None = None, eligibility=None):
        """`(scores, tokens, next_states)`, each `[R, K_t]`; see the class doc.

        `eligibility`: None, or `(set_ids int32 [R], excluded int32 [R, E])`
        (either may be None): a candidate is kept only if a member of set
        `set_ids[r]` (-1: any member) that is not in `excluded[r]` (member
        numbers padded with `num_members`, `MemberCatalogue.exclusion_members`)
        lies below its next state. Filtered before `top_k`, so the kept
        candidates are the best eligible ones. Needs eligibility sets.
        """
        return self.automaton_step.candidates(logits, states, step, top_k, eligibility)

    def propose(self, log_probs, states, step, top_k, *, eligibility=None,
                need_next_states=False, rank_rows=False) -> StepProposal:  # fmt: skip
        """`DecodingConstraint.propose`: at a dense-head int step, the whole
        masked vocabulary (where the search ranks whole rows) or candidates
        without next states; elsewhere `candidates`."""
        return self.automaton_step.propose(
            log_probs,
            states,
            step,
            top_k,
            eligibility=eligibility,
            need_next_states=need_next_states,
            rank_rows=rank_rows,
        )

    def candidate_tokens(self, logits, states, step=None, top_k: int | None = None,
                         eligibility=None):  # fmt: skip
        """`(scores, tokens)` of `candidates` at a dense-head int step, whose
        next states are reads of the dense state map (one per candidate:
        `advance` the survivors instead); None elsewhere. `eligibility`: as
        in `candidates`."""
        return self.automaton_step.candidate_tokens(logits, states, step, top_k, eligibility)

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


def _device_dtype(dtype: np.dtype) -> str:
    """int64 arrays stay int64 unless the backend cannot hold them (JAX x32)."""
    if dtype == np.int64 and keras.config.backend() == "jax":
        import jax

        if not jax.config.jax_enable_x64:
            return "int32"
    return np.dtype(dtype).name
