"""The best `k` of each batch row with at most `dense_top_k` per beam, without a top-k per beam.

A beam search with "tokens per beam" (the reference's `tokens_per_beam`,
our `dense_top_k`) keeps each beam's best `dense_top_k` tokens, then the
best `k` (the beam size) of those over the batch row's beams. At a dense step that is a top-k over
every row of `[B x M, V]` (`[140, 2048]` at 2 x 70): the CPU top-k kernels
of XLA and TensorFlow walk each row with a heap, and that one call was the
largest single cost of a decode at 10^7 items.

The same result from rankings of the whole batch row: rank every (beam,
token) of the row (`two_stage_top_k`'s blocks); a beam holding more than
`dense_top_k` of the best `k` has its best `dense_top_k` among them, in
order, so its `dense_top_k`-th entry there is its limit; cap each such beam
at its limit and rank again. Entries of an earlier ranking that survive a
cap stay in the next one (removing entries only moves the rest up), so
every capped beam keeps its `dense_top_k` entries and at most
`(k - 1) // dense_top_k` beams are ever capped: `(k - 1) // dense_top_k + 1`
rankings are always enough (3 at 70 / 30). The block
maxima of the whole row are computed once; a capped beam's blocks take the
maxima of its admitted entries, which all lie in the previous ranking.

Ties resolve as the per-beam form resolves them (a beam's best `dense_top_k` are
the first by (score desc, token asc); the ranking prefers the lower beam,
then the lower token), so the result equals per-beam `ops.top_k` followed
by `ops.top_k` over the concatenation, value for value and index for index.
Branch-free, static shapes.
"""

from __future__ import annotations

import numpy as np
from keras import ops

from static_keras.kernels import gather

#: Values per block: 32 balances the block maxima (`M V / 32`) against the
#: chosen blocks' values (`32 k`) at V = 2048, k = 70. Narrower rows take
#: the widest power of two below it that pads them by at most a sixteenth
#: (`_block_size`): padding is a copy of the whole `[B, M, V]`.
BLOCK = 32


