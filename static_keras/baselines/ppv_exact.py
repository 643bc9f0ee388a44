"""`PPVExact`: binary search over the sorted valid set for every token (baseline)."""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from static_keras.baselines._common import check_step
from static_keras.baselines._common import common_prefix_lengths
from static_keras.baselines._common import num_candidates
from static_keras.baselines._common import pad_invalid
from static_keras.baselines._common import sorted_unique
from static_keras.constants import INVALID_STATE
from static_keras.constraint.decoding_constraint import DecodingConstraint

SEARCH_METHODS = ("native", "unrolled")


class PPVExact(DecodingConstraint):
    """Exact PPV: a vectorised binary search for every (row, token) pair.

    The baseline of Ye et al. (AISTATS 2025) as the STATIC paper runs it: the
    valid sequences sorted in one array, and at every step one binary search
    per candidate token of every row, `R x V` searches. Here the sorted array
    is kept per level, as its distinct prefixes: the keys of the distinct
    length-`t + 1` prefixes are `rank(prefix[:t]) * V + prefix[t]`, sorted
    (prefix ranks follow the lexicographic order). A row's state is the rank
    of its prefix among the distinct prefixes of its length; the child key
    `state * V + token` is searched among the next level's keys, found when
    equal, and its position is the child's state. Each search costs
    `log2(n_{t+1}) <= log2(N)` probes, like a search of the full sorted array.

    After masking, the best `min(dense_top_k, V)` valid tokens of each row are the
    candidates (same contract as `ConstrainedDecoding.candidates`: padding is
    score -inf, token -1, state -1; the initial state is 0).

    Args:
        sequences: int array-like `[N, L]`, the valid set (duplicates fine).
        vocab_size: int, V.
        keys: a prebuilt `SortedPrefixKeys` instead of `sequences` (the
            device arrays are then shared, e.g. with a `PPVApproximate`).
        search: `"native"` (`keras.ops.searchsorted`: the backend's binary
            search kernel, the fastest without XLA) or `"unrolled"` (a
            fixed `ceil(log2(n + 1))` rounds of gather-and-compare in
            `keras.ops`; use it under XLA, where TensorFlow lowers
            `searchsorted` to an all-pairs comparison). Defaults to
            `"native"`.

    Example:

    >>> import numpy as np
    >>> ppv = PPVExact([[1, 2], [1, 3], [0, 2]], vocab_size=4)
    >>> logits = np.log(np.full((1, 4), 0.25, "float32"))
    >>> scores, tokens, states = ppv.candidates(logits, np.zeros(1, "int32"), 0, dense_top_k=4)
    >>> sorted(t for t in np.asarray(tokens)[0].tolist() if t >= 0)
    [0, 1]

    References:
        Ye et al., "Efficient and Accurate Prefix-Constrained Decoding"
        (AISTATS 2025); Su et al., "Vectorizing the Trie" (arXiv:2602.22647),
        which benchmarks it as "PPV exact".
    """

    def __init__(
        self,
        sequences=None,
        vocab_size: int | None = None,
        *,
        keys: "SortedPrefixKeys | None" = None,
        search: str = "native",
    ):
        if search not in SEARCH_METHODS:
            raise ValueError(
                f"`search` must be one of {SEARCH_METHODS}. Received: search={search!r}"
            )
        if keys is None:
            if sequences is None or vocab_size is None:
                raise ValueError("Give `sequences` and `vocab_size`, or prebuilt `keys`")
            keys = SortedPrefixKeys(sequences, vocab_size)
        elif sequences is not None:
            raise ValueError("Give `sequences` or `keys`, not both")
        self.keys = keys
        self.vocab_size = keys.vocab_size
        self.length = keys.length
        self.search = search

    @property
    def nbytes(self) -> int:
        """Bytes of the sorted key arrays (what goes to the device)."""
        return self.keys.nbytes

    def candidates(self, log_probs, states, step: int, dense_top_k: int | None = None):
        """`(scores, tokens, next_states)`, each `[R, min(dense_top_k, V)]`."""
        check_step(step, self.length)
        log_probs = ops.cast(log_probs, "float32")
        tokens = ops.arange(self.vocab_size, dtype="int32")[None, :]
        found, position = self._search(states, tokens, step)
        masked = ops.where(found, log_probs, -np.inf)
        scores, best = ops.top_k(masked, num_candidates(dense_top_k, self.vocab_size), sorted=True)
        best = ops.cast(best, "int32")
        ok = ops.take_along_axis(found, best, axis=1)
        next_states = ops.take_along_axis(position, best, axis=1)
        return pad_invalid(scores, best, next_states, ok)

    def _search(self, states, tokens, step: int):
        """Whether `prefix(state) + token` is a valid prefix, and its rank.

        `tokens` is int32 `[R, P]` or `[1, P]`; returns bool and int32 `[R, P]`.
        """
        keys, size = self.keys.arrays[step], self.keys.level_sizes[step]
        dtype = self.keys.dtype
        states = ops.cast(states, "int32")
        valid = ops.greater(states, INVALID_STATE)
        parent = ops.cast(ops.where(valid, states, 0), dtype)
        query = parent[:, None] * self.vocab_size + ops.cast(tokens, dtype)
        shape = ops.shape(query)
        flat = ops.reshape(query, (-1,))
        position = self._lower_bound(keys, size, flat)
        value = ops.take(keys, ops.minimum(position, size - 1))
        found = ops.logical_and(ops.equal(value, flat), ops.less(position, size))
        found = ops.logical_and(ops.reshape(found, shape), valid[:, None])
        return found, ops.reshape(position, shape)

    def _lower_bound(self, keys, size: int, queries):
        """int32: the first position whose key is `>= query`, for each query."""
        if self.search == "native":
            return ops.cast(ops.searchsorted(keys, queries, side="left"), "int32")
        low = ops.zeros_like(queries, dtype="int32")
        high = ops.full_like(low, size)
        for _ in range(int(size).bit_length()):  # ceil(log2(size + 1)) halvings
            active = ops.less(low, high)
            middle = (low + high) // 2
            value = ops.take(keys, ops.minimum(middle, size - 1))
            right = ops.logical_and(active, ops.less(value, queries))
            low = ops.where(right, middle + 1, low)
            high = ops.where(ops.logical_and(active, ops.logical_not(right)), middle, high)
        return low


