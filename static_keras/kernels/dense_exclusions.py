"""The dense-head codes a request's exclusions empty, cleared from mask rows.

At a dense step a row's eligible codes come from mask rows
(`DenseStepEligibility`); a request's exclusions can empty a code (no
eligible, non-excluded member left below it). Those codes are found once
per decode for every dense depth (`dense_codes`, `blocked_dense_codes`: one
rank and one search), and a step clears their bits from its rows
(`blocked_words`; `grouped_blocked_words` for a beam search's beams).
"""

from __future__ import annotations

import numpy as np
from keras import ops

from static_keras.kernels import eligibility_kernels
from static_keras.kernels import gather

#: The value of each bit of a 32-bit word, as int32 (bit 31 is the sign).
_BIT_VALUES = (np.uint32(1) << np.arange(32, dtype=np.uint32)).view(np.int32)


def dense_codes(member_codes, members, counted):
    """int32 `[R, E + 1]`: the code of depth d whose block holds each counted
    member (-1 for the others), once per decode: one gather.

    Args:
        member_codes: the `dense_member_codes` weight.
        members, counted: int32 `[R, E + 1]` sorted members and bool, which
            of them are real.
    """
    codes = gather.take(member_codes, ops.where(counted, members, 0))  # padding reads 0
    return ops.where(counted, codes, -1)


def blocked_dense_codes(words, directory, request, codes, table,
                        offsets, vocab: int):  # fmt: skip
    """int32 `[R, d, E + 1]`: at `[:, t]`, the codes of depth t + 1 that a
    row's exclusions empty (no eligible, non-excluded member left below),
    each once, at the slot of its first excluded member; -1 elsewhere.

    Found once per decode (every depth in one rank and one search), so a
    dense step only clears their bits.

    Args:
        words, directory: int32 `[S, W]`, `[S, D]` set weights.
        request: a `RequestEligibility` (its `set_ids`, `excluded` and
            `excluded_before` are read).
        codes: int32 `[R, E + 1]`, the depth-d code of each excluded member
            (`dense_codes`), -1 for padding.
        table, offsets: the `dense_boundary_table` weight and its
            `dense_boundary_offsets`.
        vocab: V.
    """
    d = len(offsets) - 1
    real = ops.greater_equal(codes, 0)
    # The code of each depth t + 1, side by side: [R, d * (E + 1)].
    depth_codes = [ops.where(real, _floor_divide(codes, vocab ** (d - 1 - t)), 0)
                   for t in range(d)]  # fmt: skip
    at = ops.concatenate([offsets[t + 1] + c for t, c in enumerate(depth_codes)], axis=1)
    lo, hi = gather.take(table, at), gather.take(table, at + 1)
    count = hi - lo
    if request.set_ids is not None:
        width = ops.shape(at)[1]
        ranks = eligibility_kernels.set_ranks(
            words, directory, request.set_ids, ops.concatenate([lo, hi], axis=1)
        )
        count = eligibility_kernels.set_counts(
            request.set_ids, ranks[:, width:] - ranks[:, :width], count
        )
    left = count - eligibility_kernels.counted_in_ranges(
        request.excluded, request.excluded_before, lo, hi
    )
    width = ops.shape(codes)[1]
    out = []
    for t, code in enumerate(depth_codes):
        first = ops.concatenate(
            [ops.ones_like(real[:, :1]), ops.not_equal(code[:, 1:], code[:, :-1])], axis=1
        )
        emptied = ops.less_equal(left[:, t * width : (t + 1) * width], 0)
        out.append(ops.where(ops.logical_and(ops.logical_and(real, first), emptied), code, -1))
    return ops.stack(out, axis=1)


def blocked_words(blocked, parent, vocab: int, mask_words: int):
    """int32 `[R, mask_words]`: the bits of the codes a dense step must clear,
    laid out as a dense mask row.

    Args:
        blocked: int32 `[R, E + 1]`, one depth of `blocked_dense_codes`
            (distinct codes per row, -1 padding).
        parent: int32 `[R]`, each row's state's code at its depth t.
        vocab, mask_words: V and the words of a mask row.
    """
    rows = ops.shape(blocked)[0]
    child = _floor_divide(blocked, vocab)
    hit = ops.logical_and(ops.greater_equal(blocked, 0), ops.equal(child, parent[:, None]))
    row = ops.broadcast_to(ops.arange(rows, dtype="int32")[:, None], ops.shape(blocked))
    return _cleared_words(row, blocked - child * vocab, hit, rows, mask_words)


def grouped_blocked_words(blocked, parent, group: int, vocab: int, mask_words: int):
    """`blocked_words` for rows in groups of `group` that share one row of
    `blocked` and whose `parent` codes within a group are distinct (a beam
    search's beams): each code is matched to the one beam it lies below
    (`[G, E + 1, group]` compares), and only the `G * (E + 1)` codes are
    scattered, not `group` copies of each.

    Args:
        blocked: int32 `[G, E + 1]`, one depth of `blocked_dense_codes` per group.
        parent: int32 `[G * group]`, each row's state's code at its depth t
            (negative for rows with no state).
        group, vocab, mask_words: rows per group, V and the words of a mask row.
    """
    child = _floor_divide(blocked, vocab)  # the code each blocked one is below
    match = ops.equal(child[:, :, None], ops.reshape(parent, (-1, 1, group)))
    hit = ops.logical_and(ops.greater_equal(blocked, 0), ops.any(match, axis=2))
    beam = ops.cast(ops.argmax(ops.cast(match, "int32"), axis=2), "int32")
    groups = ops.shape(blocked)[0]
    row = ops.arange(groups, dtype="int32")[:, None] * group + beam
    return _cleared_words(row, blocked - child * vocab, hit, groups * group, mask_words)


def _floor_divide(x, divisor: int):
    """`x // divisor` (floor) for int32 `x` and a Python int `divisor` > 0:
    an arithmetic shift when it is a power of two (floor division for
    negative `x` too). TF's CPU integer FloorDiv is about 5x a shift."""
    if divisor == 1:
        return x
    if divisor & (divisor - 1) == 0:
        return ops.right_shift(x, divisor.bit_length() - 1)
    return ops.floor_divide(x, divisor)


def _cleared_words(row, token, hit, rows, mask_words: int):
    """int32 `[rows, mask_words]`: bit `token` set in row `row` for every
    `hit` entry (int32 / bool tensors of one shape, distinct codes per row)."""
    token = ops.where(hit, token, 0)
    values = ops.where(hit, gather.take(_BIT_VALUES, ops.bitwise_and(token, 31)), 0)
    segments = row * mask_words + ops.right_shift(token, 5)
    # Distinct codes: distinct bits, so the sum of a word's values is their OR.
    words = ops.segment_sum(
        ops.reshape(values, (-1,)), ops.reshape(segments, (-1,)), rows * mask_words
    )
    return ops.reshape(words, (-1, mask_words))
