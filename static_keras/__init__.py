"""static-keras: STATIC constrained decoding for Keras 3 and TensorFlow Serving.

The top-level names load on first use (PEP 562), so that the offline side
(`static_keras.index`, the string compiler in `static_keras.strings`) imports
NumPy only: an index-building job never pays for Keras and TensorFlow.

Keras layers register for `.keras` loading when their module is imported
(any top-level layer name does it); in a process that has used none yet,
load with `static_keras.saving.load_model(path)` (or call
`static_keras.saving.register_layers()` before `keras.saving.load_model`).
"""

from static_keras.lazy_names import lazy_names

__version__ = "0.1.0"

# name -> the module that defines it
_LAZY = {
    "CachedTransformerDecoder": "static_keras.layers.cached_transformer_decoder",
    "TeacherForcing": "static_keras.layers.cached_transformer_decoder",
    "AutomatonConstraint": "static_keras.layers.automaton_constraint",
    "constraint_for": "static_keras.layers.layer_classes",
    "DecodingConstraint": "static_keras.constraint.decoding_constraint",
    "Eligibility": "static_keras.constraint.eligibility_request",
    "TokenAutomaton": "static_keras.index.automaton",
    "load_index": "static_keras.index",
    "ConstrainedDecoding": "static_keras.layers.constrained_decoding",
    "ConstrainedBeamSearch": "static_keras.decoding.constrained_beam_search",
    "beam_search": "static_keras.decoding.beam_search",
    "IndexLayout": "static_keras.index.layout",
    "StaticIndex": "static_keras.index.static_index",
    "INVALID_STATE": "static_keras.constants",
    "MASKED_LOGIT": "static_keras.constants",
    "PAD_TOKEN": "static_keras.constants",
    "RecallAtK": "static_keras.metrics.recall_at_k",
    "StringConstrainedDecoding": "static_keras.strings.string_constrained_decoding",
    "StringIndex": "static_keras.strings.string_index",
    "StringLogitsProcessor": "static_keras.strings.logits_processor",
    "TokenVocabulary": "static_keras.strings.vocabulary",
}

__all__ = sorted(_LAZY)


__getattr__, __dir__ = lazy_names(__name__, _LAZY)
