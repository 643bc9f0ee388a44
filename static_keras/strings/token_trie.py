"""`TokenTrie`: the vocabulary side of a string constraint, built once.

A byte trie over the bytes of every token that may appear in text (special
and control tokens, EOS and empty tokens excluded), plus, for each trie node,
the token ids whose bytes end there (several ids may share the same bytes).
Compiling a string set walks this trie against the trie of the strings, so
the vocabulary is sorted and tokenised once, however many string sets are
compiled against it.

NumPy only.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from static_keras.strings.byte_trie import ByteTrie
from static_keras.strings.byte_trie import build_byte_trie
from static_keras.strings.byte_trie import sort_unique

#: Memory for the dense child table of the shallow token-trie levels.
DENSE_BUDGET_BYTES = 8 * 2**20


@dataclasses.dataclass(frozen=True)
class TokenTrie:
    """Token byte strings in a `ByteTrie`, with the token ids of each node.

    Attributes:
        trie: `ByteTrie` of the distinct token byte strings.
        token_indptr: int64 `[N + 1]`: the tokens ending at node `n` are
            `token_ids[token_indptr[n]:token_indptr[n + 1]]`.
        token_ids: int32, sorted by node, then id.
        allowed: bool `[V]`, the tokens in the trie.
        dense_children: int32 `[D, 256]`: the child of each of the first `D`
            nodes (the shallow levels, where lookups concentrate) by byte,
            -1 if none; deeper nodes binary-search their children's bytes.
        node_info: int32 `[N, 4]`: per node its first token (in
            `token_ids`), token count, first child and child count, side by
            side so that a compiled walk reads one cache line per node.
    """

    trie: ByteTrie
    token_indptr: np.ndarray
    token_ids: np.ndarray
    allowed: np.ndarray
    dense_children: np.ndarray
    node_info: np.ndarray

    @classmethod
    def build(cls, token_bytes: list[bytes], allowed: np.ndarray) -> "TokenTrie":
        """Builds the trie of the tokens where `allowed` is True and non-empty."""
        allowed = np.asarray(allowed, bool).copy()
        lengths = np.fromiter(map(len, token_bytes), np.int64, len(token_bytes))
        allowed &= lengths > 0
        ids = np.flatnonzero(allowed)
        unique, _, inverse = sort_unique([token_bytes[i] for i in ids])
        trie, ends = build_byte_trie(unique)
        node = ends[inverse]
        order = np.lexsort((ids, node))
        counts = np.bincount(node, minlength=trie.num_nodes)
        indptr = np.zeros(trie.num_nodes + 1, np.int64)
        np.cumsum(counts, out=indptr[1:])
        return cls(
            dense_children=_dense_children(trie),
            node_info=np.stack(
                [indptr[:-1], counts, trie.first_child, trie.num_children], axis=1
            ).astype(np.int32),
            trie=trie,
            token_indptr=indptr,
            token_ids=ids[order].astype(np.int32),
            allowed=allowed,
        )

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.size)

    @property
    def max_token_length(self) -> int:
        return self.trie.max_depth

    @property
    def nbytes(self) -> int:
        return (
            self.trie.nbytes
            + self.token_indptr.nbytes
            + self.token_ids.nbytes
            + self.allowed.nbytes
            + self.dense_children.nbytes
            + self.node_info.nbytes
        )


def _dense_children(trie: ByteTrie, budget_bytes: int = DENSE_BUDGET_BYTES) -> np.ndarray:
    """Child table of the shallowest whole levels that fit in `budget_bytes`."""
    rows = 1
    for depth in range(1, trie.max_depth + 1):
        end = int(trie.level_offsets[depth + 1])
        if end * 256 * 4 > budget_bytes:
            break
        rows = end
    table = np.full((rows, 256), -1, np.int32)
    child = np.flatnonzero(trie.parent < rows)
    child = child[child > 0]
    table[trie.parent[child], trie.byte[child]] = child
    return table
