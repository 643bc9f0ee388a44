"""Decode loops over the constraint layer: a function and a Keras layer."""

from static_keras.tensorflow_log_lines import import_quietly

# Keras first, with TensorFlow's harmless start-up lines filtered. (Not lazy
# names: `beam_search` is both a submodule and the function it defines.)
import_quietly("keras")

from static_keras.decoding.beam_search import beam_search  # noqa: E402
from static_keras.decoding.constrained_beam_search import ConstrainedBeamSearch  # noqa: E402

__all__ = ["ConstrainedBeamSearch", "beam_search"]
