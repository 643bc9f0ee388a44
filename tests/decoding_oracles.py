"""Oracles and execution modes shared by the decoding tests (no tests here).

- `compiled_modes()`: the ways a function runs under the current backend
  (eager; TF graph and XLA; JAX jit), so one oracle test covers each;
- a deterministic "model" for semantic IDs: `random_table` plus
  `prefix_logits` (logits as a function of the prefix, no two rows tie),
  and `exhaustive_ranking`, the brute-force answer of a beam search as wide
  as the valid set.
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

TABLE_ROWS = 97
_WEIGHTS = np.array([31, 17, 13, 7, 5, 3, 2, 11])


def compiled_modes(jax_jit: bool = True):
    """Yields `(name, wrap)`: `wrap(f)` runs `f` in that mode."""
    yield "eager", lambda f: f
    backend = keras.config.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        yield "graph", lambda f: tf.function(f, autograph=False)
        yield "xla", lambda f: tf.function(f, jit_compile=True, autograph=False)
    elif backend == "jax" and jax_jit:
        import jax

        yield "jit", jax.jit


def random_table(vocab: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(TABLE_ROWS, vocab)).astype("float32")


def prefix_logits(table):
    """A deterministic logits function of the prefix (no two rows tie)."""

    def logits_of(prefix):
        t = prefix.shape[1]
        weights = ops.convert_to_tensor(np.array(_WEIGHTS[:t].tolist() or [0], "int32"))
        code = ops.sum(ops.cast(prefix, "int32") * weights[:t], axis=1) + 29 * t
        return ops.take(table, code % TABLE_ROWS, axis=0)

    return logits_of


def exhaustive_ranking(sequences, table):
    """Every valid sequence with its total log-softmax score under
    `prefix_logits(table)`, best first."""
    log_probs = table - np.log(np.exp(table - table.max(1, keepdims=True)).sum(1, keepdims=True))
    log_probs -= table.max(1, keepdims=True)
    scores = np.zeros(len(sequences), np.float32)
    for t in range(sequences.shape[1]):
        code = (sequences[:, :t] * _WEIGHTS[:t]).sum(1) + 29 * t
        scores += log_probs[code % TABLE_ROWS, sequences[:, t]]
    order = np.argsort(-scores, kind="stable")
    return sequences[order], scores[order]
