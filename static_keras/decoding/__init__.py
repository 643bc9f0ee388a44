"""Decode loops over the constraint layer: a function and a Keras layer."""

from static_keras.decoding.beam_search import beam_search
from static_keras.decoding.constrained_beam_search import ConstrainedBeamSearch

__all__ = ["ConstrainedBeamSearch", "beam_search"]
