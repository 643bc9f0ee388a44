"""Keras 3 layers: the per-step constraint (one base, two kinds) and a
reference step decoder."""

from static_keras.layers.automaton_constraint import AutomatonConstraint
from static_keras.layers.cached_transformer_decoder import CachedTransformerDecoder
from static_keras.layers.cached_transformer_decoder import TeacherForcing
from static_keras.layers.constrained_decoding import ConstrainedDecoding
from static_keras.layers.decoding_constraint import DecodingConstraint
from static_keras.layers.layer_classes import constraint_for

__all__ = [
    "AutomatonConstraint",
    "CachedTransformerDecoder",
    "ConstrainedDecoding",
    "DecodingConstraint",
    "TeacherForcing",
    "constraint_for",
]