def capped_top_k(scores, k: int, dense_top_k: int):
    """`(values [B, k] float32, indices [B, k] int32)`: the best `k` entries
    of each batch row of `scores [B, M, V]` with at most `dense_top_k` from
    each of its M beams, sorted descending; an index is `beam * V + token`. Rows
    with fewer than `k` finite entries admitted end in `-inf` padding (its
    index is an unspecified entry). `M`, `V` static; NaN-free."""
    beams, vocab = scores.shape[1], scores.shape[2]
    size = _block_size(vocab)
    blocks = -(-vocab // size)
    if blocks * size != vocab:  # -inf padding at the end of each beam's row
        pad = [[0, 0], [0, 0], [0, blocks * size - vocab]]
        scores = ops.pad(scores, pad, constant_values=-np.inf)
    rows = ops.shape(scores)[0]
    tiles = ops.reshape(scores, (-1, size))  # [B * M * blocks, size]
    whole_maxima = ops.reshape(ops.max(tiles, axis=1), (-1, beams * blocks))
    row_first = ops.expand_dims(ops.arange(rows, dtype="int32"), 1)
    offsets = ops.arange(size, dtype="int32")
    capped = limit_value = limit_token = None  # no beam is capped before the first ranking
    maxima = whole_maxima
    width = min(k, beams * blocks)  # blocks read per ranking: the best k hold the best k
    rankings = (k - 1) // dense_top_k + 1
    for ranking in range(rankings):
        _, chosen = ops.top_k(maxima, width, sorted=False)
        # Ascending block order: the second top-k then breaks ties by (beam, token).
        chosen = ops.sort(ops.cast(chosen, "int32"), axis=-1)  # [B, width]
        picked = gather.take(tiles, ops.reshape(row_first * (beams * blocks) + chosen, (-1,)))
        picked = ops.reshape(picked, (-1, width, size))
        beam = chosen // blocks
        token = ops.expand_dims((chosen % blocks) * size, 2) + offsets  # [B, width, size]
        if capped is not None:
            admitted = _admitted(
                picked,
                token,
                gather.take_along_rows(capped, beam)[:, :, None],
                gather.take_along_rows(limit_value, beam)[:, :, None],
                gather.take_along_rows(limit_token, beam)[:, :, None],
            )
            picked = ops.where(admitted, picked, -np.inf)
        values, position = ops.top_k(ops.reshape(picked, (-1, width * size)), k, sorted=True)
        position = ops.cast(position, "int32")
        block = gather.take_along_rows(chosen, position // size)
        beam = block // blocks
        token = (block % blocks) * size + position % size
        if ranking == rankings - 1:
            return values, beam * vocab + token
        capped, limit_value, limit_token, maxima = _cap(
            values, beam, token, block, capped, limit_value, limit_token, whole_maxima,
            dense_top_k, beams, blocks,
        )  # fmt: skip


def _block_size(width: int) -> int:
    """The widest power of two up to `BLOCK` that pads a row of `width` values
    by at most `width / 16` (72 -> 8, 501 -> 32, 2048 -> 32, 5 -> 1)."""
    size = BLOCK
    while size > 1 and (-width) % size * 16 > width:
        size //= 2
    return size


def _admitted(values, token, capped, limit_value, limit_token):
    """Whether each entry is among its beam's best `dense_top_k`: any entry of an
    uncapped beam; of a capped one, those at or before its limit in (score
    desc, token asc) order."""
    before = ops.logical_or(
        ops.greater(values, limit_value),
        ops.logical_and(ops.equal(values, limit_value), ops.less_equal(token, limit_token)),
    )
    return ops.logical_or(ops.logical_not(capped), before)


def _cap(values, beam, token, block, capped, limit_value, limit_token, whole_maxima,
         dense_top_k, beams, blocks):  # fmt: skip
    """After a ranking (`[B, k]`: values, beam, token, block of each entry):
    caps every beam holding more than `dense_top_k` entries at its
    `dense_top_k`-th, and
    returns the block maxima of the next ranking (a capped beam's blocks:
    the maxima of its admitted entries, all in this ranking)."""
    k = values.shape[1]
    live = ops.greater(values, -np.inf)
    one_hot = ops.logical_and(
        ops.equal(ops.expand_dims(beam, 2), ops.arange(beams, dtype="int32")),
        ops.expand_dims(live, 2),
    )  # [B, k, M]
    count = ops.sum(ops.cast(one_hot, "int32"), axis=1)  # [B, M]
    same = ops.equal(ops.expand_dims(beam, 2), ops.expand_dims(beam, 1))  # [B, k, k]
    earlier = ops.arange(k)[:, None] > ops.arange(k)[None, :]  # [i, j]: j before i
    position = ops.sum(ops.cast(ops.logical_and(same, earlier[None]), "int32"), axis=2)
    at_limit = ops.logical_and(one_hot, ops.expand_dims(ops.equal(position, dense_top_k - 1), 2))
    new_value = ops.max(ops.where(at_limit, ops.expand_dims(values, 2), -np.inf), axis=1)
    new_token = ops.max(ops.where(at_limit, ops.expand_dims(token, 2), -1), axis=1)
    over = ops.greater(count, dense_top_k)  # [B, M]; never a beam capped before
    if capped is None:
        capped, limit_value, limit_token = over, new_value, new_token
    else:
        capped = ops.logical_or(capped, over)
        limit_value = ops.where(over, new_value, limit_value)
        limit_token = ops.where(over, new_token, limit_token)
    # The admitted entries of capped beams (their first `dense_top_k` here), by block.
    keep = ops.logical_and(
        ops.logical_and(live, ops.less(position, dense_top_k)),
        gather.take_along_rows(capped, beam),
    )
    rows = ops.shape(values)[0]
    segments = beams * blocks
    first = ops.expand_dims(ops.arange(rows, dtype="int32") * segments, 1)
    ids = ops.reshape(ops.where(keep, first + block, rows * segments), (-1,))
    flat = ops.reshape(ops.where(keep, values, -np.inf), (-1,))
    found = ops.segment_max(flat, ids, num_segments=rows * segments + 1)[:-1]
    held = ops.segment_sum(ops.ones_like(flat), ids, num_segments=rows * segments + 1)[:-1]
    capped_maxima = ops.reshape(ops.where(ops.greater(held, 0), found, -np.inf), (-1, segments))
    block_capped = ops.reshape(
        ops.repeat(ops.expand_dims(capped, 2), blocks, axis=2), (-1, segments)
    )
    return capped, limit_value, limit_token, ops.where(block_capped, capped_maxima, whole_maxima)
