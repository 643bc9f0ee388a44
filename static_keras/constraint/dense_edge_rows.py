"""The last dense step's edges as CSR rows, where its fan-out is small.

At the last dense step (depth d - 1) a state's children are depth-d tail
states, and tail states are numbered in prefix order, so the children of
each code are a run of consecutive tail states. Stored as CSR rows (a row
pointer per code, the token of each depth-d state), the step reads `B` slots
per row, as a tail step does, instead of unpacking a V-bit mask row and
ranking all V tokens: with `B` the step's largest fan-out, the per-beam
top-k runs over `B` values, not V, and a candidate's next state is its edge
number (no read of the `V**d` state map). A semantic-ID set of 1e5 items
over V = 2048, d = 2 has B of about 75.

The rows cost a token per depth-d state and a pointer per code of depth
d - 1; the layer keeps them only where they pay: `B <= WIDTH_FRACTION * V`
(measured in docs/benchmarks.md). The arrays follow from the index's dense state map, so
they are derived when an index is loaded (and filled in for layers saved
before them), never stored in the index archive.
"""

from __future__ import annotations

import numpy as np

from static_keras.index.layout import IndexLayout
from static_keras.index.layout import token_dtype

POINTERS, TOKENS = "dense_edge_indptr", "dense_edge_tokens"

#: The widest rows kept, as a fraction of the vocabulary: at V = 2048 a
#: [140, 1024]-slot step still beats unpacking and ranking [140, 2048]; at
#: 1900 slots it no longer does.
WIDTH_FRACTION = 0.5


def edge_row_step(layout: IndexLayout) -> int | None:
    """The dense step served by CSR rows (the last, d - 1), or None where its
    rows would be wider than `WIDTH_FRACTION` of the vocabulary (or there is
    no dense head)."""
    step = layout.dense_levels - 1
    if step < 0 or layout.step_widths[step] > WIDTH_FRACTION * layout.vocab_size:
        return None
    return step


def shapes(layout: IndexLayout) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Shape and dtype of the two arrays (none without an edge-row step)."""
    step = edge_row_step(layout)
    if step is None:
        return {}
    return _shapes(layout, step)


def _shapes(layout: IndexLayout, step: int):
    return {
        POINTERS: ((layout.vocab_size**step + 1,), np.dtype(np.int32)),
        TOKENS: ((max(1, layout.level_sizes[step + 1]),), token_dtype(layout.vocab_size)),
    }


def arrays(layout: IndexLayout, dense_states: np.ndarray) -> dict[str, np.ndarray]:
    """The rows from the dense state map (`V**d` codes -> depth-d tail state,
    -1 outside the set): the codes present, in order, are the depth-d tail
    states 0, 1, ...; code `p * V + token` is child `token` of code `p`."""
    if not layout.dense_levels:
        return {}
    found = _shapes(layout, layout.dense_levels - 1)
    vocab = layout.vocab_size
    codes = np.flatnonzero(np.asarray(dense_states) >= 0)
    if not np.array_equal(dense_states[codes], np.arange(codes.size)):
        raise ValueError("The dense state map does not number depth-d states in prefix order")
    parents = np.arange(found[POINTERS][0][0], dtype=np.int64)
    pointers = np.searchsorted(codes // vocab, parents).astype(np.int32)
    tokens = np.zeros(found[TOKENS][0], found[TOKENS][1])
    tokens[: codes.size] = codes % vocab
    return {POINTERS: pointers, TOKENS: tokens}
