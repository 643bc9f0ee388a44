"""The layers of a model that export and refresh look at, through public API.

Keras' `model.layers` lists a functional model's own layers; nested models
are walked into, and a `ConstrainedBeamSearch` contributes its constraint
(the layer that holds the index weights). No private Keras API.
"""

from __future__ import annotations

from collections.abc import Iterator

import keras

from static_keras.decoding.constrained_beam_search import ConstrainedBeamSearch
from static_keras.layers.automaton_constraint import AutomatonConstraint


def model_layers(model: keras.Model) -> Iterator[keras.layers.Layer]:
    """Every layer of `model`, nested models and search constraints included."""
    for layer in model.layers:
        yield layer
        if isinstance(layer, keras.Model):
            yield from model_layers(layer)
        if isinstance(layer, ConstrainedBeamSearch) and layer.constraint is not None:
            yield layer.constraint


def beam_searches(model: keras.Model) -> list[ConstrainedBeamSearch]:
    return [layer for layer in model_layers(model) if isinstance(layer, ConstrainedBeamSearch)]


def constraints(model: keras.Model) -> list[AutomatonConstraint]:
    """The automaton constraints of `model`, each once."""
    found = []
    for layer in model_layers(model):
        if isinstance(layer, AutomatonConstraint) and all(layer is not f for f in found):
            found.append(layer)
    return found
