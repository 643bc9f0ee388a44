"""`StringIndex`: K strings under a tokenizer, as a trie automaton in CSR form."""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from static_keras.index import member_ranges
from static_keras.index.automaton import TokenAutomaton
from static_keras.strings import kernels
from static_keras.strings.builder import BuildStats
from static_keras.strings.builder import build_string_arrays
from static_keras.strings.layout import StringIndexLayout
from static_keras.strings.vocabulary import vocabulary_and_eos


class StringIndex(TokenAutomaton):
    """The token sequences that spell one of K strings, compiled for decoding.

    An LLM that must answer with exactly one of K strings (a tool name, a
    product category, a medical code) may spell each string in many ways
    under its tokenizer: `"New York"` is `["New", " York"]`, `["N", "ew",
    " York"]`, and so on, and a token may end halfway through a UTF-8
    character. `StringIndex` compiles the byte trie of the K strings against
    the vocabulary: at every reachable trie node the allowed tokens are
    exactly those whose bytes stay inside the trie (across all
    tokenizations), plus EOS where the prefix is a complete member; special
    and control tokens are never allowed. Each (state, token) leads to the
    node at the token's last byte (explicit next states: two token paths can
    reach one node), and EOS leads to the member's accept state. States from
    which no member can be completed are pruned.

    The automaton is stored as CSR rows (`indptr`, sorted `tokens`,
    `next_states`, narrowest dtypes) plus per-step widths `B_t` computed over
    the states reachable after exactly t tokens, so the same fixed-width
    gather as STATIC's sparse tail serves each decoding step. Item ids are
    positions in the caller's list (the first one for duplicates).

    A `TokenAutomaton`, like `StaticIndex`: use it with `beam_search`,
    `ConstrainedBeamSearch`, a `StringConstrainedDecoding` layer
    (`static_keras.layers.constraint_for(index)` makes the layer of either
    kind), the stateless `StringLogitsProcessor`, or the host-side queries
    below (`walk`, `edges`, `allowed_tokens` of states or prefixes).

    Example:

    >>> from static_keras.strings import TokenVocabulary
    >>> vocab = TokenVocabulary.from_token_bytes(
    ...     [b"a", b"b", b"c", b"ab", b"bc", b"<eos>"], special=[5])
    >>> index = StringIndex.from_strings(["abc", "b"], vocab, eos_token_id=5)
    >>> index.num_members, index.length
    (2, 4)
    >>> np.flatnonzero(index.allowed_tokens([0])[0]).tolist()  # a, b, ab
    [0, 1, 3]
    >>> state = index.walk([[3]])[0]  # after "ab"
    >>> np.flatnonzero(index.allowed_tokens([state])[0]).tolist()
    [2]
    >>> index.lookup_item_ids([[3, 2, 5], [1, 5], [1, 2, 5]]).tolist()
    [0, 1, -1]

    References:
        Xu and Bouyarmane, "Trie Automata for Constrained Decoding over Large
        Finite Sets" (arXiv:2608.12574).
    """

    kind = "strings"
    layout_class = StringIndexLayout

    def __init__(
        self,
        layout: StringIndexLayout,
        arrays: dict[str, np.ndarray],
        *,
        vocab_checksum: str | None = None,
        stats: BuildStats | None = None,
    ):
        super().__init__(layout, arrays)
        self.vocab_checksum = vocab_checksum
        self.stats = stats
        self._edge_keys = None
        self._bitmask_writer = None

    @classmethod
    def expected_shapes(cls, layout: StringIndexLayout, arrays: dict[str, np.ndarray]) -> dict:
        """Device arrays of the layout plus the member strings (host only)."""
        offsets = arrays.get("string_offsets")
        data = arrays.get("string_data")
        if offsets is None or data is None or offsets.ndim != 1 or offsets.size < 2:
            raise ValueError("A StringIndex needs `string_offsets` and `string_data` arrays")
        shapes = dict(layout.array_shapes())
        shapes["string_data"] = ((data.size,), np.dtype(np.uint8))
        shapes["string_offsets"] = ((offsets.size,), np.dtype(np.int64))
        return shapes

    @classmethod
    def from_strings(
        cls,
        strings: Sequence[str | bytes],
        vocabulary,
        *,
        eos_token_id: int | None = None,
        max_length: int | None = None,
    ) -> "StringIndex":
        """Compiles K strings against a token vocabulary.

        Args:
            strings: sequence of `str` (encoded as UTF-8) or `bytes`. Duplicates
                are fine (item id: the first position); one string may be a
                prefix of another.
            vocabulary: `TokenVocabulary`, a list of token byte strings, or a
                path to a `.gguf`, `.tiktoken` or `tokenizer.json` file. Reuse
                one `TokenVocabulary` across string sets: its token trie is
                built on first use and kept.
            eos_token_id: int. The token that ends an answer; defaults to the
                vocabulary's. It is never allowed as text.
            max_length: int or None. The most decoding steps, EOS included.
                Defaults to the longest tokenization of any member plus one.
                A shorter `max_length` keeps every member whose shortest
                tokenization fits (beams that run out are dropped).

        Raises:
            ValueError: an empty set, an empty string, strings no token
                sequence spells, an EOS id outside the vocabulary, a
                `max_length` too short for some member.
        """
        vocabulary, eos_token_id = vocabulary_and_eos(vocabulary, eos_token_id)
        layout, arrays, host, stats = build_string_arrays(
            strings, vocabulary, eos_token_id=eos_token_id, max_length=max_length
        )
        arrays.update(host)
        return cls(layout, arrays, vocab_checksum=vocabulary.checksum, stats=stats)

    # Persistence ------------------------------------------------------------

    def archive_extra(self) -> dict:
        return {} if self.vocab_checksum is None else {"vocab_checksum": self.vocab_checksum}

    @classmethod
    def from_archive(cls, path, layout, arrays, document, *, vocabulary=None) -> "StringIndex":
        """`load(path, vocabulary=None)`: when a `TokenVocabulary` is given, it
        must be the one the index was compiled against (same checksum)."""
        stored = document.get("vocab_checksum")
        if vocabulary is not None and stored is not None and vocabulary.checksum != stored:
            raise ValueError(
                f"{os.fspath(path)!r} was compiled against another vocabulary "
                "(its checksum differs from the one given)"
            )
        return cls(layout, arrays, vocab_checksum=stored)

    # Properties --------------------------------------------------------------

    @property
    def num_strings(self) -> int:
        """Strings given, duplicates included (item ids lie in [0, num_strings))."""
        return int(self._arrays["string_offsets"].size - 1)

    def string_bytes(self, item_id: int) -> bytes:
        """The bytes of string `item_id` (its position in the caller's list)."""
        offsets = self._arrays["string_offsets"]
        if not 0 <= item_id < offsets.size - 1:
            raise ValueError(f"`item_id` must lie in [0, {offsets.size - 1}). Received {item_id}")
        return self._arrays["string_data"][offsets[item_id] : offsets[item_id + 1]].tobytes()

    @property
    def strings(self) -> list[str]:
        """The strings as given (UTF-8 decoded; invalid bytes replaced)."""
        data = self._arrays["string_data"].tobytes()
        offsets = self._arrays["string_offsets"].tolist()
        return [data[a:b].decode("utf-8", errors="replace") for a, b in zip(offsets, offsets[1:])]

    def __repr__(self) -> str:
        return (
            f"StringIndex(num_members={self.num_members}, vocab_size={self.vocab_size}, "
            f"length={self.length}, eos_token_id={self.eos_token_id}, "
            f"num_states={self.num_states}, max_width={self._layout.max_width}, "
            f"nbytes={self.nbytes})"
        )

    # Host-side queries (NumPy, vectorised, stateless) -------------------------

    def edges(self, states) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """All allowed (row, token, next state) of `states`; invalid states allow none."""
        states = self._states(states)
        indptr = self._arrays["indptr"]
        valid = (states >= 0) & (states < self.num_states)
        safe = np.where(valid, states, 0)
        start = indptr[safe].astype(np.int64)
        counts = np.where(valid, indptr[safe + 1] - start, 0)
        row = np.repeat(np.arange(states.size), counts)
        first = np.cumsum(counts) - counts
        edge = np.arange(row.size) + np.repeat(start - first, counts)
        tokens = self._arrays["tokens"][edge].astype(np.int32)
        return row, tokens, self._arrays["next_states"][edge].astype(np.int32)

    def fill_bitmask(self, states, out: np.ndarray | None = None) -> np.ndarray:
        """int32 `[n, ceil(V / 32)]`: allowed tokens as bits (token t: word
        t // 32, bit t % 32), the layout XGrammar and vLLM use. `out`, when
        given, is overwritten (its first n rows).

        One compiled pass over the rows (`kernels.BitmaskWriter`, built on
        first use): wide states (more allowed tokens than a bitmask row has
        words / 16, e.g. the root) copy a precomputed row; the others set a
        bit per edge in rows zeroed a chunk at a time, their index entries
        prefetched (they are cold between two forward passes). States
        outside the index allow nothing. The cost per row is about writing
        the row (V / 8 bytes).
        """
        writer = self._bitmask_writer
        if writer is None:
            words = (self.vocab_size + 31) // 32
            writer = self._bitmask_writer = kernels.BitmaskWriter(
                self._arrays["indptr"],
                self._arrays["tokens"],
                self.vocab_size,
                max(64, words // 16),
            )
        if out is not None:
            try:  # the fast path of a decode loop: int32 states, a reused buffer
                writer(states, out)
                return out
            except TypeError:
                pass
        states = self._states(states)
        states = np.ascontiguousarray(np.where(np.abs(states) < 2**31, states, -1), np.int32)
        if out is None:
            out = np.empty((states.size, writer.words), np.int32)
        writer(states, out)
        return out

    def next_states(self, states, tokens) -> np.ndarray:
        """int32 `[n]`: the state after each token, -1 where it is not allowed.

        One search in the (cached) sorted edge keys: the logits processor's
        per-step path."""
        states, tokens = self._states_and_tokens(states, tokens)
        keys = self._keys()
        ok = (states >= 0) & (states < self.num_states) & (tokens >= 0)
        ok &= tokens < self.vocab_size
        query = np.where(ok, states * self.vocab_size + tokens, -1)
        at = np.minimum(np.searchsorted(keys, query), keys.size - 1)
        found = ok & (keys[at] == query)
        return np.where(found, self._arrays["next_states"][at].astype(np.int32), -1)

    def _keys(self) -> np.ndarray:
        if self._edge_keys is None:
            counts = np.diff(self._arrays["indptr"]).astype(np.int64)
            source = np.repeat(np.arange(self.num_states, dtype=np.int64), counts)
            self._edge_keys = source * self.vocab_size + self._arrays["tokens"]
        return self._edge_keys

    def member_ranges(self, states) -> tuple[np.ndarray, np.ndarray]:
        """`(lo, hi)` int64 `[n]`: the members reachable from each state lie in
        `lo .. hi - 1` (members are numbered in sorted order of the distinct
        strings, the preorder of their byte trie); `lo == hi` for invalid states.

        The range is exactly the reachable members wherever
        `member_ranges_exact` is True (always, when the vocabulary has a
        token for every byte the members use); otherwise it is the smallest
        range that covers them. Per-state arrays, computed on first use
        (`static_keras.index.member_ranges.automaton_member_bounds`).
        """
        lo, hi, _ = self._member_bounds()
        states = self._states(states)
        inside = (states >= 0) & (states < self.num_states)
        safe = np.where(inside, states, 0)
        return np.where(inside, lo[safe], 0), np.where(inside, hi[safe], 0)

    @property
    def member_ranges_exact(self) -> bool:
        """Whether `member_ranges` is exact for every state (see there)."""
        return bool(self._member_bounds()[2].all())

    def _member_bounds(self):
        bounds = getattr(self, "_member_bound_arrays", None)
        if bounds is None:
            bounds = member_ranges.automaton_member_bounds(
                self._arrays["indptr"], self._arrays["next_states"], self._layout.accept_offset
            )
            self._member_bound_arrays = bounds
        return bounds

    def walk(self, sequences) -> np.ndarray:
        """int32 `[n]`: the state after each token sequence (-1 if it leaves the
        set). Sequences may be ragged; negative tokens (padding) are skipped."""
        rows = _pad(sequences)
        state = np.zeros(rows.shape[0], np.int32)
        for column in range(rows.shape[1]):
            token = rows[:, column]
            moved = self.next_states(state, np.maximum(token, 0))
            state = np.where(token < 0, state, moved)
        return state


def _pad(sequences) -> np.ndarray:
    if isinstance(sequences, np.ndarray) and sequences.ndim == 2:
        return sequences.astype(np.int64, copy=False)
    rows = [list(np.asarray(s).reshape(-1)) for s in sequences]
    width = max((len(r) for r in rows), default=0)
    out = np.full((len(rows), width), -1, np.int64)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out
