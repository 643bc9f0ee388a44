"""`CpuTrie`: a Python dict trie on the host, queried through a host callback."""

from __future__ import annotations

import sys

import keras
import numpy as np
from keras import ops

from static_keras.baselines._common import check_step
from static_keras.baselines._common import num_candidates
from static_keras.baselines._common import pad_invalid
from static_keras.constraint.decoding_constraint import DecodingConstraint
from static_keras.index.input_checks import validate_sequences

_LEAF = -1  # child id stored for a last token: leaves hold no dict


class CpuTrie(DecodingConstraint):
    """Constrained decoding the way GENRE and `prefix_allowed_tokens_fn` do it.

    The valid set lives on the host as a trie of Python dicts (one
    `{token: child}` dict per inner node, as GENRE's `Trie` nests them). At
    every step the decode graph calls back into Python
    (`tf.numpy_function` on TensorFlow, `jax.pure_callback` on JAX), which
    walks each row to its node and builds the allowed-token mask
    (`mask[row, list(node)] = True`, what Hugging Face's
    `PrefixConstrainedLogitsProcessor` does with the list the function
    returns); the device masks the log-probs and keeps the best
    `min(dense_top_k, V)` tokens.

    One round trip per step: a row's state packs its parent node and the
    token it appended (`node * (V + 1) + token + 1`, int64; the initial
    state 0 is the root), and the callback resolves that child with one dict
    lookup before building the mask. The callback cannot be compiled by XLA;
    run it in a plain `tf.function` or eagerly.

    Memory is Python objects: about 300 bytes per inner node (1.9 GB for a
    million random 8-token IDs), so tens of millions of items do not fit in
    a workstation's RAM.

    Args:
        sequences: int array-like `[N, L]`, the valid set.
        vocab_size: int, V.

    Example:

    >>> import numpy as np
    >>> trie = CpuTrie([[1, 2], [1, 3], [0, 2]], vocab_size=4)
    >>> trie.allowed_tokens(np.zeros(1, "int64"))[0].nonzero()[0].tolist()
    [0, 1]

    References:
        De Cao et al., "Autoregressive Entity Retrieval" (GENRE, ICLR 2021);
        Su et al., "Vectorizing the Trie" (arXiv:2602.22647), "CPU trie".
    """

    def __init__(self, sequences, vocab_size: int):
        seqs = validate_sequences(sequences, vocab_size)
        self.vocab_size = int(vocab_size)
        self.length = int(seqs.shape[1])
        nodes: list[dict] = [{}]
        last = self.length - 1
        for row in seqs.tolist():
            node = nodes[0]
            for token in row[:last]:
                child = node.get(token)
                if child is None:
                    child = node[token] = len(nodes)
                    nodes.append({})
                node = nodes[child]
            node[row[last]] = _LEAF
        self._nodes = nodes

    @property
    def num_nodes(self) -> int:
        """Inner nodes (dicts), the root included."""
        return len(self._nodes)

    def host_nbytes(self) -> int:
        """Approximate bytes of the Python objects (dicts, list, child ids)."""
        dicts = sum(sys.getsizeof(node) for node in self._nodes)
        return dicts + sys.getsizeof(self._nodes) + 32 * len(self._nodes)

    # Host --------------------------------------------------------------------

    def allowed_tokens(self, states: np.ndarray) -> np.ndarray:
        """bool `[R, V]`: the allowed tokens of each row's state (host, NumPy)."""
        return self._host_step(np.asarray(states, dtype=np.int64))[0]

    def _host_step(self, states: np.ndarray):
        nodes, width = self._nodes, self.vocab_size + 1
        mask = np.zeros((states.shape[0], self.vocab_size), dtype=bool)
        resolved = np.full(states.shape[0], -1, dtype=np.int64)
        for row, state in enumerate(states.tolist()):
            if state < 0:
                continue
            node, token = divmod(state, width)
            if token:
                node = nodes[node].get(token - 1, _LEAF)
                if node == _LEAF:
                    continue
            children = nodes[node]
            mask[row, list(children)] = True
            resolved[row] = node
        return mask, resolved

    # Device ------------------------------------------------------------------

    def candidates(self, log_probs, states, step: int, dense_top_k: int | None = None):
        """`(scores, tokens, next_states)`, each `[R, min(dense_top_k, V)]`; int64 states."""
        check_step(step, self.length)
        log_probs = ops.cast(log_probs, "float32")
        states = ops.cast(states, "int64")
        allowed, node = _host_call(self._host_step, states, self.vocab_size)
        masked = ops.where(allowed, log_probs, -np.inf)
        scores, best = ops.top_k(masked, num_candidates(dense_top_k, self.vocab_size), sorted=True)
        best = ops.cast(best, "int32")
        ok = ops.take_along_axis(allowed, best, axis=1)
        child = ops.expand_dims(node, 1) * (self.vocab_size + 1) + ops.cast(best, "int64") + 1
        return pad_invalid(scores, best, child, ok)


def _host_call(function, states, vocab_size: int):
    """Runs `function(states) -> (bool [R, V], int64 [R])` on the host."""
    backend = keras.config.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        allowed, node = tf.numpy_function(
            function, [states], [tf.bool, tf.int64], stateful=False, name="cpu_trie"
        )
        allowed.set_shape([states.shape[0], vocab_size])
        node.set_shape([states.shape[0]])
        return allowed, node
    if backend == "jax":
        import jax

        rows = states.shape[0]
        shapes = (
            jax.ShapeDtypeStruct((rows, vocab_size), np.bool_),
            jax.ShapeDtypeStruct((rows,), np.int64),
        )
        return jax.pure_callback(function, shapes, states)
    allowed, node = function(ops.convert_to_numpy(states))
    return ops.convert_to_tensor(allowed), ops.convert_to_tensor(node)
