"""`StringConstrainedDecoding`: one decoding step over a `StringIndex`."""

from __future__ import annotations

from static_keras.api_export import static_keras_export
from static_keras.constraint.constraint_parts import ConstraintParts
from static_keras.layers.automaton_constraint import AutomatonConstraint
from static_keras.strings.layout import StringIndexLayout
from static_keras.strings.string_index import StringIndex
from static_keras.strings.string_member_ranges import StringMemberRanges
from static_keras.strings.string_transitions import StringTransitions


@static_keras_export
class StringConstrainedDecoding(AutomatonConstraint):
    """Restricts one decoding step to the tokens that keep spelling a member.

    The string-set kind of `AutomatonConstraint`, with the same contract as
    `ConstrainedDecoding`, so `beam_search`, `ConstrainedBeamSearch`, the
    keras-hub samplers and SavedModel export take either. Each row carries
    an int32 state (0 at the start); at step `t` the layer gathers `B_t` slots from the row's CSR
    start (the vectorised node transition kernel), masks slots past the
    row's end, and returns

    - candidates (`mode="candidates"`): `scores, tokens, next_states`, each
      `[R, K_t]` with `K_t = min(dense_top_k, B_t)` (`dense_top_k` defaults
      to `B_t`);
    - masked logits (`mode="mask"`): `[R, V]`, disallowed tokens set to the
      finite `MASKED_LOGIT`; advance the states with `advance`.

    EOS is a candidate where the prefix is a complete member; it leads to
    the member's accept state, which allows only EOS again (a fixed-length
    loop keeps padding with EOS). `eos_token_id` tells `beam_search` to stop
    beams at EOS; `item_ids(states)` maps accept states to the position of
    the member in the caller's list. Padding candidates have token -1,
    score `-inf` and state -1. A scalar tensor step or `step=None` uses the
    widest row of any step: a stateless constraint for any decode loop, at
    any step.

    Index arrays are non-trainable weights created in `build()` from the
    layout integers of the config; their values come from `index` (not part
    of the config) or from a `.keras` file's weights.

    Args:
        index: `StringIndex` or None. When None, the layout arguments must be
            given and the weights loaded later (this is how `from_config`
            rebuilds the layer).
        vocab_size, length, eos_token_id, num_states, num_edges, num_members,
        step_widths, max_width: the layout (see `StringIndexLayout`); taken
            from `index` when it is given.
        eligibility, eligibility_sets, eligibility_names: eligibility sets
            a request can be restricted to, as in `ConstrainedDecoding`. Exact
            when `index.member_ranges_exact` (a vocabulary with every single
            byte); otherwise a state's range may cover an eligible member that
            is not reachable from it.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        logits: float `[R, V]`, scores of the next token (cast to float32).
        states: int32 `[R]`.
        step: Python int in `[0, length)` (static per-step widths), or a
            scalar int tensor or None (the widest step; same results).
        mode: `"candidates"` or `"mask"`. Defaults to `"candidates"`.
        dense_top_k: int or None. Candidates kept per row (tokens per beam:
            `beam_search`'s `dense_top_k`). `top_k` is its deprecated name.

    Returns:
        `"candidates"`: `(scores float32, tokens int32, next_states int32)`,
        each `[R, K_t]`. `"mask"`: float32 `[R, V]`.

    Example:

    >>> import numpy as np
    >>> from static_keras.strings import TokenVocabulary
    >>> vocab = TokenVocabulary.from_token_bytes([b"a", b"b", b"ab", b"."],
    ...                                          special=[3])
    >>> index = StringIndex.from_strings(["ab", "b"], vocab, eos_token_id=3)
    >>> layer = StringConstrainedDecoding(index)
    >>> logits = np.zeros((1, 4), "float32")
    >>> _, tokens, states = layer(logits, np.zeros(1, "int32"), step=0)
    >>> sorted(np.asarray(tokens)[0].tolist())
    [0, 1, 2]

    References:
        Xu and Bouyarmane, "Trie Automata for Constrained Decoding over Large
        Finite Sets" (arXiv:2608.12574).
    """

    index_class = StringIndex
    layout_class = StringIndexLayout

    def __init__(
        self,
        index: StringIndex | None = None,
        *,
        vocab_size: int | None = None,
        length: int | None = None,
        eos_token_id: int | None = None,
        num_states: int | None = None,
        num_edges: int | None = None,
        num_members: int | None = None,
        step_widths: list[int] | None = None,
        max_width: int | None = None,
        **kwargs,
    ):
        layout_fields = {
            "vocab_size": vocab_size,
            "length": length,
            "eos_token_id": eos_token_id,
            "num_states": num_states,
            "num_edges": num_edges,
            "num_members": num_members,
            "step_widths": step_widths,
            "max_width": max_width,
        }
        super().__init__(index, layout_fields=layout_fields, **kwargs)

    def _make_parts(self) -> ConstraintParts:
        transitions = StringTransitions(self.layout, self.index_weights)
        ranges = StringMemberRanges(
            self.layout, self.member_range_weights, self.eligibility_filter, transitions
        )
        return ConstraintParts(transitions, member_ranges=ranges)
