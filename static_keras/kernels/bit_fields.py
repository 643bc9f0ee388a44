"""Bit-parallel field operations on int32 words in keras.ops.

The pieces a dense decoding step needs to turn bits laid out by member into
bits laid out by token without one element per bit
(`static_keras.kernels.derived_dense_masks`): logical shifts, low-bit masks,
a segmented "any bit in each segment" scan, and the two bit permutations of
Hacker's Delight (Warren, 2nd ed., section 7-4): `compress` (x86 PEXT:
gather the bits of `x` under mask `m` into the low bits) and `expand` (PDEP:
scatter the low bits of `x` to the set bits of `m`). Each is a fixed number
of elementwise ops (5 rounds of shifts and masks), so it runs unchanged on
TensorFlow, JAX and torch, in a TF graph and under XLA.

Words are uint32 bit patterns held as int32 (bit 31 is the sign): right
shifts are arithmetic in keras.ops, so `shift_right` masks the copies of the
sign bit away; left shifts drop the bits shifted out.
"""

from __future__ import annotations

import numpy as np
from keras import ops

from static_keras.index.dense_fields import host_compress_moves  # noqa: F401 (host side)
from static_keras.index.dense_fields import segment_masks  # noqa: F401 (host side)
from static_keras.kernels import gather

_LOW31 = 0x7FFFFFFF


def shift_right(x, k: int):
    """Logical right shift of int32 words by a Python int `k` in [0, 31]."""
    if k == 0:
        return x
    return ops.bitwise_and(ops.right_shift(x, k), _LOW31 >> (k - 1))


# No `where` below: TF's CPU select is 2-3x a bitwise op, and these run on
# every word of a dense step's rows.


def shift_right_by(x, k):
    """Logical right shift by an int32 tensor `k` in [0, 31] (broadcast):
    the arithmetic shift with its top k bits cleared (`(-1 << (31 - k)) << 1`
    is those bits, none when k = 0)."""
    k = ops.cast(k, "int32")
    top = ops.left_shift(ops.left_shift(ops.full_like(k, -1), 31 - k), 1)
    return ops.bitwise_and(ops.right_shift(x, k), ops.bitwise_invert(top))


def shift_right_by_up_to_32(x, k):
    """Logical right shift by an int32 tensor `k` in [1, 32] (32 gives 0)."""
    return ops.right_shift(shift_right(x, 1), ops.cast(k, "int32") - 1)  # x >>> 1 is >= 0


def shift_left_by_up_to_32(x, k):
    """Left shift by an int32 tensor `k` in [1, 32] (32 gives 0)."""
    return ops.left_shift(ops.left_shift(x, 1), ops.cast(k, "int32") - 1)


def all_bits_if(flags):
    """int32: -1 (every bit) where `flags`, 0 elsewhere."""
    return -ops.cast(flags, "int32")


def bits_from(k):
    """int32 words with bits `[k, 32)` set, for int32 `k` (clipped to [0, 32])."""
    k = ops.clip(ops.cast(k, "int32"), 0, 32)
    shifted = ops.left_shift(ops.full_like(k, -1), ops.minimum(k, 31))
    return ops.bitwise_and(shifted, all_bits_if(ops.less(k, 32)))


def _parallel_suffix(mk):
    """Bit i set when an odd number of bits of `mk` lie at or below i."""
    mp = ops.bitwise_xor(mk, ops.left_shift(mk, 1))
    for k in (2, 4, 8, 16):
        mp = ops.bitwise_xor(mp, ops.left_shift(mp, k))
    return mp


def compress_moves(m):
    """The 5 move masks of `compress` and `expand` by mask `m` (Hacker's
    Delight 7-4): list of int32 words shaped like `m`. They depend on the
    mask only, so a fixed mask's moves can be computed once
    (`host_compress_moves`)."""
    mk = ops.left_shift(ops.bitwise_invert(m), 1)  # zeros of m to the right of each bit
    moves = []
    for i in range(5):
        mp = _parallel_suffix(mk)
        mv = ops.bitwise_and(mp, m)  # bits that move by 2**i this round
        moves.append(mv)
        m = ops.bitwise_or(ops.bitwise_xor(m, mv), shift_right(mv, 1 << i))
        mk = ops.bitwise_and(mk, ops.bitwise_invert(mp))
    return moves


def compress(x, m, moves=None):
    """PEXT: the bits of `x` at the set bits of `m`, packed into the low
    `popcount(m)` bits (in order); the rest zero. Shapes broadcast.
    `moves`: `compress_moves(m)` when known (5 tensors, or one `[..., 5]`)."""
    moves = _moves(m, moves)
    x = ops.bitwise_and(x, m)
    for i, mv in enumerate(moves):
        t = ops.bitwise_and(x, mv)  # the bits that move; their places are free
        x = ops.bitwise_or(ops.bitwise_xor(x, t), shift_right(t, 1 << i))
    return x


def expand(x, m, moves=None):
    """PDEP: the low `popcount(m)` bits of `x` placed, in order, at the set
    bits of `m`; other bits zero. Shapes broadcast. `moves`: as `compress`."""
    moves = _moves(m, moves)
    for i in reversed(range(5)):
        # x where the move mask is clear, x << 2**i where it is set.
        moved = ops.bitwise_and(ops.bitwise_xor(x, ops.left_shift(x, 1 << i)), moves[i])
        x = ops.bitwise_xor(x, moved)
    return ops.bitwise_and(x, m)


def _moves(m, moves):
    if moves is None:
        return compress_moves(m)
    if isinstance(moves, (list, tuple)):
        return list(moves)
    return [moves[..., i] for i in range(5)]


def segment_any(bits, starts, masks):
    """int32 `[R, W]`: for each set bit of `starts`, whether `bits` has a set
    bit in its segment, at that start's position.

    A row's W words are one bit string (bit i of word w is position
    `32 w + i`); each start bit opens a segment that runs up to the next
    start bit, across words. Bits before a row's first start belong to no
    segment. Across words, a segment open at the end of word w takes the
    bits of the following words up to the next start word (one cumulative
    count, one gather); inside a word, a Kogge-Stone scan (5 rounds) carries
    each segment's bits down to its start.

    Args:
        bits, starts: int32 `[R, W]` words.
        masks: the 7 planes of `segment_masks(starts)` (a list of `[R, W]`,
            or `[R, 7, W]`).
    """
    if not isinstance(masks, (list, tuple)):
        masks = ops.unstack(masks, 7, axis=1)
    rows, width = ops.shape(bits)[0], bits.shape[1]
    head = ops.cast(ops.not_equal(ops.bitwise_and(bits, masks[0]), 0), "float32")
    # Words up to w with bits before their first start: a prefix sum as one
    # small matmul (exact in float32; faster than TF's int32 cumsum).
    upper = np.triu(np.ones((width, width), np.float32))
    count = ops.cast(ops.matmul(head, upper), "int32")
    at = masks[6] + ops.arange(rows, dtype="int32")[:, None] * width
    later = gather.take(ops.reshape(count, (-1,)), at) - count
    x = ops.bitwise_or(bits, ops.left_shift(ops.cast(ops.greater(later, 0), "int32"), 31))
    for i, k in enumerate((1, 2, 4, 8, 16)):
        x = ops.bitwise_or(x, ops.bitwise_and(shift_right(x, k), masks[1 + i]))
    return ops.bitwise_and(x, starts)
