"""`HashBitmap`: a Bloom-style bitmap of prefix hashes (baseline, approximate)."""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from static_keras.baselines._common import check_step
from static_keras.baselines._common import common_prefix_lengths
from static_keras.baselines._common import num_candidates
from static_keras.baselines._common import pad_invalid
from static_keras.baselines._common import sorted_unique
from static_keras.constraint.decoding_constraint import DecodingConstraint

# All arithmetic stays below 2**63 in int64 (no wrap-around on any backend):
# lanes are residues modulo the Mersenne prime 2**31 - 1, multipliers of the
# rolling hash are below 2**31 and those of the mixes below 2**30.
_PRIME = 2**31 - 1
_ROLL = (1540483477, 461845907)
_MIX = ((625341585, 1013904242, 97), (528734635, 189498087, 193), (668265263, 374761393, 389))


class HashBitmap(DecodingConstraint):
    """Membership of `prefix + token` in a Bloom filter of all valid prefixes.

    Every valid prefix (every length 1..L) is hashed and sets `num_hashes`
    bits of one bitmap of `bits_per_prefix` bits per distinct prefix. A row's
    state is a 62-bit rolling hash of its prefix (two 31-bit lanes in one
    int64; the initial state 0 is the empty prefix). At each step every token
    of every row is hashed and looked up (`R x V x num_hashes` bit reads); the
    best `min(dense_top_k, V)` tokens that the filter accepts are the candidates.

    A Bloom filter has no false negatives, so every valid sequence stays
    reachable, but it has false positives: an invalid `prefix + token` is
    accepted with probability about `(1 - exp(-k / b)) ** k` per query (k
    hashes, b bits per prefix; about 2.5e-5 with the defaults), and with `V`
    tokens per row an invalid child is returned now and then. Returned
    sequences must be checked (`StaticIndex.contains`); the benchmarks report
    the rate.

    Args:
        sequences: int array-like `[N, L]`, the valid set.
        vocab_size: int, V.
        bits_per_prefix: float. Bitmap size per distinct prefix. Defaults to 32.
        num_hashes: int. Bits set and tested per prefix. Defaults to 6.

    Example:

    >>> import numpy as np
    >>> bitmap = HashBitmap([[1, 2], [1, 3], [0, 2]], vocab_size=4)
    >>> bitmap.contains_prefixes([[1, 2], [1, 3], [0, 2], [3, 3]]).tolist()
    [True, True, True, False]
    """

    def __init__(
        self,
        sequences,
        vocab_size: int,
        *,
        bits_per_prefix: float = 32.0,
        num_hashes: int = 6,
    ):
        if not bits_per_prefix > 0:
            raise ValueError(
                f"`bits_per_prefix` must be positive. Received: bits_per_prefix={bits_per_prefix}"
            )
        if isinstance(num_hashes, bool) or not isinstance(num_hashes, (int, np.integer)):
            raise ValueError(f"`num_hashes` must be an int. Received: num_hashes={num_hashes!r}")
        if num_hashes < 1:
            raise ValueError(f"`num_hashes` must be positive. Received: num_hashes={num_hashes}")
        if keras.config.backend() == "jax":
            import jax

            if not jax.config.jax_enable_x64:
                raise ValueError("HashBitmap needs int64 states; on JAX enable jax_enable_x64")
        seqs = sorted_unique(sequences, vocab_size)
        self.vocab_size = int(vocab_size)
        self.length = int(seqs.shape[1])
        self.num_hashes = int(num_hashes)
        lcp = common_prefix_lengths(seqs)
        #: Distinct valid prefixes of all lengths 1..L (the filter's keys).
        self.num_prefixes = int(sum(np.count_nonzero(lcp <= t) for t in range(self.length)))
        self.num_bits = max(64, -(-int(np.ceil(bits_per_prefix * self.num_prefixes)) // 32) * 32)
        bits = np.zeros(self.num_bits, dtype=bool)
        high = np.zeros(seqs.shape[0], dtype=np.int64)
        low = np.zeros(seqs.shape[0], dtype=np.int64)
        for t in range(self.length):
            high, low = _roll_np(high, low, seqs[:, t])
            rows = np.flatnonzero(lcp <= t)
            for position in self._positions(high[rows], low[rows], t):
                bits[position] = True
        words = np.packbits(bits, bitorder="little").view("<i4")
        del bits
        self._words = keras.Variable(words.astype(np.int32), trainable=False, name="bloom_words")

    @property
    def nbytes(self) -> int:
        """Bytes of the bitmap."""
        return self.num_bits // 8

    def expected_fp_rate(self) -> float:
        """The textbook per-query false-positive rate of this filter."""
        fill = 1.0 - np.exp(-self.num_hashes * self.num_prefixes / self.num_bits)
        return float(fill**self.num_hashes)

    # Device ------------------------------------------------------------------

    def candidates(self, log_probs, states, step: int, dense_top_k: int | None = None):
        """`(scores, tokens, next_states)`, each `[R, min(dense_top_k, V)]`; int64 states."""
        check_step(step, self.length)
        log_probs = ops.cast(log_probs, "float32")
        states = ops.cast(states, "int64")
        valid = ops.greater(states, -1)
        states = ops.where(valid, states, 0)
        high = ops.expand_dims(states // 2**31, 1)
        low = ops.expand_dims(states % 2**31, 1)
        tokens = ops.arange(1, self.vocab_size + 1, dtype="int64")[None, :]
        high = (high * _ROLL[0] + tokens) % _PRIME  # [R, V]
        low = (low * _ROLL[1] + tokens) % _PRIME
        found = ops.expand_dims(valid, 1)
        for position in self._positions(high, low, step):
            word = ops.take(self._words, ops.right_shift(position, 5))
            shift = ops.cast(ops.bitwise_and(position, 31), "int32")
            bit = ops.bitwise_and(ops.right_shift(word, shift), 1)
            found = ops.logical_and(found, ops.equal(bit, 1))
        masked = ops.where(found, log_probs, -np.inf)
        scores, best = ops.top_k(masked, num_candidates(dense_top_k, self.vocab_size), sorted=True)
        best = ops.cast(best, "int32")
        ok = ops.take_along_axis(found, best, axis=1)
        child = ops.take_along_axis(high, best, axis=1) * 2**31 + ops.take_along_axis(
            low, best, axis=1
        )
        return pad_invalid(scores, best, child, ok)

    def _positions(self, high, low, step: int):
        """The `num_hashes` bit positions of prefixes with lanes (high, low), int64.

        Works on tensors and on NumPy int64 arrays alike (the host build).
        """
        where = np.where if isinstance(high, np.ndarray) else ops.where
        size = self.num_bits
        mixes = [(high * c + low * d + (step + 1) * e) % _PRIME for c, d, e in _MIX]
        position = (mixes[0] * 2**31 + mixes[1]) % size
        stride = mixes[2] % (size - 1) + 1  # double hashing: position + i * stride mod size
        positions = [position]
        for _ in range(self.num_hashes - 1):
            position = position + stride
            position = where(position >= size, position - size, position)
            positions.append(position)
        return positions

    # Host --------------------------------------------------------------------

    def contains_prefixes(self, prefixes) -> np.ndarray:
        """bool `[n]`: the filter's answer for `prefixes [n, t]`, `1 <= t <= L`.

        Computed on the host with the same arithmetic as `candidates`. No
        false negatives: every valid prefix answers True.
        """
        prefixes = np.asarray(prefixes)
        if prefixes.ndim != 2 or not 1 <= prefixes.shape[1] <= self.length:
            raise ValueError(
                f"`prefixes` must have shape [n, t] with 1 <= t <= {self.length}. "
                f"Received shape {prefixes.shape}"
            )
        in_range = np.all((prefixes >= 0) & (prefixes < self.vocab_size), axis=1)
        high = np.zeros(prefixes.shape[0], dtype=np.int64)
        low = np.zeros(prefixes.shape[0], dtype=np.int64)
        for t in range(prefixes.shape[1]):
            high, low = _roll_np(high, low, prefixes[:, t])
        words = ops.convert_to_numpy(self._words.value).view(np.uint32)
        found = in_range
        for position in self._positions(high, low, prefixes.shape[1] - 1):
            bit = (words[position // 32] >> (position % 32).astype(np.uint32)) & 1
            found = found & (bit == 1)
        return found


def _roll_np(high: np.ndarray, low: np.ndarray, tokens: np.ndarray):
    tokens = tokens.astype(np.int64) + 1
    return (high * _ROLL[0] + tokens) % _PRIME, (low * _ROLL[1] + tokens) % _PRIME
