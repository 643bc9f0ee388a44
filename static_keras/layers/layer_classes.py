"""`constraint_for`: the constraint layer of an index, by its kind."""

from __future__ import annotations

from static_keras.index.automaton import TokenAutomaton
from static_keras.layers.automaton_constraint import AutomatonConstraint


def layer_classes() -> dict[str, type]:
    """automaton kind -> its constraint layer class. Importing a kind's layer
    module registers it with Keras; the string kind's is imported only here
    (a model of semantic IDs never loads it)."""
    from static_keras.layers.constrained_decoding import ConstrainedDecoding
    from static_keras.strings.string_constrained_decoding import StringConstrainedDecoding

    return {"semantic_ids": ConstrainedDecoding, "strings": StringConstrainedDecoding}


def constraint_for(index, name: str | None = None) -> AutomatonConstraint:
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
    return layer_classes()[index.kind](index, name=name)
