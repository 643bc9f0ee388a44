"""`StringIndexLayout`: the static shape of a string index (Python integers).

A `StringIndex` is four flat arrays (CSR rows of the automaton) plus this
layout, which holds what a decoder needs to trace fixed-shape steps: array
sizes, the EOS token, and the per-step widths `B_t`. It fits in a Keras layer
config.

States: trie states (byte-trie nodes the decoder can be in) are numbered
`0 .. accept_offset - 1`, root 0, in preorder of the byte trie (a token
always moves to a larger id); then one accept
state per distinct member string (`accept_offset + m`), reached by EOS from
the member's trie state. An accept state allows only EOS, back to itself.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from static_keras.index.layout import token_dtype


def state_dtype(num_states: int) -> np.dtype:
    """The narrowest dtype that holds every state id (the rule of token ids)."""
    return token_dtype(num_states)


@dataclasses.dataclass(frozen=True)
class StringIndexLayout:
    """Sizes of a string index (see the module docstring).

    Attributes:
        vocab_size: token ids, V.
        length: the most decoding steps, EOS included (`max_length`).
        eos_token_id: the end-of-sequence token.
        num_states: trie states plus accept states.
        num_edges: (state, token) transitions, EOS included.
        num_members: distinct member strings (= accept states).
        step_widths: `length` ints, B_t: the largest number of allowed
            tokens (EOS included) of any state reachable after exactly t
            tokens.
        max_width: the largest number of allowed tokens of any state.
    """

    vocab_size: int
    length: int
    eos_token_id: int
    num_states: int
    num_edges: int
    num_members: int
    step_widths: tuple[int, ...]
    max_width: int

    #: Member (accept) states map to item ids: the caller's string positions.
    has_item_ids = True
    #: No bit-packed dense head: every step reads the CSR rows.
    dense_levels = 0

    @classmethod
    def create(cls, **fields) -> "StringIndexLayout":
        fields = dict(fields)
        fields["step_widths"] = tuple(int(x) for x in fields["step_widths"])
        for name in (
            "vocab_size",
            "length",
            "eos_token_id",
            "num_states",
            "num_edges",
            "num_members",
            "max_width",
        ):
            fields[name] = int(fields[name])
        layout = cls(**fields)
        layout.check()
        return layout

    def check(self) -> None:
        """Raises ValueError when the fields contradict each other."""
        problems = []
        if self.vocab_size < 1 or self.length < 1:
            problems.append("vocab_size and length must be positive")
        if not 0 <= self.eos_token_id < self.vocab_size:
            problems.append("eos_token_id must lie in [0, vocab_size)")
        if not 1 <= self.num_members < self.num_states:
            problems.append("num_members must lie in [1, num_states)")
        if self.num_edges < self.num_members * 2:
            problems.append("num_edges must count an EOS edge and a loop per member")
        if len(self.step_widths) != self.length:
            problems.append("step_widths must have one entry per step")
        elif any(not 1 <= w <= self.max_width for w in self.step_widths):
            problems.append("step_widths must lie in [1, max_width]")
        if not 1 <= self.max_width <= self.vocab_size:
            problems.append("max_width must lie in [1, vocab_size]")
        if self.num_states > np.iinfo(np.int32).max:
            problems.append("num_states must fit int32")
        if problems:
            raise ValueError("Inconsistent string index layout: " + "; ".join(problems))

    #: The array that maps member states to item ids.
    member_ids_array = "member_item_ids"

    @property
    def first_member_state(self) -> int:
        """Member (finished) states are `[first_member_state, state_space)`."""
        return self.accept_offset

    def to_config(self) -> dict:
        return {
            "vocab_size": self.vocab_size,
            "length": self.length,
            "eos_token_id": self.eos_token_id,
            "num_states": self.num_states,
            "num_edges": self.num_edges,
            "num_members": self.num_members,
            "step_widths": list(self.step_widths),
            "max_width": self.max_width,
        }

    @classmethod
    def from_config(cls, config: dict) -> "StringIndexLayout":
        return cls.create(**config)

    @property
    def state_space(self) -> int:
        """Decoding states (every state of the automaton)."""
        return self.num_states

    @property
    def accept_offset(self) -> int:
        """State id of the first accept state."""
        return self.num_states - self.num_members

    @property
    def indptr_dtype(self) -> np.dtype:
        return np.dtype(np.int32 if self.num_edges <= np.iinfo(np.int32).max else np.int64)

    def array_shapes(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Shape and dtype of every array that goes to the device."""
        return {
            "indptr": ((self.num_states + 1,), self.indptr_dtype),
            "tokens": ((self.num_edges,), token_dtype(self.vocab_size)),
            "next_states": ((self.num_edges,), state_dtype(self.num_states)),
            "member_item_ids": ((self.num_members,), np.dtype(np.int32)),
        }
