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

from static_keras.index import layout as host_layout
from static_keras.layers import bit_fields
from static_keras.layers import execution_plan
from static_keras.layers import gather

#: Stored dense rows of a depth may cost at most this many bits per member
#: per set; above it the depth is derived (the sets are 1.5 bits).
STORED_BITS_PER_MEMBER = 0.5

#: The most words of set bits one derived row reads.
MAX_WINDOW = 256


# Host ------------------------------------------------------------------------


def eligibility_windows(vocab: int, dense_levels: int, num_members: int, boundaries, offsets):
    """tuple of d ints: per dense depth t, 0 (the sets store its mask rows)
    or the words of set bits a derived row of that depth reads.

    Depth 0 (one row) is always stored; once a depth is derived, every
    deeper one is too (its codes' ranges lie inside their parents').

    Args:
        vocab, dense_levels, num_members: V, d and N of the index.
        boundaries: the host `dense_boundary_table`.
        offsets: its `dense_boundary_offsets`.
    """
    boundaries = np.asarray(boundaries, np.int64)
    row_bits = host_layout.dense_mask_words(vocab) * 32
    windows = []
    for t in range(dense_levels):
        stored_bits = vocab**t * row_bits
        derive = t > 0 and (windows[-1] > 0 or stored_bits > STORED_BITS_PER_MEMBER * num_members)
        window = widest_range(boundaries[offsets[t] : offsets[t] + vocab**t + 1]) if derive else 0
        if windows and windows[-1] == 0 and window > MAX_WINDOW:
            window = 0
        windows.append(int(window))
    return tuple(windows)


def widest_range(first_members):
    """Words spanned by the widest non-empty range `[b[i], b[i + 1])`."""
    lo, hi = first_members[:-1], first_members[1:]
    some = hi > lo
    if not some.any():
        return 1
    return int((((hi[some] - 1) >> 5) - (lo[some] >> 5) + 1).max())


def stored_rows(vocab: int, windows) -> int:
    """Mask rows a set stores: one per code of each stored depth."""
    return sum(vocab**t for t, window in enumerate(windows) if window == 0)


#: Planes of `code_fields` and of `mask_fields`.
CODE_FIELDS, MASK_FIELDS = 15, 6


def code_fields(vocab: int, num_members: int, boundaries, offsets, depth: int, window: int):
    """int32 `[V**t, 15, window]`: what a derived row of each code p of
    depth t reads of the index, over the `window` words from `lo(p) >> 5`:

    - plane 0: the bits of the code's members, `[lo, hi)`;
    - plane 1: its children's first members (one start bit per child);
    - planes 2-6: the `compress` moves of plane 1;
    - planes 7-13: its `bit_fields.segment_masks`;
    - plane 14: the start bits before each word (where the word's piece of
      the children string begins).

    All fixed by the index, so the step only gathers them (2.3 MB at
    V = 2048, N = 1e6, window 19).
    """
    boundaries = np.asarray(boundaries, np.int64)
    codes = vocab**depth
    lo = boundaries[offsets[depth] : offsets[depth] + codes]
    hi = boundaries[offsets[depth] + 1 : offsets[depth] + codes + 1]
    children = boundaries[offsets[depth + 1] : offsets[depth + 1] + vocab * codes + 1]
    starts = children[:-1][children[1:] > children[:-1]]
    size = (num_members // 32 + 1 + window) * 32  # room for windows past the end
    start_bits = np.zeros(size, bool)
    start_bits[starts] = True
    start_words = np.packbits(start_bits, bitorder="little").view("<u4")
    word = (lo >> 5)[:, None] + np.arange(window)  # [P, window]
    position = word * 32
    inside = _bits_from(lo[:, None] - position) & ~_bits_from(hi[:, None] - position)
    opens = start_words[word] & inside
    fields = np.zeros((codes, CODE_FIELDS, window), np.uint32)
    fields[:, 0], fields[:, 1] = inside, opens
    fields[:, 2:7] = np.moveaxis(bit_fields.host_compress_moves(opens).view(np.uint32), -1, 1)
    fields[:, 7:14] = bit_fields.segment_masks(opens).view(np.uint32)
    counts = np.bitwise_count(opens).astype(np.uint32)
    fields[:, 14] = np.cumsum(counts, axis=1, dtype=np.uint32) - counts
    return fields.view(np.int32)


def mask_fields(index_masks):
    """int32 `[H, 6, mask_words]` for the index's mask rows `[H, mask_words]`
    of a derived depth: planes 0-4 their `expand` moves, plane 5 the set
    bits before each word (where a word's piece of the children starts)."""
    masks = np.asarray(index_masks).view(np.uint32)
    fields = np.zeros((masks.shape[0], MASK_FIELDS, masks.shape[1]), np.uint32)
    fields[:, :5] = np.moveaxis(bit_fields.host_compress_moves(masks).view(np.uint32), -1, 1)
    counts = np.bitwise_count(masks).astype(np.uint32)
    fields[:, 5] = np.cumsum(counts, axis=1, dtype=np.uint32) - counts
    return fields.view(np.int32)


def _bits_from(k):
    """NumPy uint32 words with bits `[k, 32)` set (k clipped to [0, 32])."""
    k = np.clip(k, 0, 32)
    shifted = np.uint32(0xFFFFFFFF) << np.minimum(k, 31).astype(np.uint32)
    return np.where(k >= 32, np.uint32(0), shifted).astype(np.uint32)


# Device ----------------------------------------------------------------------


def planes_first(fields):
    """`[H, planes, width]` host fields as `[planes * H, width]`: a step
    gathers each plane of its rows (`plane_rows`), with no copy of the
    other planes (a batched gather then a split copies all of them)."""
    return np.ascontiguousarray(np.moveaxis(fields, 1, 0)).reshape(-1, fields.shape[2])


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
