"""Keras 3 layers: the per-step constraint and a reference step decoder."""

from static_keras.layers.cached_transformer_decoder import CachedTransformerDecoder
from static_keras.layers.cached_transformer_decoder import TeacherForcing
from static_keras.layers.constrained_decoding import ConstrainedDecoding

__all__ = ["CachedTransformerDecoder", "ConstrainedDecoding", "TeacherForcing"]
