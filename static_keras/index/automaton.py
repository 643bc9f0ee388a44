"""`TokenAutomaton`: the host-side contract every compiled valid set follows.

A valid set of token sequences, compiled for decoding, is a deterministic
automaton over token ids:

- states, numbered so that the root is 0 and a token always leads to a
  larger state; every state is one row of the automaton;
- per state, its allowed tokens sorted by id (CSR: `indptr`, `tokens`), and
  for each the next state, implicit (a tree numbered level by level: edge k
  leads to state `offset + k`) or explicit (`next_states`, when two token
  paths reach one state);
- optionally a bit-packed dense head for the first steps (masks indexed by
  the state itself);
- optionally an EOS token and accept states (variable-length sets);
- member ids: each complete member maps to the caller's item id;
- per-step widths `B_t`: the most allowed tokens of a state reachable after
  exactly t tokens, Python ints fixed at build time.

Two kinds implement it: `StaticIndex` (STATIC's semantic-ID trie) and
`StringIndex` (K strings under a tokenizer). Their builders are different
algorithms; the queries, persistence and the device contract are one. The
Keras side mirrors it with `static_keras.layers.AutomatonConstraint`.

This module is NumPy only (no Keras, no TensorFlow).
"""

from __future__ import annotations

import os

import numpy as np

from static_keras.index import archive
from static_keras.index import npz_archive


