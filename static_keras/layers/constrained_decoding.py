"""`ConstrainedDecoding`: one STATIC decoding step as a Keras 3 layer."""

from __future__ import annotations

from static_keras.api_export import static_keras_export
from static_keras.constants import INVALID_STATE
from static_keras.constants import MASKED_LOGIT
from static_keras.constants import PAD_TOKEN
from static_keras.constraint import weight_upgrades
from static_keras.constraint.constraint_parts import ConstraintParts
from static_keras.constraint.dense_head import DenseHead
from static_keras.constraint.dense_step_eligibility import DenseStepEligibility
from static_keras.constraint.tree_member_ranges import HostBoundaries
from static_keras.constraint.tree_member_ranges import TreeMemberRanges
from static_keras.constraint.tree_member_ranges import resolve_windows
from static_keras.constraint.tree_transitions import TreeTransitions
from static_keras.index.layout import IndexLayout
from static_keras.index.static_index import StaticIndex
from static_keras.layers.automaton_constraint import AutomatonConstraint

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
      `K_t = min(dense_top_k, B_t)` best valid tokens are kept (`dense_top_k`
      defaults to `B_t`: all of them).
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
        has_item_ids, used_level_sizes: the index layout (see
            `IndexLayout`; `used_level_sizes` only for an index laid out
            with headroom). Taken from
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
        dense_top_k: int or None. Candidates kept per row at a dense step
            (tokens per beam: `beam_search`'s `dense_top_k`). `top_k` is its
            deprecated name.

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
    # Tokens per beam (`dense_top_k`) cap the dense steps, whose width is the
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
        used_level_sizes: list[int] | None = None,
        eligibility_windows: list[int] | None = None,
        **kwargs,
    ):
        self._host_boundaries = HostBoundaries()
        # Per dense depth, 0 (the sets store its mask rows) or the words a
        # derived row reads (`derived_dense_masks`): settled here, before the
        # weights are sized, from the index when given.
        self.eligibility_windows = ()
        if kwargs.get("eligibility") is not None or kwargs.get("eligibility_sets"):
            d = index.layout.dense_levels if isinstance(index, StaticIndex) else dense_levels
            if d is not None:
                self.eligibility_windows = resolve_windows(
                    index, eligibility_windows, d, self._host_boundaries
                )
        layout_fields = {
            "vocab_size": vocab_size,
            "length": length,
            "dense_levels": dense_levels,
            "level_sizes": level_sizes,
            "step_widths": step_widths,
            "has_item_ids": has_item_ids,
        }
        if used_level_sizes is not None:  # a layout with headroom
            layout_fields["used_level_sizes"] = used_level_sizes
        super().__init__(index, layout_fields=layout_fields, **kwargs)

    def _make_parts(self) -> ConstraintParts:
        layout = self.layout
        transitions = TreeTransitions(layout, self.index_weights)
        ranges = TreeMemberRanges(
            layout, self.eligibility_windows, self.index_weights, self.member_range_weights,
            self.eligibility_filter, transitions, self._host_boundaries,
        )  # fmt: skip
        if not layout.dense_levels:
            return ConstraintParts(transitions, member_ranges=ranges)
        eligibility = None
        if self.num_eligibility_sets:
            eligibility = DenseStepEligibility(
                layout, self.eligibility_windows, self.eligibility_weights,
                self.member_range_weights, transitions.depth,
            )  # fmt: skip
        head = DenseHead(
            layout, self.index_weights, self.derived_index_weights,
            None if eligibility is None else eligibility.eligible_words, transitions.depth,
        )  # fmt: skip
        return ConstraintParts(transitions, head, eligibility, ranges)

    @property
    def dense_levels(self) -> int:
        return self.layout.dense_levels

    def get_config(self):
        config = super().get_config()
        if self.num_eligibility_sets and self.layout.dense_levels:
            config["eligibility_windows"] = list(self.eligibility_windows)
        return config

    def load_own_variables(self, store):
        # Files of earlier versions lack weights added since: one explicit step.
        return super().load_own_variables(weight_upgrades.upgraded_store(self, store))
