"""Partitions of a semantic-ID set by its first tokens, and their tails.

A partition holds every row whose first `p` tokens (its *key*, read as a
base-V number) are the same. The trie's subtrees below depth `p` are then
independent: partition `k` owns a contiguous run of every level `t >= p`,
and partitions in key order are the levels in state order. So each
partition is sorted, deduplicated and compiled on its own, with the builder's
functions, into its *tail*: per level `t >= p` its node count, its widest
fan-out, the child tokens of its depth-t nodes, and, where one of them has
more than one child, where each node's children start. The merge
(`merge.py`) places tails at level-by-level offsets.

Row order matters only with item ids (`on_duplicate_item="first"/"last"`
follow input order): each row then carries `file_index << 40 | row`, and a
partition is put back in that order before the builder's stable sort, which
is the order `StaticIndex.build` sees when the files are concatenated in
sorted path order.

NumPy only.
"""

from __future__ import annotations

import io

import numpy as np

from static_keras.index.builder import _parent_starts
from static_keras.index.builder import count_levels
from static_keras.index.builder import sort_unique

#: `partition_levels="auto"` takes the fewest first tokens that give at least
#: this many possible keys (V = 2048: the first token; V = 16: two).
MIN_PARTITIONS = 256
#: Rows per file at most 2**40 (the low bits of a row's order key).
ROW_BITS = 40


def choose_partition_levels(vocab_size: int, length: int, partition_levels="auto") -> int:
    """The key length p: `"auto"` (see `MIN_PARTITIONS`) or a checked integer."""
    if partition_levels == "auto":
        p = 1
        while p < length and vocab_size**p < MIN_PARTITIONS:
            p += 1
        return p
    if isinstance(partition_levels, bool) or not isinstance(partition_levels, (int, np.integer)):
        raise ValueError(
            "`partition_levels` must be 'auto' or an integer. "
            f"Received: partition_levels={partition_levels!r}"
        )
    p = int(partition_levels)
    if not 1 <= p <= length:
        raise ValueError(
            f"`partition_levels` must lie in [1, length={length}]. Received: partition_levels={p}"
        )
    if vocab_size**p >= 2**63:
        raise ValueError(
            f"`partition_levels={p}` makes keys of vocab_size**{p} values, more than int64 holds"
        )
    return p


def partition_keys(rows: np.ndarray, vocab_size: int, p: int) -> np.ndarray:
    """int64 `[n]`: the first `p` tokens of each row as a base-V number."""
    keys = np.zeros(len(rows), dtype=np.int64)
    for t in range(p):
        keys *= vocab_size
        keys += rows[:, t]
    return keys


def key_rows(keys: np.ndarray, vocab_size: int, p: int) -> np.ndarray:
    """The inverse of `partition_keys`: int64 `[k, p]` token prefixes."""
    rows = np.empty((len(keys), p), dtype=np.int64)
    rest = np.asarray(keys, dtype=np.int64).copy()
    for t in range(p - 1, -1, -1):
        rows[:, t] = rest % vocab_size
        rest //= vocab_size
    return rows


def sort_block(rows, item_ids, order, vocab_size: int, p: int):
    """One block of rows (and their ids and order keys) sorted by partition key.

    Returns `(keys, rows, item_ids, order)`, all in key order (stable).
    """
    keys = partition_keys(rows, vocab_size, p)
    by_key = np.argsort(keys, kind="stable")
    if item_ids is not None:
        item_ids, order = item_ids[by_key], order[by_key]
    return keys[by_key], rows[by_key], item_ids, order


def key_runs(keys: np.ndarray):
    """Yields `(key, start, stop)` for each run of equal sorted keys."""
    bounds = np.flatnonzero(keys[1:] != keys[:-1]) + 1
    starts = [0] + bounds.tolist()
    stops = bounds.tolist() + [len(keys)]
    for start, stop in zip(starts, stops):
        yield int(keys[start]), start, stop


def build_tail(chunks, vocab_size: int, p: int, on_duplicate_item: str) -> dict[str, np.ndarray]:
    """Compiles the rows of one partition into its tail.

    `chunks` are `(rows, item_ids, order)` triples (None without item ids).

    Returns arrays: `counts` int64 `[L + 1]` (nodes per depth; depths below p
    count the one shared prefix), `widths` int64 `[L]` (0 below p),
    `tokens` (child tokens of levels p..L-1, concatenated), `starts` (int64,
    children's first positions for the levels whose width > 1, concatenated)
    `rows` (input rows, duplicates included) and, with item ids,
    `leaf_item_ids`.

    Raises:
        ValueError: the builder's, e.g. two item ids of one semantic ID.
    """
    chunks = list(chunks)
    rows = np.concatenate([c[0] for c in chunks])
    item_ids = order = None
    if chunks[0][1] is not None:
        item_ids = np.concatenate([c[1] for c in chunks])
        order = np.argsort(np.concatenate([c[2] for c in chunks]), kind="stable")
        rows, item_ids = rows[order], item_ids[order]
    del chunks, order
    num_rows, length = rows.shape
    sorted_cols, lcp, leaf_item_ids = sort_unique(rows, vocab_size, item_ids, on_duplicate_item)
    del rows, item_ids
    counts = count_levels(lcp, length)
    widths = [0] * length
    tokens, starts = [], []
    for t in range(p, length):
        level_starts = _parent_starts(lcp, t)
        widths[t] = int(np.diff(level_starts, append=counts[t + 1]).max())
        tokens.append(sorted_cols[t][lcp <= t])
        if widths[t] > 1:
            starts.append(level_starts.astype(np.int64))
    tail = {
        "counts": np.asarray(counts, dtype=np.int64),
        "widths": np.asarray(widths, dtype=np.int64),
        "tokens": np.concatenate(tokens) if tokens else sorted_cols[0][:0],
        "starts": np.concatenate(starts) if starts else np.zeros(0, np.int64),
        "rows": np.int64(num_rows),
    }
    if leaf_item_ids is not None:
        tail["leaf_item_ids"] = leaf_item_ids
    return tail


def tail_levels(tail: dict[str, np.ndarray], p: int):
    """Yields `(t, tokens, starts)` for t in [p, L): one level of a tail."""
    counts, widths = tail["counts"], tail["widths"]
    token0 = start0 = 0
    for t in range(p, len(widths)):
        tokens = tail["tokens"][token0 : token0 + counts[t + 1]]
        token0 += counts[t + 1]
        if widths[t] > 1:
            starts = tail["starts"][start0 : start0 + counts[t]]
            start0 += counts[t]
        else:
            starts = np.arange(counts[t], dtype=np.int64)
        yield t, tokens, starts


def to_bytes(tail: dict[str, np.ndarray]) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **tail)
    return buffer.getvalue()


def from_bytes(data: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(data), allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}