class SortedPrefixKeys:
    """The sorted valid set as PPV searches it: sorted keys of each level's prefixes.

    `arrays[t]` holds, sorted, one key per distinct prefix of length `t + 1`:
    `rank * V + token`, `rank` being the position of its length-`t` parent
    among the distinct length-`t` prefixes (lexicographic order). int32 when
    every key fits, else int64. Build once and share between `PPVExact` and
    `PPVApproximate` (`keys=`).

    Args:
        sequences: int array-like `[N, L]`, the valid set (duplicates fine).
        vocab_size: int, V.
    """

    def __init__(self, sequences, vocab_size: int):
        seqs = sorted_unique(sequences, vocab_size)
        self.vocab_size = int(vocab_size)
        self.length = int(seqs.shape[1])
        keys = _level_keys(seqs, self.vocab_size)
        del seqs
        largest = max(int(k[-1]) for k in keys)
        self.dtype = "int32" if largest <= np.iinfo(np.int32).max else "int64"
        if self.dtype == "int64" and keras.config.backend() == "jax":
            import jax

            if not jax.config.jax_enable_x64:
                raise ValueError("PPV keys need int64 here; on JAX enable jax_enable_x64")
        #: Distinct prefixes of each length 1..L.
        self.level_sizes = tuple(int(k.size) for k in keys)
        self.arrays = []
        for t in range(len(keys)):
            array, keys[t] = keys[t].astype(self.dtype), None  # free as we go
            self.arrays.append(keras.Variable(array, trainable=False, name=f"ppv_keys_{t + 1}"))

    @property
    def nbytes(self) -> int:
        return sum(self.level_sizes) * np.dtype(self.dtype).itemsize


def _level_keys(seqs: np.ndarray, vocab_size: int) -> list[np.ndarray]:
    """Sorted int64 keys of the distinct prefixes of each length 1..L.

    The key of a length-`t + 1` prefix is `rank * V + token`, `rank` being the
    position of its length-`t` parent among the distinct length-`t` prefixes.
    """
    lcp = common_prefix_lengths(seqs)
    rank = np.zeros(seqs.shape[0], dtype=np.int64)  # rank of each row's length-t prefix
    keys = []
    for t in range(seqs.shape[1]):
        opens = lcp <= t
        keys.append(rank[opens] * vocab_size + seqs[opens, t])
        rank = np.cumsum(opens, dtype=np.int64) - 1
    return keys
