"""`StaticIndex`: a valid set of token sequences in STATIC's device layout."""

from __future__ import annotations

import numpy as np

from static_keras.index import member_ranges
from static_keras.index import tree_walk
from static_keras.index.automaton import TokenAutomaton
from static_keras.index.builder import DEFAULT_DENSE_BUDGET_BYTES
from static_keras.index.builder import build_arrays
from static_keras.index.headroom import check_headroom
from static_keras.index.layout import IndexLayout


class StaticIndex(TokenAutomaton):
    """A valid set of token sequences, compiled for constrained decoding.

    STATIC (Sparse Transition Matrix-Accelerated Trie Index) stores the trie
    of the valid sequences as flat arrays that an accelerator reads with
    fixed-width gathers: for the first `dense_levels` steps, bit-packed masks
    indexed by the prefix itself (1 bit per token), then a CSR matrix of
    child tokens per trie state. The tree numbering makes next states
    implicit, and levels where no state branches store no row pointers.

    Build one with `StaticIndex.build`, save it with `save`, load it with
    `StaticIndex.load`, and hand it to `ConstrainedDecoding`,
    `ConstrainedBeamSearch` or `beam_search`. The query methods (`contains`,
    `allowed_tokens`, `lookup_item_ids`) answer on the host with NumPy. It is
    the semantic-ID kind of `TokenAutomaton`, the contract it shares with
    `StringIndex`: `walk` gives a prefix's decoding state (the one a beam
    carries), `edges` and `next_states` step states on the host.

    Example:

    >>> import numpy as np
    >>> index = StaticIndex.build([[1, 2], [1, 3], [0, 2]], vocab_size=4)
    >>> index.num_sequences, index.step_widths
    (3, (2, 2))
    >>> index.allowed_tokens(np.array([[1]]))[0].nonzero()[0].tolist()
    [2, 3]
    >>> index.contains([[1, 3], [3, 1]]).tolist()
    [True, False]

    References:
        Su et al., "Vectorizing the Trie: Efficient Constrained Decoding for
        LLM-based Generative Retrieval on Accelerators" (arXiv:2602.22647).
    """

    kind = "semantic_ids"
    layout_class = IndexLayout

    @classmethod
    def build(
        cls,
        sequences,
        vocab_size: int,
        *,
        item_ids=None,
        dense_levels: int | str = "auto",
        on_duplicate_item: str = "error",
        dense_budget_bytes: int = DEFAULT_DENSE_BUDGET_BYTES,
        headroom: float = 0.0,
        progress=None,
    ) -> "StaticIndex":
        """Compiles the valid set `sequences` into an index.

        Args:
            sequences: int array-like `[N, L]`, tokens in `[0, vocab_size)`.
                Duplicate rows are fine (they count once).
            vocab_size: int. Number of token ids, V.
            item_ids: optional int array-like `[N]`: the catalogue id of each
                row, returned by `lookup_item_ids` and by beam search.
            dense_levels: int in `[0, L]`, or `"auto"`. Steps served by the
                bit-packed dense head. `"auto"` takes the largest d whose
                tables (`V**d` int32 state map plus masks) fit in
                `dense_budget_bytes` and are at most 1 MiB or at least 1/64
                full. Defaults to `"auto"`.
            on_duplicate_item: `"error"`, `"first"` or `"last"`: what to do
                when one sequence has two different item ids. Defaults to
                `"error"`.
            dense_budget_bytes: int. Memory cap of the `"auto"` rule.
                Defaults to 64 MiB.
            headroom: float >= 0. Capacities above the catalogue: each level
                holds `ceil(n * (1 + headroom))` slots and each step's width
                cap is `B_t + ceil(headroom * B_t)` (at least 2 past the
                dense head), so that a new catalogue within them is new
                tensor values for the same graph (`apply_delta`, the
                `update-catalogue` job). Answers are exactly those without
                headroom. Defaults to 0 (the exact layout; docs/serving.md
                gives the cost of 0.1).
            progress: optional callable `(stage: str, fraction: float)`,
                called as the build advances (the CLI draws a bar with it).

        Raises:
            ValueError: naming the problem with the input.
        """
        check_headroom(headroom)  # before the work
        layout, arrays = build_arrays(
            sequences,
            vocab_size,
            item_ids=item_ids,
            dense_levels=dense_levels,
            on_duplicate_item=on_duplicate_item,
            dense_budget_bytes=dense_budget_bytes,
            progress=progress,
            headroom=headroom,
        )
        return cls(layout, arrays)

    # Properties --------------------------------------------------------------

    @property
    def num_sequences(self) -> int:
        """Distinct valid sequences."""
        return self._layout.num_sequences

    def __repr__(self) -> str:
        return (
            f"StaticIndex(num_sequences={self.num_sequences}, "
            f"vocab_size={self.vocab_size}, length={self.length}, "
            f"dense_levels={self.dense_levels}, step_widths={self.step_widths}, "
            + (f"capacity={self.num_members}, " if self.layout.has_headroom else "")
            + f"nbytes={self.nbytes})"
        )

    # Queries (host side, vectorised) ----------------------------------------

    def _check_prefixes(self, prefixes, *, max_length: int, name: str) -> np.ndarray:
        array = np.asarray(prefixes)
        if array.ndim == 1 and array.size == 0:
            array = array.reshape(1, 0)
        if array.ndim != 2:
            raise ValueError(f"`{name}` must have rank 2. Received shape {array.shape}")
        if array.size and (array.dtype == bool or not np.issubdtype(array.dtype, np.integer)):
            raise ValueError(f"`{name}` must hold integers. Received dtype {array.dtype}")
        if array.shape[1] > max_length:
            raise ValueError(
                f"`{name}` has length {array.shape[1]}; at most {max_length} "
                f"for an index of length {self.length}"
            )
        return array.astype(np.int64, copy=False)

    def _full_length(self, sequences) -> np.ndarray:
        seqs = self._check_prefixes(sequences, max_length=self.length, name="sequences")
        if seqs.shape[1] != self.length:
            raise ValueError(
                f"`sequences` must have length {self.length}. Received shape {seqs.shape}"
            )
        return seqs

    def walk(self, sequences) -> np.ndarray:
        """int64 `[n]`: the decoding state after each prefix (all of one length
        t <= L), -1 where the prefix leaves the valid set."""
        prefixes = self._check_prefixes(sequences, max_length=self.length, name="sequences")
        return self._walk(prefixes)

    def _walk(self, prefixes: np.ndarray) -> np.ndarray:
        return tree_walk.walk(self._layout, self._arrays, prefixes)

    def depth(self, states) -> np.ndarray:
        """int64 `[n]`: tokens decoded to reach each state, -1 outside the index."""
        states = self._states(states)
        starts = np.asarray(self._layout.depth_starts, np.int64)
        depth = np.searchsorted(starts, states, side="right") - 1
        return np.where((states >= 0) & (states < self._layout.state_space), depth, -1)

    def edges(self, states) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """All valid `(row, token, next_state)` of decoding `states`, sorted by
        row then token; states outside the index (-1) allow nothing."""
        states = self._states(states)
        depth = self.depth(states)
        parts = []
        for t in range(self.length):
            rows = np.flatnonzero(depth == t)
            if rows.size:
                row, token, target = self._expand(self._local(states[rows], t), t)
                parts.append((rows[row], token, self._global(target, t + 1)))
        if not parts:
            empty = np.zeros(0, np.int64)
            return empty, empty.astype(np.int32), empty
        row, token, target = (np.concatenate(p) for p in zip(*parts))
        order = np.lexsort((token, row))
        return row[order], token[order], target[order]

    def member_ranges(self, states) -> tuple[np.ndarray, np.ndarray]:
        """`(lo, hi)` int64 `[n]`: the leaves below each decoding state are
        members `lo .. hi - 1` (sorted leaves: always one range); `lo == hi`
        for -1, states past the index and dense codes no member starts with.

        Derived from the CSR arrays (first child down to the leaves; `hi(s)`
        is `lo(s + 1)` at the same depth) plus a small table for the dense
        head, built on first use: no array per state
        (`static_keras.index.member_ranges`).

        >>> index = StaticIndex.build([[1, 2], [1, 3], [0, 2]], vocab_size=4)
        >>> [r.tolist() for r in index.member_ranges(index.walk([[1], [0], [2]]))]
        [[1, 0, 0], [3, 1, 0]]
        """
        tables = getattr(self, "_dense_first_members", None)
        if tables is None:
            tables = member_ranges.dense_first_members(self._layout, self._arrays)
            self._dense_first_members = tables
        return member_ranges.tree_member_ranges(
            self._layout, self._arrays, self._states(states), tables
        )

    @property
    def member_range_nbytes(self) -> int:
        """Host bytes `member_ranges` adds to the index (its dense-head table)."""
        self.member_ranges(np.zeros(0, np.int64))
        return sum(table.nbytes for table in self._dense_first_members)

    def _local(self, states: np.ndarray, t: int) -> np.ndarray:
        """Decoding states at depth t -> codes (t < d) or tail states."""
        if t < self._layout.dense_levels:
            return states - self._layout.dense_mask_offsets[t]
        return states - self._layout.dense_head_states

    def _global(self, local: np.ndarray, t: int) -> np.ndarray:
        """Codes (t < d) or tail states at depth t -> decoding states."""
        if t < self._layout.dense_levels:
            return local + self._layout.dense_mask_offsets[t]
        return local + self._layout.dense_head_states

    def contains(self, sequences) -> np.ndarray:
        """bool `[n]`: whether each full-length sequence is in the valid set."""
        return self._walk(self._full_length(sequences)) >= 0

    def allowed_tokens(self, prefixes) -> np.ndarray:
        """bool `[n, vocab_size]`: valid next tokens after each prefix.

        Args:
            prefixes: int array-like `[n, t]` with `0 <= t < length` (one
                length per call; an empty 1-D list is one empty prefix), or
                int `[n]` decoding states (as `walk` returns). A prefix
                outside the valid set allows nothing.
        """
        array = np.asarray(prefixes)
        if array.ndim == 1 and array.size:
            return super().allowed_tokens(array)
        prefixes = self._check_prefixes(array, max_length=self.length - 1, name="prefixes")
        state = self._walk(prefixes)
        code_or_tail = self._local(state, prefixes.shape[1])
        valid = np.flatnonzero(state >= 0)
        row, token, _ = self._expand(code_or_tail[valid], prefixes.shape[1])
        out = np.zeros((prefixes.shape[0], self.vocab_size), dtype=bool)
        out[valid[row], token] = True
        return out

    def lookup_item_ids(self, sequences) -> np.ndarray:
        """int64 `[n]`: the item id of each sequence, -1 where not in the set."""
        if not self.has_item_ids:
            raise ValueError("This index was built without `item_ids`")
        return self.item_ids(self._walk(self._full_length(sequences)))

    def sequences(self) -> np.ndarray:
        """All distinct valid sequences, sorted, as int32 `[num_sequences, L]`."""
        prefix = np.zeros((1, 0), dtype=np.int32)
        state = np.zeros(1, dtype=np.int64)
        for t in range(self.length):
            row, token, state = self._expand(state, t)
            prefix = np.concatenate([prefix[row], token[:, None]], axis=1)
        return prefix

    def _expand(self, state: np.ndarray, t: int):
        """All edges out of codes (t < d) or tail states at depth t:
        `(row, token, next code or tail state)`."""
        return tree_walk.expand(self._layout, self._arrays, state, t)
