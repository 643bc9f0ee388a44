"""Keras metrics for retrieval by constrained decoding: `RecallAtK`."""

from static_keras.metrics.recall_at_k import RecallAtK
from static_keras.metrics.recall_at_k import recall_per_row

__all__ = ["RecallAtK", "recall_per_row"]
