"""The static shape of a STATIC index: Python integers, fixed at build time.

A `StaticIndex` is a handful of flat arrays plus this layout. The layout holds
everything a decoder needs to trace a fixed-shape graph (array sizes, per-level
offsets, per-step widths `B_t`) and nothing that grows with the data beyond
`O(length)` integers, so it fits in a Keras layer config.

Numbering. The first `dense_levels` (d) steps are served by bit masks indexed
by the prefix read as a base-V number (its "code"). After d tokens the state
map turns the code into a *tail state*. Tail states are numbered level by
level from depth d: depth-d states are `0 .. n_d - 1`, then depth d+1, and so
on to the leaves (depth L). Tail edges (tokens) are numbered the same way, and
the child reached by edge `k` is tail state `n_d + k`.

Decoding states (what a beam carries) number both parts in one space, so a
state alone says where it is: a prefix of length t < d is state
`dense_mask_offsets[t] + code`, which is also its mask row; tail state s is
state `dense_head_states + s`. The root is state 0 either way.
"""

from __future__ import annotations

import dataclasses

import numpy as np


def dense_mask_words(vocab_size: int) -> int:
    """int32 words per bit-packed mask row (1 bit per token)."""
    return (vocab_size + 31) // 32


def token_dtype(vocab_size: int) -> np.dtype:
    """The narrowest unsigned dtype that holds every token id."""
    if vocab_size <= 2**8:
        return np.dtype(np.uint8)
    if vocab_size <= 2**16:
        return np.dtype(np.uint16)
    return np.dtype(np.int32)


