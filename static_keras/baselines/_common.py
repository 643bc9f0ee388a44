"""Host-side helpers shared by the baselines: the sorted valid set and padding.

NumPy only, like the index builder: a baseline compiles its structure from
the valid set once, offline, then decodes with `keras.ops`.
"""

from __future__ import annotations

import numpy as np
from keras import ops

from static_keras.constants import INVALID_STATE
from static_keras.constants import PAD_TOKEN
from static_keras.index.input_checks import validate_sequences


def sorted_unique(sequences, vocab_size: int) -> np.ndarray:
    """The distinct rows of `sequences`, sorted lexicographically.

    Rows are packed into as few uint64 words as hold them (most significant
    token first) and sorted with one `lexsort`; already sorted input (such as
    `StaticIndex.sequences()`) skips the sort.

    Args:
        sequences: int array-like `[N, L]`, tokens in `[0, vocab_size)`.
        vocab_size: int, V.

    Returns:
        `[n, L]` array of the narrowest unsigned dtype that holds a token.

    Raises:
        ValueError: for the input errors that `StaticIndex.build` rejects.
    """
    seqs = validate_sequences(sequences, vocab_size)
    bits = max(1, (int(vocab_size) - 1).bit_length())
    per_word = max(1, 64 // bits)
    words = []
    for start in range(0, seqs.shape[1], per_word):
        word = np.zeros(seqs.shape[0], dtype=np.uint64)
        for column in range(start, min(seqs.shape[1], start + per_word)):
            word <<= np.uint64(bits)
            word |= seqs[:, column]
        words.append(word)
    if not _is_sorted(words):
        order = np.lexsort(words[::-1])
        seqs = seqs[order]
        words = [word[order] for word in words]
    keep = np.ones(seqs.shape[0], dtype=bool)
    if seqs.shape[0] > 1:
        same = np.ones(seqs.shape[0] - 1, dtype=bool)
        for word in words:
            same &= word[1:] == word[:-1]
        keep[1:] = ~same
    return seqs if keep.all() else seqs[keep]


def _is_sorted(words: list[np.ndarray]) -> bool:
    """Whether rows packed into `words` are in non-decreasing order."""
    if words[0].size < 2:
        return True
    tied = np.ones(words[0].size - 1, dtype=bool)
    for word in words:
        if np.any(tied & (word[1:] < word[:-1])):
            return False
        tied &= word[1:] == word[:-1]
    return True


def common_prefix_lengths(seqs: np.ndarray) -> np.ndarray:
    """int8 `[n]`: tokens row i shares with row i-1 of sorted unique rows; -1 for row 0.

    Row i opens a new prefix of length `t + 1` exactly when `lcp[i] <= t`.
    """
    n = seqs.shape[0]
    lcp = np.zeros(n, dtype=np.int8 if seqs.shape[1] < 127 else np.int32)
    same = np.ones(max(n - 1, 0), dtype=bool)
    for column in range(seqs.shape[1]):
        same &= seqs[1:, column] == seqs[:-1, column]
        lcp[1:] += same
    if n:
        lcp[0] = -1
    return lcp


def pad_invalid(scores, tokens, next_states, ok):
    """Applies the padding contract: score -inf, token -1, state -1 where not `ok`."""
    scores = ops.where(ok, scores, -np.inf)
    tokens = ops.where(ok, tokens, PAD_TOKEN)
    next_states = ops.where(ok, next_states, ops.cast(INVALID_STATE, next_states.dtype))
    return scores, tokens, next_states


def num_candidates(dense_top_k, vocab_size: int) -> int:
    """K of a dense-style baseline: `min(dense_top_k, V)`, all of V when dense_top_k is None."""
    if dense_top_k is None:
        return int(vocab_size)
    return max(1, min(int(dense_top_k), int(vocab_size)))


def check_step(step, length: int) -> None:
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)):
        raise ValueError(f"`step` must be a Python int. Received: step={step!r}")
    if not 0 <= step < length:
        raise ValueError(f"`step` must lie in [0, {length}). Received: step={step}")
