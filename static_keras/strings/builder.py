"""Compiles K strings under a token vocabulary into a trie automaton.

Steps (the loops in `kernels`, a Cython extension compiled at install;
everything else NumPy):

1. Encode the strings as UTF-8, sort the distinct ones once (NumPy) and
   build their byte trie in preorder (`kernels.preorder_trie`).
2. Join it with the vocabulary's token trie (`TokenVocabulary.trie`, built
   once per vocabulary): from every trie node, walk the token trie down the
   node's subtree; wherever a token ends, that token is allowed at the start
   node and leads to the node where its bytes end. Every tokenization is
   covered, and two token paths that reach one node share it (explicit next
   states). Member nodes also allow EOS, to one accept state per distinct
   member, which loops on EOS (`kernels.join`).
3. Drop dead ends (states from which no member can be completed: a
   vocabulary without some single-byte token can strand a path) in one
   reverse pass, and find the step counts at which decoding can be at each
   state in two forward passes (`kernels.live_states`: an exact range and a
   64-step window per state, 16 bytes whatever the longest member): preorder
   ids are a topological order, since a token always moves deeper.
4. Renumber the live states and write the CSR rows; B_t is the largest
   fan-out among states reachable at step t (`kernels.renumber`).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Sequence

import numpy as np

from static_keras.strings import kernels
from static_keras.strings.byte_trie import sort_unique
from static_keras.strings.layout import StringIndexLayout
from static_keras.strings.vocabulary import TokenVocabulary

_SHOW = 5  # offending strings named in an error message


@dataclasses.dataclass(frozen=True)
class BuildStats:
    """What a build did, for benchmarks and `StringIndex.stats`."""

    num_strings: int
    num_members: int
    trie_nodes: int
    trie_states: int
    join_edges: int
    seconds: dict


def encode_strings(strings) -> list[bytes]:
    """UTF-8 bytes of each string; ValueError on bad input."""
    if isinstance(strings, (str, bytes, bytearray)):
        raise ValueError(
            "`strings` must be a sequence of strings, not a single string. "
            f"Received: {strings!r:.60}"
        )
    try:
        items = list(strings)
    except TypeError:
        raise ValueError(
            f"`strings` must be a sequence of strings. Received: {type(strings).__name__}"
        ) from None
    if not items:
        raise ValueError("`strings` is empty: a string constraint needs at least one string")
    encoded = []
    for position, item in enumerate(items):
        if isinstance(item, str):
            try:
                data = item.encode("utf-8")
            except UnicodeEncodeError as error:
                raise ValueError(
                    f"`strings[{position}]` is not valid Unicode ({error.reason}): {item!r:.60}"
                ) from None
        elif isinstance(item, (bytes, bytearray)):
            data = bytes(item)
        else:
            raise ValueError(
                f"`strings[{position}]` must be str or bytes. Received: {type(item).__name__}"
            )
        if not data:
            raise ValueError(
                f"`strings[{position}]` is the empty string: every member must be non-empty "
                "(the model would have to emit EOS first, which no decoder expects)"
            )
        encoded.append(data)
    return encoded


def build_string_arrays(
    strings: Sequence[str | bytes],
    vocabulary: TokenVocabulary,
    *,
    eos_token_id: int,
    max_length: int | None = None,
):
    """Builds the arrays of a `StringIndex` (see `StringIndex.from_strings`).

    Returns:
        `(layout, arrays, host_arrays, stats)`.
    """
    clock = {"start": time.perf_counter()}
    eos = _checked_arguments(vocabulary, eos_token_id, max_length)
    vocab_size = vocabulary.vocab_size
    encoded = encode_strings(strings)

    # 1. The byte trie of the distinct strings, in preorder.
    first, byte, subtree_end, member_node = _byte_trie(encoded)
    num_members, num_nodes = len(first), int(byte.size)
    member_of = np.full(num_nodes, -1, np.int32)
    member_of[member_node] = np.arange(num_members, dtype=np.int32)
    clock["string_trie"] = time.perf_counter()

    # 2. Join with the vocabulary's token trie (built once per vocabulary).
    tokens = vocabulary.trie
    clock["vocabulary_trie"] = time.perf_counter()
    indptr, tok, dst = kernels.join(
        byte, subtree_end, member_of, tokens.dense_children, tokens.node_info, tokens.trie.byte,
        tokens.token_ids, eos,
    )  # fmt: skip
    join_edges = int(tok.size) - num_members
    clock["join"] = time.perf_counter()

    # 3. Dead ends, and the step counts (range and window) of each state.
    alive, lo, hi, window = kernels.live_states(indptr, dst)
    reached = hi >= 0
    _require_spellable(reached[member_node], encoded, first, vocabulary, eos)
    clock["prune"] = time.perf_counter()
    max_length = _settled_length(lo[member_node], hi[member_node], max_length, encoded, first)

    # 4. Renumber: live trie states in preorder, then one accept state per member.
    live = reached & alive
    num_trie_states = int(live.sum())
    indptr, tok, next_state, step_widths = _renumbered(
        indptr, tok, dst, live, lo, hi, window, eos, num_members, max_length
    )
    num_states = num_trie_states + num_members
    counts = np.diff(indptr)
    clock["widths"] = time.perf_counter()

    layout = StringIndexLayout.create(
        vocab_size=vocab_size,
        length=max_length,
        eos_token_id=eos,
        num_states=num_states,
        num_edges=int(tok.size),
        num_members=num_members,
        step_widths=step_widths,
        max_width=int(counts.max()),
    )
    shapes = layout.array_shapes()
    arrays = {
        "indptr": indptr.astype(shapes["indptr"][1]),
        "tokens": tok.astype(shapes["tokens"][1]),
        "next_states": next_state.astype(shapes["next_states"][1]),
        "member_item_ids": first.astype(np.int32),
    }
    stats = BuildStats(
        num_strings=len(encoded),
        num_members=num_members,
        trie_nodes=num_nodes,
        trie_states=num_trie_states,
        join_edges=join_edges,
        seconds=_phase_seconds(clock),
    )
    return layout, arrays, _host_arrays(encoded), stats


def _renumbered(indptr, tok, dst, live, lo, hi, window, eos, num_members, max_length):
    """`(indptr, tokens, next_states, step_widths)` over the live trie states
    in preorder, then one accept state per member; a step's width is at
    least 1 (accept states loop on EOS) and there are `max_length` of them."""
    indptr, tok, next_state, widths = kernels.renumber(
        indptr, tok, dst, live, lo, hi, window, eos, num_members
    )
    widths = np.maximum(widths, 1)
    if widths.size < max_length:
        widths = np.concatenate([widths, np.ones(max_length - widths.size, widths.dtype)])
    return indptr, tok, next_state, widths[:max_length]


def _checked_arguments(vocabulary, eos_token_id, max_length) -> int:
    """The EOS token id, after a clear error for any bad argument."""
    if not isinstance(vocabulary, TokenVocabulary):
        raise ValueError(
            f"`vocabulary` must be a TokenVocabulary. Received: {type(vocabulary).__name__}"
        )
    vocab_size = vocabulary.vocab_size
    if isinstance(eos_token_id, bool) or not isinstance(eos_token_id, (int, np.integer)):
        raise ValueError(f"`eos_token_id` must be an int. Received: eos_token_id={eos_token_id!r}")
    eos = int(eos_token_id)
    if not 0 <= eos < vocab_size:
        raise ValueError(
            f"`eos_token_id`={eos} is outside the vocabulary of {vocab_size} tokens "
            f"(ids 0 .. {vocab_size - 1})"
        )
    if max_length is not None and (
        isinstance(max_length, bool) or not isinstance(max_length, (int, np.integer))
    ):
        raise ValueError(f"`max_length` must be an int or None. Received: {max_length!r}")
    if max_length is not None and max_length < 2:
        raise ValueError(f"`max_length` must be at least 2. Received: max_length={max_length}")
    return eos


def _byte_trie(encoded):
    """`(first, byte, subtree_end, member_node)`: each distinct string's first
    position in `encoded` (members in sorted order), and the preorder byte
    trie of the distinct strings (`kernels.preorder_trie`)."""
    unique, first, _ = sort_unique(encoded)
    lengths = np.fromiter(map(len, unique), np.int64, len(unique))
    offsets = np.zeros(len(unique) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.frombuffer(b"".join(unique), np.uint8)
    byte, _, subtree_end, member_node = kernels.preorder_trie(flat, offsets)
    return first, byte, subtree_end, member_node


def _names(encoded, first, bad) -> str:
    """The first few of the members `bad`, as the caller wrote them."""
    names = ", ".join(repr(encoded[first[m]].decode("utf-8", "replace")) for m in bad[:_SHOW])
    return names + (" ..." if bad.size > _SHOW else "")


def _require_spellable(reached, encoded, first, vocabulary, eos: int) -> None:
    """ValueError naming the members no token sequence spells (`reached`:
    bool per member, whether its accept node is reachable)."""
    if reached.all():
        return
    bad = np.flatnonzero(~reached)
    hint = ""
    if vocabulary.text_tokens[eos]:
        hint = (
            f"; note that `eos_token_id`={eos} is the text token "
            f"{vocabulary.token_bytes[eos]!r}, which is never allowed as text once it "
            "ends answers (pass the tokenizer's end-of-sequence token)"
        )
    raise ValueError(
        f"{bad.size} of the {len(first)} strings cannot be spelled by any token "
        f"sequence of this vocabulary (a byte without a token, or only special "
        f"tokens): {_names(encoded, first, bad)}{hint}"
    )


def _settled_length(first_step, last_step, max_length, encoded, first) -> int:
    """The steps of a decode: members finish at step k (k tokens, then EOS
    at step k); by default room for every member's longest tokenization,
    and a given `max_length` must fit every member's shortest."""
    first_step = first_step.astype(np.int64)  # shortest tokenization
    if max_length is None:
        return int(last_step.max()) + 1  # longest tokenization
    if int(first_step.max()) + 1 > max_length:
        bad = np.flatnonzero(first_step + 1 > max_length)
        raise ValueError(
            f"`max_length`={max_length} is too short for {bad.size} strings, whose "
            f"shortest tokenization plus EOS takes up to {int(first_step.max()) + 1} "
            f"steps: {_names(encoded, first, bad)}"
        )
    return int(max_length)


def _host_arrays(encoded) -> dict:
    """The strings as given (one byte array and offsets), kept on the host."""
    lengths = np.fromiter(map(len, encoded), np.int64, len(encoded))
    string_offsets = np.zeros(len(encoded) + 1, np.int64)
    np.cumsum(lengths, out=string_offsets[1:])
    return {
        "string_data": np.frombuffer(b"".join(encoded), np.uint8).copy(),
        "string_offsets": string_offsets,
    }


def _phase_seconds(clock) -> dict:
    """Seconds per build phase, from the clock readings after each, and in all."""
    previous, seconds = clock["start"], {}
    for name in ["string_trie", "vocabulary_trie", "join", "prune", "widths"]:
        seconds[name] = clock[name] - previous
        previous = clock[name]
    seconds["total"] = previous - clock["start"]
    return seconds
