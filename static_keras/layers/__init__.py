"""Keras 3 layers: the per-step constraint (one base, two kinds) and a
reference step decoder."""

from static_keras.lazy_names import lazy_names

# name -> the module that defines it, imported on first use with TensorFlow's
# harmless start-up lines filtered (static_keras.tensorflow_log_lines)
_LAZY = {
    "AutomatonConstraint": "static_keras.layers.automaton_constraint",
    "CachedTransformerDecoder": "static_keras.layers.cached_transformer_decoder",
    "TeacherForcing": "static_keras.layers.cached_transformer_decoder",
    "ConstrainedDecoding": "static_keras.layers.constrained_decoding",
    "DecodingConstraint": "static_keras.constraint.decoding_constraint",
    "constraint_for": "static_keras.layers.layer_classes",
}
__getattr__, __dir__ = lazy_names(__name__, _LAZY)

__all__ = [
    "AutomatonConstraint",
    "CachedTransformerDecoder",
    "ConstrainedDecoding",
    "DecodingConstraint",
    "TeacherForcing",
    "constraint_for",
]
