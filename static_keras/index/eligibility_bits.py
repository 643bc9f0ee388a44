"""Bit vectors with a rank directory: the storage of `EligibilitySets`.

A set over `num_members` members is `W = num_members // 32 + 1` uint32
words (bit `m & 31` of word `m >> 5` is member m) plus one uint32 per pair
of words, the eligible members before the pair: 1.5 bits per member. The
last word always has room for position `num_members`, so
`rank(num_members)` needs no clamp on the device. Rank is then the same
fixed-width, branch-free reads for every position:

    w = i >> 5
    rank(i) = directory[i >> 6] + popcount(words[w - 1]) if w is odd
              + popcount(words[w] & ((1 << (i & 31)) - 1))
    count(lo, hi) = rank(hi) - rank(lo)

These are the host functions (NumPy only, vectorised over positions and
sets); `kernels/eligibility_kernels.py` is the same arithmetic on the device.
"""

from __future__ import annotations

import numpy as np


def words_per_set(num_members: int) -> int:
    """uint32 words of one set: one bit per member plus room for position
    `num_members` (so `rank(num_members)` reads a real word)."""
    return num_members // 32 + 1


def directory_size(num_members: int) -> int:
    """Directory entries of one set: one per pair of words."""
    return (words_per_set(num_members) + 1) // 2


def pack(members: np.ndarray, num_members: int) -> tuple[np.ndarray, np.ndarray]:
    """One set's `(words uint32 [W], directory uint32 [D])` from member numbers
    (-1: no member; it lands in a spare last slot that is not packed)."""
    size = words_per_set(num_members) * 32
    bits = np.zeros(size + 1, bool)
    bits[members] = True
    return pack_bits(bits[:size])


def pack_bits(bits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One set's `(words, directory)` from one bool per position, `W * 32`
    of them (`words_per_set`; the positions from `num_members` on are False)."""
    words = np.packbits(bits, bitorder="little").view("<u4").astype(np.uint32, copy=False)
    return words, rank_directory(words)


def pack_sets(member_lists, num_members: int) -> tuple[np.ndarray, np.ndarray]:
    """`(words [S, W], directory [S, D])` of one set per list of member numbers."""
    packed = [pack(members, num_members) for members in member_lists]
    return np.stack([w for w, _ in packed]), np.stack([d for _, d in packed])


def rank_directory(words: np.ndarray) -> np.ndarray:
    """uint32 `[..., D]`: eligible members before each pair of words (along
    the last axis)."""
    before = np.zeros(words.shape, np.uint32)
    counts = np.bitwise_count(words[..., :-1])
    np.cumsum(counts, axis=-1, dtype=np.uint32, out=before[..., 1:])
    return np.ascontiguousarray(before[..., ::2])


def rank(words: np.ndarray, directory: np.ndarray, sets, positions) -> np.ndarray:
    """int64: set bits before each position of each set's row (`sets` and
    `positions` are int64 arrays that broadcast, already in range)."""
    # uint32 throughout (b <= 31, so `(1 << b) - 1` fits): a dense-step
    # mask build ranks millions of positions per set.
    word = positions >> 5
    below = np.left_shift(np.uint32(1), (positions & 31).astype(np.uint32)) - np.uint32(1)
    odd = (word & 1).astype(np.uint32)
    previous = words[sets, word - odd] * odd  # the pair's first word when w is odd
    counts = np.bitwise_count(previous) + np.bitwise_count(words[sets, word] & below)
    return (directory[sets, positions >> 6] + counts).astype(np.int64)


def contains(words: np.ndarray, sets, members) -> np.ndarray:
    """bool: whether each member's bit is set in its set's row."""
    return ((words[sets, members >> 5] >> (members & 31).astype(np.uint32)) & 1) == 1