@dataclasses.dataclass(frozen=True)
class IndexLayout:
    """Sizes and offsets of a STATIC index (see the module docstring).

    Attributes:
        vocab_size: number of token ids, V.
        length: tokens per sequence, L.
        dense_levels: steps served by the dense head, d.
        level_sizes: `L + 1` ints, distinct prefixes of each length (the
            root is the only prefix of length 0; `level_sizes[L]` is the
            number of distinct sequences).
        step_widths: `L` ints, B_t, the largest fan-out of a state at depth t.
        has_item_ids: whether leaves map to catalogue item ids.
        used_level_sizes: None, or `L + 1` ints: the prefixes of each length
            the index holds when it was laid out with headroom
            (`static_keras.index.headroom`). Then `level_sizes` and
            `step_widths` are capacities: the arrays are that large, the
            slots past the used ones are unreachable padding, and a new
            catalogue within them is new array values for the same graph.
    """

    vocab_size: int
    length: int
    dense_levels: int
    level_sizes: tuple[int, ...]
    step_widths: tuple[int, ...]
    has_item_ids: bool
    used_level_sizes: tuple[int, ...] | None = None

    #: Fixed-length sequences: no end-of-sequence token.
    eos_token_id = None

    @classmethod
    def create(cls, **fields) -> "IndexLayout":
        fields["level_sizes"] = tuple(int(x) for x in fields["level_sizes"])
        fields["step_widths"] = tuple(int(x) for x in fields["step_widths"])
        for name in ("vocab_size", "length", "dense_levels"):
            fields[name] = int(fields[name])
        fields["has_item_ids"] = bool(fields["has_item_ids"])
        if fields.get("used_level_sizes") is not None:
            fields["used_level_sizes"] = tuple(int(x) for x in fields["used_level_sizes"])
        layout = cls(**fields)
        layout.check()
        return layout

    def check(self) -> None:
        """Raises ValueError when the fields contradict each other."""
        problems = []
        if self.vocab_size < 1 or self.length < 1:
            problems.append("vocab_size and length must be positive")
        if not 0 <= self.dense_levels <= self.length:
            problems.append("dense_levels must lie in [0, length]")
        if len(self.level_sizes) != self.length + 1 or self.level_sizes[:1] != (1,):
            problems.append("level_sizes must have length + 1 entries, starting at 1")
        if len(self.step_widths) != self.length:
            problems.append("step_widths must have one entry per step")
        elif any(not 1 <= w <= self.vocab_size for w in self.step_widths):
            problems.append("step_widths must lie in [1, vocab_size]")
        used = self.used_level_sizes
        if used is not None and (
            len(used) != len(self.level_sizes)
            or any(not 0 <= u <= c for u, c in zip(used, self.level_sizes))
            or used[:1] != (1,)
        ):
            problems.append("used_level_sizes must have length + 1 entries within level_sizes")
        if problems:
            raise ValueError("Inconsistent index layout: " + "; ".join(problems))

    #: The array that maps member states to item ids.
    member_ids_array = "leaf_item_ids"

    @property
    def first_member_state(self) -> int:
        """Member (finished) states are `[first_member_state, state_space)`."""
        return self.first_leaf_state

    def to_config(self) -> dict:
        return {
            "vocab_size": self.vocab_size,
            "length": self.length,
            "dense_levels": self.dense_levels,
            "level_sizes": list(self.level_sizes),
            "step_widths": list(self.step_widths),
            "has_item_ids": self.has_item_ids,
            **(
                {}
                if self.used_level_sizes is None
                else {"used_level_sizes": list(self.used_level_sizes)}
            ),  # fmt: skip
        }

    @classmethod
    def from_config(cls, config: dict) -> "IndexLayout":
        return cls.create(**config)

    # Derived sizes and offsets -------------------------------------------

    @property
    def num_sequences(self) -> int:
        """Distinct sequences held (the used leaves)."""
        return self.filled_level_sizes[-1]

    @property
    def num_members(self) -> int:
        """Member slots: the leaves the arrays hold, used or not (what
        eligibility bits and item-id tables are sized by)."""
        return self.level_sizes[-1]

    @property
    def filled_level_sizes(self) -> tuple[int, ...]:
        """Prefixes of each length the index holds (`level_sizes` without headroom)."""
        return self.level_sizes if self.used_level_sizes is None else self.used_level_sizes

    @property
    def has_headroom(self) -> bool:
        return self.used_level_sizes is not None

    def graph_shape(self) -> "IndexLayout":
        """The layout without its used sizes: what a decoding graph is traced
        from. Two indexes with equal graph shapes fit the same graph."""
        return dataclasses.replace(self, used_level_sizes=None)

    @property
    def num_states(self) -> int:
        """Trie nodes, root and leaves included."""
        return sum(self.level_sizes)

    @property
    def dense_head_states(self) -> int:
        """Decoding states of the dense head: every code of length t < d."""
        return sum(self.vocab_size**t for t in range(self.dense_levels))

    @property
    def state_space(self) -> int:
        """Decoding states: the dense head's codes, then the tail states."""
        return self.dense_head_states + sum(self.level_sizes[self.dense_levels :])

    @property
    def depth_starts(self) -> tuple[int, ...]:
        """`L + 1` ints: the first decoding state of each depth (increasing)."""
        dense = [self.dense_mask_offsets[t] for t in range(self.dense_levels)]
        tail = [self.dense_head_states + o for o in self.tail_state_offsets.values()]
        return tuple(dense + tail)

    @property
    def first_leaf_state(self) -> int:
        """Decoding state of the first leaf (depth L)."""
        return self.dense_head_states + self.leaf_offset

    @property
    def mask_words(self) -> int:
        return dense_mask_words(self.vocab_size)

    @property
    def dense_mask_offsets(self) -> tuple[int, ...]:
        """First mask row of each dense step t < d (step t has V**t rows)."""
        return tuple(sum(self.vocab_size**u for u in range(t)) for t in range(self.dense_levels))

    @property
    def dense_mask_rows(self) -> int:
        return max(1, sum(self.vocab_size**t for t in range(self.dense_levels)))

    @property
    def dense_state_size(self) -> int:
        return self.vocab_size**self.dense_levels if self.dense_levels else 1

    @property
    def tail_state_offsets(self) -> dict[int, int]:
        """First tail state of each depth t in [d, L]."""
        offsets, total = {}, 0
        for t in range(self.dense_levels, self.length + 1):
            offsets[t] = total
            total += self.level_sizes[t]
        return offsets

    @property
    def edge_offsets(self) -> dict[int, int]:
        """First tail edge leaving depth t, for t in [d, L)."""
        offsets, total = {}, 0
        for t in range(self.dense_levels, self.length):
            offsets[t] = total
            total += self.level_sizes[t + 1]
        return offsets

    @property
    def num_tail_edges(self) -> int:
        return sum(self.level_sizes[self.dense_levels + 1 :])

    @property
    def indptr_offsets(self) -> dict[int, int]:
        """First row pointer of each branching tail level (B_t > 1).

        A level whose states all have one child needs no row pointers: the
        child edge of its i-th state is the level's i-th edge.
        """
        offsets, total = {}, 0
        for t in range(self.dense_levels, self.length):
            if self.step_widths[t] > 1:
                offsets[t] = total
                total += self.level_sizes[t] + 1
        return offsets

    @property
    def num_indptr(self) -> int:
        return sum(
            self.level_sizes[t] + 1
            for t in range(self.dense_levels, self.length)
            if self.step_widths[t] > 1
        )

    @property
    def indptr_dtype(self) -> np.dtype:
        small = self.num_tail_edges <= np.iinfo(np.int32).max
        return np.dtype(np.int32 if small else np.int64)

    @property
    def leaf_offset(self) -> int:
        """Tail state of the first leaf (depth L)."""
        return self.tail_state_offsets[self.length]

    def array_shapes(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Shape and dtype of every array the index holds (min size 1)."""
        shapes = {
            "dense_masks": ((self.dense_mask_rows, self.mask_words), np.dtype(np.int32)),
            "dense_states": ((self.dense_state_size,), np.dtype(np.int32)),
            "tokens": ((max(1, self.num_tail_edges),), token_dtype(self.vocab_size)),
            "indptr": ((max(1, self.num_indptr),), self.indptr_dtype),
        }
        if self.has_item_ids:
            shapes["leaf_item_ids"] = ((self.num_members,), np.dtype(np.int64))
        return shapes
