"""`constraint_for`: the constraint layer of an index, by its kind."""

from __future__ import annotations

import importlib

from static_keras.index.automaton import TokenAutomaton
from static_keras.layers.automaton_constraint import AutomatonConstraint

#: automaton kind -> "module:Class" of its constraint layer.
LAYER_CLASSES = {
    "semantic_ids": "static_keras.layers.constrained_decoding:ConstrainedDecoding",
    "strings": "static_keras.strings.string_constrained_decoding:StringConstrainedDecoding",
}


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
    module, cls = LAYER_CLASSES[index.kind].split(":")
    return getattr(importlib.import_module(module), cls)(index, name=name)
