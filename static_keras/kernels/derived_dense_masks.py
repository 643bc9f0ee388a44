"""Dense-step eligibility derived at decode time from the set's member bits.

A dense step of a semantic-ID index reads one V-bit mask row per state:
bit c of the row of a depth-t code p says whether code `p * V + c` has an
eligible member. Stored per set, those rows cost `V**(t+1)` bits whatever
the number of members N (43 bits per member at N = 1e5, V = 2048, d = 2;
the set itself is 1.5). So where the stored rows of a depth would cost more
than `STORED_BITS_PER_MEMBER`, the layer derives each row from the set's
member bits instead, bit-parallel, for the rows a step reads:

1. gather the `window` words of the set's bits that hold the members of
   the row's code p (the range `[lo, hi)` from the boundary table), and
   what the index fixes for p (`code_fields`): the bits of `[lo, hi)`, the
   first member of each child code (its *start* bit), and the `compress`
   moves of those start bits;
2. `segment_any`: for each child code (a segment from its start bit),
   whether any of its members is eligible, at its start bit;
3. `compress` each word by its start bits and concatenate the pieces: one
   bit per existing child, in token order;
4. split that string by the popcounts of the index's own mask row and
   `expand` each piece into the row's set bits (`mask_fields` holds both
   for every row; compiled, the moves are recomputed, `mask_rows`): the
   row laid out by token.

About 100 elementwise ops on `[R, window]` and `[R, V / 32]` int32, a few
gathers and one scatter, no per-member or per-token element. The window is
the widest member range of a code of depth t in words (`eligibility_windows`,
part of the layer's config); a depth whose codes span more than `MAX_WINDOW`
words keeps stored rows. What the index fixes costs the layer, per derived
depth, `V**t * (15 * window + 6 * V / 32)` int32 once (not per set): 5.5 MB
at V = 2048, N = 1e6.
"""

from __future__ import annotations

import numpy as np
from keras import ops

from static_keras.index.dense_fields import CODE_FIELDS  # noqa: F401 (re-exported)
from static_keras.index.dense_fields import MASK_FIELDS  # noqa: F401
from static_keras.index.dense_fields import MAX_WINDOW  # noqa: F401
from static_keras.index.dense_fields import STORED_BITS_PER_MEMBER  # noqa: F401
from static_keras.index.dense_fields import code_fields  # noqa: F401
from static_keras.index.dense_fields import eligibility_windows  # noqa: F401
from static_keras.index.dense_fields import mask_fields  # noqa: F401
from static_keras.index.dense_fields import planes_first  # noqa: F401
from static_keras.index.dense_fields import stored_rows  # noqa: F401
from static_keras.index.dense_fields import widest_range  # noqa: F401
from static_keras.kernels import bit_fields
from static_keras.kernels import execution_plan
from static_keras.kernels import gather

# Device ----------------------------------------------------------------------


def plane_rows(table, planes: int, rows):
    """The `planes` planes of `rows` of a `planes_first` table: list of
    `[R, width]` (one gather, then contiguous splits)."""
    count = table.shape[0] // planes
    at = (np.arange(planes, dtype=np.int32) * count)[:, None] + rows[None, :]
    return ops.unstack(gather.take(table, at), planes, axis=0)


