"""Keras metrics for retrieval by constrained decoding: `RecallAtK`."""

from static_keras.lazy_names import lazy_names

# name -> the module that defines it, imported on first use with TensorFlow's
# harmless start-up lines filtered (static_keras.tensorflow_log_lines)
_LAZY = {
    "RecallAtK": "static_keras.metrics.recall_at_k",
    "recall_per_row": "static_keras.metrics.recall_at_k",
}
__getattr__, __dir__ = lazy_names(__name__, _LAZY)

__all__ = ["RecallAtK", "recall_per_row"]
