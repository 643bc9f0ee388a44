"""static-keras: STATIC constrained decoding for Keras 3 and TensorFlow Serving.

Importing the package registers its Keras layers, so `keras.saving.load_model`
finds them. The modules under `static_keras.index` themselves import NumPy
only (no Keras, no TensorFlow), which keeps index building testable alone.
"""

from static_keras.decoding.beam_search import beam_search
from static_keras.decoding.constrained_beam_search import ConstrainedBeamSearch
from static_keras.index.layout import IndexLayout
from static_keras.index.static_index import StaticIndex
from static_keras.layers.cached_transformer_decoder import CachedTransformerDecoder
from static_keras.layers.cached_transformer_decoder import TeacherForcing
from static_keras.layers.constrained_decoding import INVALID_STATE
from static_keras.layers.constrained_decoding import MASKED_LOGIT
from static_keras.layers.constrained_decoding import PAD_TOKEN
from static_keras.layers.constrained_decoding import ConstrainedDecoding
from static_keras.strings import StringConstrainedDecoding
from static_keras.strings import StringIndex
from static_keras.strings import StringLogitsProcessor
from static_keras.strings import TokenVocabulary

__version__ = "0.1.0"

__all__ = [
    "CachedTransformerDecoder",
    "ConstrainedBeamSearch",
    "ConstrainedDecoding",
    "INVALID_STATE",
    "IndexLayout",
    "MASKED_LOGIT",
    "PAD_TOKEN",
    "StaticIndex",
    "StringConstrainedDecoding",
    "StringIndex",
    "StringLogitsProcessor",
    "TeacherForcing",
    "TokenVocabulary",
    "beam_search",
]