def mask_rows(table, rows, index_words):
    """The 6 `mask_fields` planes of mask rows `rows` (list of `[R,
    mask_words]`) from their `planes_first` table and the rows themselves
    (`index_words`).

    All 6 are gathered, or, where the plan says so
    (`recompute_expand_moves`), the 5 `expand` moves are recomputed from the
    rows (bit ops XLA fuses into the expand) and only the bit offsets are
    gathered.
    """
    if not execution_plan.current().recompute_expand_moves:
        return plane_rows(table, MASK_FIELDS, rows)
    before = gather.take(table, (MASK_FIELDS - 1) * (table.shape[0] // MASK_FIELDS) + rows)
    return [*bit_fields.compress_moves(index_words), before]


def derived_words(words, fields, masks, first_word, set_rows, index_words):
    """int32 `[R, mask_words]`: each row's eligibility mask row, derived.

    Args:
        words: int32 `[S, W]`, the eligibility words weight.
        fields: the 15 `code_fields` planes of each row's code (`[R, window]`
            each; `plane_rows`).
        masks: the 6 `mask_fields` planes of its mask row (`[R, mask_words]`;
            `mask_rows`).
        first_word: int32 `[R]`, the first word of the code's members
            (`lo >> 5`).
        set_rows: int32 `[R]`, each row's set (in range).
        index_words: int32 `[R, mask_words]`, the index's mask rows of the
            rows' codes (the existing children).
    """
    num_words, window = words.shape[1], fields[0].shape[1]
    word = ops.minimum(first_word[:, None] + np.arange(window, dtype=np.int32), num_words - 1)
    inside, opens = fields[0], fields[1]
    eligible = gather.take(ops.reshape(words, (-1,)), set_rows[:, None] * num_words + word)
    eligible = ops.bitwise_and(eligible, inside)  # past the last word: outside
    found = bit_fields.segment_any(eligible, opens, fields[7:14])
    found = bit_fields.compress(found, opens, fields[2:7])
    children = _concatenate(found, fields[14], index_words.shape[1])
    return _computed_once(_spread(children, index_words, masks[:5], masks[5]))


def _concatenate(pieces, offset, mask_words: int):
    """int32 `[R, mask_words + 2]`: each row's pieces (`[R, P]`, each in its
    low bits, the next one's `offset` minus its own long) end to end, as one
    bit string starting with piece 0 (`offset` 0)."""
    rows = ops.shape(pieces)[0]
    out_words = mask_words + 2  # a row holds at most 32 * mask_words bits
    word = ops.minimum(ops.right_shift(offset, 5), out_words - 2)
    shift = ops.bitwise_and(offset, 31)
    low = ops.left_shift(pieces, shift)
    high = bit_fields.shift_right_by_up_to_32(pieces, 32 - shift)
    row = ops.arange(rows, dtype="int32")[:, None] * out_words
    segments = ops.concatenate([row + word, row + word + 1], axis=1)
    # Pieces never overlap: the sum of a word's parts is their OR.
    values = ops.concatenate([low, high], axis=1)
    total = ops.segment_sum(
        ops.reshape(values, (-1,)), ops.reshape(segments, (-1,)), rows * out_words
    )
    return ops.reshape(total, (-1, out_words))


def _spread(children, index_words, moves, before):
    """int32 `[R, mask_words]`: bit k of a row's `children` string placed at
    the k-th set bit of its index mask row (`before`: the set bits before
    each word, `moves`: the row's `expand` moves)."""
    rows, width = ops.shape(children)[0], children.shape[1]
    # One flat gather: a third cheaper than a batched one in TF and XLA.
    word = ops.right_shift(before, 5) + ops.arange(rows, dtype="int32")[:, None] * width
    shift = ops.bitwise_and(before, 31)
    flat = ops.reshape(children, (-1,))
    low = bit_fields.shift_right_by(gather.take(flat, word), shift)
    high = bit_fields.shift_left_by_up_to_32(gather.take(flat, word + 1), 32 - shift)
    piece = ops.bitwise_or(low, high)
    return bit_fields.expand(piece, index_words, moves)  # keeps popcount(m) low bits


def _computed_once(x):
    """`x`, written once where the plan says so (`materialise_derived_words`):
    XLA would otherwise fuse its ~100 bit ops per word into each consumer
    element. XLA:CPU drops optimization barriers before fusion, so `x`
    passes through an identity `segment_sum` (a fusion root) instead."""
    if execution_plan.current().materialise_derived_words:
        flat = ops.reshape(x, (-1,))
        size = flat.shape[0] if flat.shape[0] is not None else ops.shape(flat)[0]
        summed = ops.segment_sum(flat, ops.arange(size, dtype="int32"), size)
        return ops.reshape(summed, ops.shape(x))
    return x
