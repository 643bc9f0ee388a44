"""What a derived dense row reads of the index, computed on the host (NumPy only).

`static_keras.kernels.derived_dense_masks` derives a dense step's set rows at
decode time from the set's member bits; the fields it gathers are fixed by
the index, so they are computed here once per index: by the layer when it
is built, and by a catalogue job (`update-catalogue`) that writes a new
index's tensors without Keras or TensorFlow. The bit tricks' host halves
(`host_compress_moves`, `segment_masks`) live here for the same reason; their
device halves are in `static_keras.kernels.bit_fields`.
"""

from __future__ import annotations

import math

import numpy as np

from static_keras.index import dense_eligibility
from static_keras.index.layout import dense_mask_words

_LOW31 = 0x7FFFFFFF


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
    row_bits = dense_mask_words(vocab) * 32
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
    - planes 7-13: its `segment_masks`;
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
    fields[:, 2:7] = np.moveaxis(host_compress_moves(opens).view(np.uint32), -1, 1)
    fields[:, 7:14] = segment_masks(opens).view(np.uint32)
    counts = np.bitwise_count(opens).astype(np.uint32)
    fields[:, 14] = np.cumsum(counts, axis=1, dtype=np.uint32) - counts
    return fields.view(np.int32)


def mask_fields(index_masks):
    """int32 `[H, 6, mask_words]` for the index's mask rows `[H, mask_words]`
    of a derived depth: planes 0-4 their `expand` moves, plane 5 the set
    bits before each word (where a word's piece of the children starts)."""
    masks = np.asarray(index_masks).view(np.uint32)
    fields = np.zeros((masks.shape[0], MASK_FIELDS, masks.shape[1]), np.uint32)
    fields[:, :5] = np.moveaxis(host_compress_moves(masks).view(np.uint32), -1, 1)
    counts = np.bitwise_count(masks).astype(np.uint32)
    fields[:, 5] = np.cumsum(counts, axis=1, dtype=np.uint32) - counts
    return fields.view(np.int32)


def _bits_from(k):
    """NumPy uint32 words with bits `[k, 32)` set (k clipped to [0, 32])."""
    k = np.clip(k, 0, 32)
    shifted = np.uint32(0xFFFFFFFF) << np.minimum(k, 31).astype(np.uint32)
    return np.where(k >= 32, np.uint32(0), shifted).astype(np.uint32)


def planes_first(fields):
    """`[H, planes, width]` host fields as `[planes * H, width]`: a step
    gathers each plane of its rows (`plane_rows`), with no copy of the
    other planes (a batched gather then a split copies all of them)."""
    return np.ascontiguousarray(np.moveaxis(fields, 1, 0)).reshape(-1, fields.shape[2])


def host_compress_moves(m):
    """NumPy `compress_moves`: uint32/int32 words `[...]` to int32 `[..., 5]`."""
    m = np.asarray(m).view(np.uint32)
    mk = ~m << np.uint32(1)
    moves = []
    for i in range(5):
        mp = mk ^ (mk << np.uint32(1))
        for k in (2, 4, 8, 16):
            mp = mp ^ (mp << np.uint32(k))
        mv = mp & m
        moves.append(mv)
        m = (m ^ mv) | (mv >> np.uint32(1 << i))
        mk = mk & ~mp
    return np.stack(moves, axis=-1).view(np.int32)


def segment_masks(starts):
    """NumPy int32 `[..., 7, W]`: what `segment_any` needs of fixed start
    bits `starts` (uint32/int32 `[..., W]`, a row of W words as one bit
    string):

    - plane 0: each word's bits before its first start (all without one);
    - planes 1-5: the in-word scan's masks, round k = 1, 2, 4, 8, 16: bit i
      set when no start lies in `(i, i + k]` of the word;
    - plane 6: for each word w, the first later word with a start (the last
      word if none): where the segment open at the end of w stops.
    """
    starts = np.asarray(starts).view(np.uint32)
    width = starts.shape[-1]
    out = np.zeros(starts.shape[:-1] + (7, width), np.uint32)
    opened = starts.copy()
    for k in (1, 2, 4, 8, 16):
        opened |= opened << np.uint32(k)
    out[..., 0, :] = ~opened
    open_above = ~(starts >> np.uint32(1)) & np.uint32(_LOW31)
    for i, k in enumerate((1, 2, 4, 8, 16)):
        out[..., 1 + i, :] = open_above
        open_above = open_above & (open_above >> np.uint32(k))
    following = np.full(starts.shape, width - 1, np.int64)
    for w in range(width - 2, -1, -1):  # the nearest start word after w
        has = starts[..., w + 1] != 0
        following[..., w] = np.where(has, w + 1, following[..., w + 1])
    out[..., 6, :] = following.astype(np.uint32)
    return out.view(np.int32)


def layer_windows(layout, boundaries) -> tuple[int, ...]:
    """The eligibility windows a layer over this index keeps: those the
    index needs (`eligibility_windows`), widened by the layout's headroom
    (its member slots over its members) so that a new catalogue within the
    capacities fits them too."""
    offsets = dense_eligibility.dense_boundary_offsets(layout)
    windows = eligibility_windows(
        layout.vocab_size, layout.dense_levels, layout.num_members, boundaries, offsets
    )
    if not layout.has_headroom or not layout.num_sequences:
        return windows
    slack = layout.num_members / layout.num_sequences - 1
    return tuple(w and min(MAX_WINDOW, w + max(1, math.ceil(w * slack))) for w in windows)


def member_range_arrays(layout, arrays, windows, boundaries=None) -> dict[str, np.ndarray]:
    """The member-range weights of a semantic-ID layer with eligibility
    windows `windows`: the dense boundary table, each member's depth-d
    code and, at derived depths, the fields a derived row reads.
    ValueError when a depth's widest code range exceeds its window (the
    layer was sized for another index)."""
    table = boundaries
    if table is None:
        table = dense_eligibility.dense_boundary_table(layout, arrays)
    offsets = dense_eligibility.dense_boundary_offsets(layout)
    for t, held in enumerate(windows):
        if not held:  # stored rows fit any index
            continue
        size = layout.vocab_size**t
        needed = widest_range(table[offsets[t] : offsets[t] + size + 1])
        if needed > held:
            raise ValueError(
                f"The index does not fit this layer's eligibility windows: a code of "
                f"depth {t} needs {needed} words, the layer reads {held} "
                f"({list(windows)}); build a layer for this index"
            )
    out = {"dense_boundaries": table}
    if layout.dense_levels:
        out["dense_member_codes"] = dense_eligibility.dense_member_codes(layout, table)
    for t, window in enumerate(windows):
        if window:
            fields = code_fields(layout.vocab_size, layout.num_members, table, offsets, t, window)
            first = layout.dense_mask_offsets[t]
            rows = arrays["dense_masks"][first : first + layout.vocab_size**t]
            out[f"dense_code_fields_{t}"] = planes_first(fields)
            out[f"dense_mask_fields_{t}"] = planes_first(mask_fields(rows))
    return out
