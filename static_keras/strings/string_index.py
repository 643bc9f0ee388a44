"""`StringIndex`: K strings under a tokenizer, as a trie automaton in CSR form."""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from static_keras.index import npz_archive
from static_keras.strings import kernels
from static_keras.strings import serialization
from static_keras.strings.builder import BuildStats
from static_keras.strings.builder import build_string_arrays
from static_keras.strings.layout import StringIndexLayout
from static_keras.strings.vocabulary import TokenVocabulary


class StringIndex:
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

    Use it with `beam_search`, `ConstrainedBeamSearch` (through
    `constraint_layer()`, a `StringConstrainedDecoding` layer), the
    stateless `StringLogitsProcessor`, or the host-side queries below.

    Example:

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

    def __init__(
        self,
        layout: StringIndexLayout,
        arrays: dict[str, np.ndarray],
        *,
        vocab_checksum: str | None = None,
        stats: BuildStats | None = None,
    ):
        offsets = arrays.get("string_offsets")
        data = arrays.get("string_data")
        if offsets is None or data is None:
            raise ValueError("A StringIndex needs `string_offsets` and `string_data` arrays")
        expected = serialization.expected_shapes(layout, offsets.size - 1, data.size)
        npz_archive.check_arrays("StringIndex", arrays, expected)
        self._layout = layout
        self._arrays = dict(arrays)
        self.vocab_checksum = vocab_checksum
        self.stats = stats
        self._edge_keys = None
        self._bitmask_writer = None

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
        if isinstance(vocabulary, (str, os.PathLike)):
            vocabulary = TokenVocabulary.load(vocabulary)
        elif isinstance(vocabulary, (list, tuple)):
            vocabulary = TokenVocabulary.from_token_bytes(vocabulary)
        elif not isinstance(vocabulary, TokenVocabulary):
            raise ValueError(
                "`vocabulary` must be a TokenVocabulary, a list of token bytes or the path "
                f"of a .gguf, .tiktoken or tokenizer.json file. Received: {vocabulary!r:.80}"
            )
        if eos_token_id is None:
            eos_token_id = vocabulary.eos_token_id
            if eos_token_id is None:
                raise ValueError(
                    f"`eos_token_id` is required: the vocabulary"
                    f"{f' {vocabulary.name!r}' if vocabulary.name else ''} does "
                    "not name an end-of-sequence token. Pass `eos_token_id=` here, or give "
                    "the vocabulary one (a .tiktoken file holds no special tokens: "
                    "`TokenVocabulary.load(path, special_tokens={'<|endoftext|>': 50256})` "
                    "for GPT-2's)"
                )
        layout, arrays, host, stats = build_string_arrays(
            strings, vocabulary, eos_token_id=eos_token_id, max_length=max_length
        )
        arrays.update(host)
        return cls(layout, arrays, vocab_checksum=vocabulary.checksum, stats=stats)

    # Persistence ------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> None:
        """Writes the index to one `.npz` file (atomically: write, rename)."""
        serialization.save(path, self._layout, self._arrays, vocab_checksum=self.vocab_checksum)

    @classmethod
    def load(cls, path: str | os.PathLike, *, vocabulary=None) -> "StringIndex":
        """Reads an index written by `save`; verifies format and checksum.

        Args:
            path: the file.
            vocabulary: optional `TokenVocabulary`; when given, it must be the
                one the index was compiled against (same checksum).
        """
        layout, arrays, document = serialization.load(path)
        stored = document.get("vocab_checksum")
        if vocabulary is not None and stored is not None and vocabulary.checksum != stored:
            raise ValueError(
                f"{os.fspath(path)!r} was compiled against another vocabulary "
                "(its checksum differs from the one given)"
            )
        return cls(layout, arrays, vocab_checksum=stored)

    # Properties --------------------------------------------------------------

    @property
    def layout(self) -> StringIndexLayout:
        return self._layout

    @property
    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays that go to the device, by name (read-only views)."""
        views = {}
        for name in self._layout.array_shapes():
            view = self._arrays[name].view()
            view.flags.writeable = False
            views[name] = view
        return views

    @property
    def vocab_size(self) -> int:
        return self._layout.vocab_size

    @property
    def length(self) -> int:
        """The most decoding steps, EOS included."""
        return self._layout.length

    @property
    def eos_token_id(self) -> int:
        return self._layout.eos_token_id

    @property
    def num_states(self) -> int:
        return self._layout.num_states

    @property
    def num_members(self) -> int:
        """Distinct member strings."""
        return self._layout.num_members

    @property
    def num_strings(self) -> int:
        """Strings given, duplicates included (item ids lie in [0, num_strings))."""
        return int(self._arrays["string_offsets"].size - 1)

    @property
    def step_widths(self) -> tuple[int, ...]:
        """B_t per step: the most allowed tokens of a state reachable at step t."""
        return self._layout.step_widths

    @property
    def has_item_ids(self) -> bool:
        return True

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays that go to the device."""
        return sum(self._arrays[name].nbytes for name in self._layout.array_shapes())

    @property
    def checksum(self) -> str:
        """SHA-256 of the layout and device arrays (what a layer holds)."""
        device = {name: self._arrays[name] for name in self._layout.array_shapes()}
        return serialization.checksum(self._layout, device)

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

    def constraint_layer(self, name: str | None = None):
        """A `StringConstrainedDecoding` Keras layer holding this index."""
        from static_keras.strings.string_constrained_decoding import StringConstrainedDecoding

        return StringConstrainedDecoding(self, name=name)

    def __repr__(self) -> str:
        return (
            f"StringIndex(num_members={self.num_members}, vocab_size={self.vocab_size}, "
            f"length={self.length}, eos_token_id={self.eos_token_id}, "
            f"num_states={self.num_states}, max_width={self._layout.max_width}, "
            f"nbytes={self.nbytes})"
        )

    # Host-side queries (NumPy, vectorised, stateless) -------------------------

    def _states(self, states) -> np.ndarray:
        array = np.asarray(states)
        if array.size and (array.dtype == bool or not np.issubdtype(array.dtype, np.integer)):
            raise ValueError(f"`states` must hold integers. Received dtype {array.dtype}")
        return array.astype(np.int64, copy=False).reshape(-1)

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

    def allowed_tokens(self, states) -> np.ndarray:
        """bool `[n, V]`: the allowed next tokens of each state (-1: none)."""
        states = self._states(states)
        row, tokens, _ = self.edges(states)
        out = np.zeros((states.size, self.vocab_size), bool)
        out[row, tokens] = True
        return out

    def fill_bitmask(self, states, out: np.ndarray | None = None) -> np.ndarray:
        """int32 `[n, ceil(V / 32)]`: allowed tokens as bits (token t: word
        t // 32, bit t % 32), the layout XGrammar and vLLM use. `out`, when
        given, is overwritten (its first n rows).

        One compiled pass over the rows (`kernels.BitmaskWriter`, built on
        first use): wide states (more allowed tokens than a bitmask row has
        words / 16, e.g. the root) copy a precomputed row; the others zero
        their row and set a bit per edge. States outside the index allow
        nothing. The cost per row is about writing the row (V / 8 bytes).
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
        """int32 `[n]`: the state after each token, -1 where it is not allowed."""
        states = self._states(states)
        tokens = np.asarray(tokens).astype(np.int64, copy=False).reshape(-1)
        if states.shape != tokens.shape:
            raise ValueError(
                f"`states` and `tokens` must have the same shape: {states.shape} vs {tokens.shape}"
            )
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

    def is_finished(self, states) -> np.ndarray:
        """bool: whether each state is an accept state (EOS was emitted)."""
        states = self._states(states)
        return (states >= self._layout.accept_offset) & (states < self.num_states)

    def item_ids(self, states) -> np.ndarray:
        """int32: the item id of each accept state, -1 for every other state."""
        states = self._states(states)
        finished = self.is_finished(states)
        local = np.where(finished, states - self._layout.accept_offset, 0)
        return np.where(finished, self._arrays["member_item_ids"][local], -1)

    def lookup_item_ids(self, sequences) -> np.ndarray:
        """int32 `[n]`: the item id spelled by each EOS-terminated token
        sequence (padding skipped), -1 for sequences outside the set."""
        return self.item_ids(self.walk(sequences))


def _pad(sequences) -> np.ndarray:
    if isinstance(sequences, np.ndarray) and sequences.ndim == 2:
        return sequences.astype(np.int64, copy=False)
    rows = [list(np.asarray(s).reshape(-1)) for s in sequences]
    width = max((len(r) for r in rows), default=0)
    out = np.full((len(rows), width), -1, np.int64)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out