class TokenAutomaton:
    """Base of the host-side compiled valid sets (see the module docstring).

    Subclasses set `kind` (the archive kind), `layout_class`, and implement
    `walk` and `edges`; everything else (persistence, `allowed_tokens`,
    `next_states`, `contains`, `is_finished`, `item_ids`,
    `lookup_item_ids`, sizes, checksum) is shared. Member (finished) states
    are the last ones: `[layout.first_member_state, layout.state_space)`.
    """

    kind: str = ""
    layout_class: type = type(None)

    def __init__(self, layout, arrays: dict[str, np.ndarray]):
        npz_archive.check_arrays(type(self).__name__, arrays, self.expected_shapes(layout, arrays))
        self._layout = layout
        self._arrays = dict(arrays)

    # What subclasses define --------------------------------------------------

    @classmethod
    def expected_shapes(cls, layout, arrays: dict[str, np.ndarray]) -> dict:
        """{name: (shape, dtype)} of every array an archive of `layout` holds."""
        return dict(layout.array_shapes())

    def archive_extra(self) -> dict:
        """Extra metadata written beside the layout (JSON values)."""
        return {}

    @classmethod
    def from_archive(cls, path, layout, arrays, document, **options) -> "TokenAutomaton":
        if options:
            raise ValueError(f"Unknown options for {cls.__name__}.load: {sorted(options)}")
        return cls(layout, arrays)

    def walk(self, sequences) -> np.ndarray:
        """int64 `[n]`: the state after each token sequence, -1 outside the set."""
        raise NotImplementedError

    def edges(self, states) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """All allowed `(row, token, next_state)` of `states`, sorted by row
        then token; states outside the automaton allow nothing."""
        raise NotImplementedError

    def member_ranges(self, states) -> tuple[np.ndarray, np.ndarray]:
        """`(lo, hi)` int64 `[n]`: the members reachable from each state are
        members `lo .. hi - 1` (member m is state `first_member_state + m`);
        `lo == hi` for states outside the automaton or with no member below.

        What eligibility sets count over (`static_keras.index.eligibility`):
        "is anything eligible below this state" is then a rank difference.
        """
        raise NotImplementedError

    def is_finished(self, states) -> np.ndarray:
        """bool `[n]`: whether each state completes a member."""
        states = self._states(states)
        return (states >= self._layout.first_member_state) & (states < self._layout.state_space)

    def item_ids(self, states) -> np.ndarray:
        """`[n]`: the item id of each finished state, -1 for the others."""
        if not self.has_item_ids:
            raise ValueError(f"This {type(self).__name__} was built without `item_ids`")
        states = self._states(states)
        finished = self.is_finished(states)
        member = np.where(finished, states - self._layout.first_member_state, 0)
        return np.where(finished, self._arrays[self._layout.member_ids_array][member], -1)

    # Persistence ------------------------------------------------------------

    def archive_arrays(self) -> dict[str, np.ndarray]:
        """Every array a file holds (device arrays plus host-only ones)."""
        return dict(self._arrays)

    def save(self, path: str | os.PathLike) -> None:
        """Writes the automaton to one `.npz` file (atomically: write, rename)."""
        archive.save(path, self)

    @classmethod
    def load(cls, path: str | os.PathLike, **options) -> "TokenAutomaton":
        """Reads a file written by `save` (or by static-keras 0.1.0); verifies
        the format, every array and the checksum. Called on a subclass, the
        file must hold that kind; `static_keras.index.archive.load` reads any."""
        kind, layout, arrays, document = archive.read(path)
        target = archive.automaton_class(kind)
        if cls is not TokenAutomaton and not issubclass(target, cls):
            raise ValueError(
                f"{os.fspath(path)!r} holds a {target.__name__} (kind {kind!r}), not a "
                f"{cls.__name__}: load it with {target.__name__}.load, or with "
                "static_keras.index.archive.load for any kind"
            )
        return target.from_archive(path, layout, arrays, document, **options)

    # Properties --------------------------------------------------------------

    @property
    def layout(self):
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

    def shared_arrays(self) -> dict[str, np.ndarray]:
        """The arrays of `arrays` as writeable views of the index's own
        memory, for a framework that takes them as its tensors' buffers
        without a copy (a layer's weights): DLPack cannot hand over
        read-only memory. Nothing may write into them (a TensorFlow
        assignment replaces a weight's buffer; tests/test_shared_weights.py)."""
        return {name: self._arrays[name].view() for name in self._layout.array_shapes()}

    @property
    def vocab_size(self) -> int:
        return self._layout.vocab_size

    @property
    def length(self) -> int:
        """Decoding steps: tokens per member (EOS included for strings)."""
        return self._layout.length

    @property
    def step_widths(self) -> tuple[int, ...]:
        """B_t per step: the most allowed tokens of a state reachable at step t."""
        return self._layout.step_widths

    @property
    def eos_token_id(self) -> int | None:
        """The token that ends a member, or None for fixed-length sets."""
        return self._layout.eos_token_id

    @property
    def has_item_ids(self) -> bool:
        return self._layout.has_item_ids

    @property
    def num_states(self) -> int:
        return self._layout.num_states

    @property
    def num_members(self) -> int:
        """Distinct members of the set."""
        return self._layout.num_members

    @property
    def dense_levels(self) -> int:
        """Steps served by the bit-packed dense head (0 when there is none)."""
        return self._layout.dense_levels

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays that go to the device."""
        return sum(array.nbytes for array in self.arrays.values())

    @property
    def checksum(self) -> str:
        """SHA-256 of the layout and device arrays (what a layer holds)."""
        return archive.checksum(self._layout, self.arrays)

    def metadata(self) -> dict:
        """Format, kind, layout, counts and checksums (what export records)."""
        return archive.metadata(self.kind, self._layout, self.arrays, **self.archive_extra())

    # Queries (host side, vectorised) ----------------------------------------

    def _states(self, states) -> np.ndarray:
        array = np.asarray(states)
        if array.size and (array.dtype == bool or not np.issubdtype(array.dtype, np.integer)):
            raise ValueError(f"`states` must hold integers. Received dtype {array.dtype}")
        return array.astype(np.int64, copy=False).reshape(-1)

    def allowed_tokens(self, states_or_prefixes) -> np.ndarray:
        """bool `[n, vocab_size]`: the allowed next tokens.

        Args:
            states_or_prefixes: int `[n]` states (as `walk` returns), or int
                `[n, t]` token prefixes, which are walked first. A state or
                prefix outside the set allows nothing.
        """
        array = np.asarray(states_or_prefixes)
        states = self.walk(array) if array.ndim == 2 else self._states(array)
        row, tokens, _ = self.edges(states)
        out = np.zeros((states.size, self.vocab_size), bool)
        out[row, tokens] = True
        return out

    def _states_and_tokens(self, states, tokens) -> tuple[np.ndarray, np.ndarray]:
        states = self._states(states)
        tokens = np.asarray(tokens).astype(np.int64, copy=False).reshape(-1)
        if states.shape != tokens.shape:
            raise ValueError(
                f"`states` and `tokens` must have the same shape: {states.shape} vs {tokens.shape}"
            )
        return states, tokens

    def next_states(self, states, tokens) -> np.ndarray:
        """int64 `[n]`: the state after each token, -1 where it is not allowed."""
        states, tokens = self._states_and_tokens(states, tokens)
        row, edge_tokens, targets = self.edges(states)
        if row.size == 0:
            return np.full(states.size, -1, np.int64)
        # Edges are sorted by (row, token): one search finds each row's token.
        stride = self.vocab_size + 1
        keys = row * stride + edge_tokens
        allowed = (tokens >= 0) & (tokens < self.vocab_size)
        query = np.arange(states.size) * stride + np.where(allowed, tokens, self.vocab_size)
        at = np.minimum(np.searchsorted(keys, query), keys.size - 1)
        return np.where(keys[at] == query, targets[at], -1).astype(np.int64)

    def contains(self, sequences) -> np.ndarray:
        """bool `[n]`: whether each token sequence spells a member."""
        return self.is_finished(self.walk(sequences))

    def lookup_item_ids(self, sequences) -> np.ndarray:
        """`[n]`: the item id of each token sequence, -1 where it is not a member."""
        if not self.has_item_ids:
            raise ValueError(f"This {type(self).__name__} was built without `item_ids`")
        return self.item_ids(self.walk(sequences))
