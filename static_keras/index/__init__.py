"""Offline index building: NumPy only (no Keras, no TensorFlow)."""

from static_keras.index.layout import IndexLayout
from static_keras.index.static_index import StaticIndex

__all__ = ["IndexLayout", "StaticIndex"]
