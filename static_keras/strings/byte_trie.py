"""`ByteTrie`: a trie over byte strings, built with vectorised NumPy.

The token strings of a vocabulary are a `ByteTrie` in level order, built
once per vocabulary and reused (the member strings of a set are built in
preorder by `kernels.preorder_trie`, the order the compiler's walks need).
The build sorts the distinct strings once, then derives every node from one
number per string, the length of the prefix it shares with the previous
sorted string (`lcp`), exactly like the semantic-ID builder: string `i`
opens new nodes at depths `lcp_i + 1 .. len_i`. No Python loop over strings.

Nodes are numbered level by level (root 0, then depth 1, ...), and children
of one node are contiguous and sorted by byte, so the child range of node `n`
is `first_child[n] : first_child[n] + num_children[n]` and the edge keys
`parent * 256 + byte` of nodes `1 .. N-1` are sorted (a lookup is one
`searchsorted`).

NumPy only.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class ByteTrie:
    """A byte trie in level order (see the module docstring).

    Attributes:
        parent: int32 `[N]`, the parent of each node (-1 for the root).
        byte: uint8 `[N]`, the byte on the edge into each node (0 at the root).
        depth: int32 `[N]`, bytes from the root.
        first_child: int32 `[N]`, id of each node's first child.
        num_children: int32 `[N]`.
        level_offsets: int64 `[max_depth + 2]`, first node of each depth (and
            `N` at the end).
        keys: int64 `[N - 1]`, sorted edge keys `parent * 256 + byte` of
            nodes `1 .. N - 1`.
        root_children: int32 `[256]`, child of the root by byte, -1 if none.
    """

    parent: np.ndarray
    byte: np.ndarray
    depth: np.ndarray
    first_child: np.ndarray
    num_children: np.ndarray
    level_offsets: np.ndarray
    keys: np.ndarray
    root_children: np.ndarray

    @property
    def num_nodes(self) -> int:
        return int(self.parent.size)

    @property
    def max_depth(self) -> int:
        return int(self.level_offsets.size - 2)

    @property
    def nbytes(self) -> int:
        return sum(getattr(self, f.name).nbytes for f in dataclasses.fields(self))

    def child(self, nodes: np.ndarray, bytes_: np.ndarray) -> np.ndarray:
        """int64: the child of each node by each byte, -1 where there is none."""
        keys = nodes.astype(np.int64) * 256 + bytes_
        if self.keys.size == 0:
            return np.full(keys.shape, -1, np.int64)
        at = np.searchsorted(self.keys, keys)
        found = self.keys[np.minimum(at, self.keys.size - 1)] == keys
        return np.where(found, at + 1, -1)

    def walk(self, data: bytes) -> int:
        """The node of the byte string `data`, -1 if it leaves the trie."""
        node = 0
        for value in data:
            node = int(self.child(np.array([node]), np.array([value]))[0])
            if node < 0:
                return -1
        return node


def sort_unique(strings: Sequence[bytes]) -> tuple[list[bytes], np.ndarray, np.ndarray]:
    """Distinct byte strings in sorted order.

    Returns:
        `(unique, first, inverse)`: the sorted distinct strings, the position
        of the first occurrence of each in `strings`, and the rank of each
        input string among `unique`.
    """
    # Python's sort compares bytes with memcmp and is stable (equal strings
    # keep their input order, so the first of a run is the first occurrence);
    # a fixed-width NumPy array would take K x longest bytes.
    count = len(strings)
    order = sorted(range(count), key=strings.__getitem__)
    ordered = [strings[i] for i in order]
    new = np.ones(count, bool)
    new[1:] = np.fromiter(map(bytes.__ne__, ordered[1:], ordered[:-1]), bool, count - 1)
    order = np.asarray(order, np.int64)
    inverse = np.empty(count, np.int64)
    inverse[order] = np.cumsum(new) - 1
    unique = [value for value, is_new in zip(ordered, new.tolist()) if is_new]
    return unique, order[new], inverse


def _common_prefix_lengths(flat: np.ndarray, offsets: np.ndarray, lengths: np.ndarray):
    """lcp of each sorted string with the previous one (0 for the first)."""
    count = lengths.size
    lcp = np.zeros(count, np.int64)
    if count < 2:
        return lcp
    shorter = np.minimum(lengths[1:], lengths[:-1])
    total = int(shorter.sum())
    if total == 0:
        return lcp
    rows = np.flatnonzero(shorter)
    sizes = shorter[rows]
    starts = np.cumsum(sizes) - sizes
    segment = np.repeat(rows, sizes)
    column = np.arange(total, dtype=np.int64) - np.repeat(starts, sizes)
    differ = flat[offsets[segment + 1] + column] != flat[offsets[segment] + column]
    first_difference = np.where(differ, column, np.iinfo(np.int64).max)
    found = np.minimum.reduceat(first_difference, starts)
    lcp[rows + 1] = np.minimum(found, sizes)
    return lcp


def _previous_smaller(values: np.ndarray) -> np.ndarray:
    """For each i, the largest j < i with values[j] < values[i], else -1.

    Binary lifting over a sparse table of window minima: O(n log n),
    vectorised.
    """
    n = values.size
    tables = [values]
    span = 1
    while span * 2 <= n:
        last = tables[-1]
        nxt = last.copy()
        nxt[span:] = np.minimum(last[span:], last[:-span])
        tables.append(nxt)
        span *= 2
    position = np.arange(n, dtype=np.int64) - 1
    for level in range(len(tables) - 1, -1, -1):
        size = 1 << level
        can = position - size + 1 >= 0
        window = tables[level][np.maximum(position, 0)]
        skip = can & (window >= values)
        position = np.where(skip, position - size, position)
    # One last single step: position may still hold a value >= values[i].
    keep = position >= 0
    bad = keep & (values[np.maximum(position, 0)] >= values)
    return np.where(bad, -1, position)


def build_byte_trie(unique: Sequence[bytes]) -> tuple[ByteTrie, np.ndarray]:
    """Builds the trie of sorted, distinct, non-empty byte strings.

    Args:
        unique: sorted distinct non-empty byte strings (see `sort_unique`).

    Returns:
        `(trie, ends)`: the trie and the node of each string (int64 `[K]`).

    Example:

    >>> trie, ends = build_byte_trie([b"ab", b"abc", b"b"])
    >>> trie.num_nodes, ends.tolist()
    (5, [3, 4, 2])
    """
    count = len(unique)
    lengths = np.fromiter(map(len, unique), np.int64, count)
    if count and lengths.min() == 0:
        raise ValueError("build_byte_trie needs non-empty strings")
    flat = np.frombuffer(b"".join(unique), np.uint8)
    offsets = np.zeros(count + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    lcp = _common_prefix_lengths(flat, offsets[:-1], lengths)

    # Preorder numbering: string i opens nodes for its bytes lcp_i .. len_i-1.
    new = lengths - lcp
    base = np.zeros(count + 1, np.int64)
    np.cumsum(new, out=base[1:])
    total = int(base[-1]) + 1
    owner = np.repeat(np.arange(count), new)
    column = np.arange(total - 1, dtype=np.int64) - np.repeat(base[:-1], new) + np.repeat(lcp, new)
    pre_byte = np.zeros(total, np.uint8)
    pre_byte[1:] = flat[offsets[owner] + column]
    pre_depth = np.zeros(total, np.int64)
    pre_depth[1:] = column + 1
    pre_parent = np.full(total, -1, np.int64)
    pre_parent[1:] = np.arange(total - 1)  # the previous node of the same string
    # The first new node of string i hangs off its shared prefix s_i[:lcp_i],
    # which the first string of its block (the previous smaller lcp) opened.
    first_new = base[:-1] + 1
    opener = _previous_smaller(lcp)
    shared = np.where(
        lcp > 0, base[np.maximum(opener, 0)] + (lcp - 1 - lcp[np.maximum(opener, 0)]) + 1, 0
    )
    pre_parent[first_new] = shared

    # Level order: stable sort of the preorder ids by depth.
    depth_key = pre_depth.astype(np.uint16 if pre_depth.max() < 2**16 else np.int64)
    order = np.argsort(depth_key, kind="stable")
    level_id = np.empty(total, np.int64)
    level_id[order] = np.arange(total)
    parent = np.full(total, -1, np.int64)
    parent[1:] = level_id[pre_parent[order[1:]]]
    byte = pre_byte[order]
    depth = pre_depth[order]
    num_children = np.bincount(parent[1:], minlength=total)
    first_child = np.zeros(total, np.int64)
    np.cumsum(num_children[:-1], out=first_child[1:])
    first_child += 1
    level_offsets = np.searchsorted(depth, np.arange(int(depth[-1]) + 2))
    keys = parent[1:] * 256 + byte[1:]
    root_children = np.full(256, -1, np.int32)
    root_count = int(num_children[0])
    root_children[byte[1 : 1 + root_count]] = np.arange(1, 1 + root_count)
    ends = level_id[base[1:]]
    trie = ByteTrie(
        parent=parent.astype(np.int32),
        byte=byte,
        depth=depth.astype(np.int32),
        first_child=first_child.astype(np.int32),
        num_children=num_children.astype(np.int32),
        level_offsets=level_offsets.astype(np.int64),
        keys=keys,
        root_children=root_children,
    )
    return trie, ends
