"""Compiles K strings under a token vocabulary into a trie automaton.

Steps, all vectorised NumPy (loops only over byte depths, never over strings
or tokens):

1. Encode the strings as UTF-8 and build their byte trie (`ByteTrie`).
2. Join it with the vocabulary's token trie (`TokenVocabulary.trie`, built
   once per vocabulary): a frontier of (start node, current node, token-trie
   node) triples advances one byte at a time along the string trie's edges;
   wherever the token-trie node ends a token, that token is allowed at the
   start node and leads to the current node. Every tokenization is covered,
   and two token paths that reach one node share it (explicit next states).
3. Add EOS at member nodes (to one accept state per distinct member, which
   loops on EOS), then drop dead ends: states from which no member can be
   completed (a vocabulary without some single-byte token can strand a
   path) and states no token path reaches.
4. Reachability by step: a bitset per state of the step counts at which
   decoding can be there, pushed along the edges in byte-depth order; B_t is
   the largest fan-out among states reachable at step t.

NumPy only.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Sequence

import numpy as np

from static_keras.strings.byte_trie import ByteTrie
from static_keras.strings.byte_trie import build_byte_trie
from static_keras.strings.byte_trie import sort_unique
from static_keras.strings.layout import StringIndexLayout
from static_keras.strings.token_trie import TokenTrie
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


def _join(strings: ByteTrie, tokens: TokenTrie):
    """All (start node, token, end node) with the token's bytes on a trie path.

    Matches come out grouped by token length, each group sorted by start node.
    """
    token_trie = tokens.trie
    token_count = np.diff(tokens.token_indptr).astype(np.int32)
    token_more = token_trie.num_children > 0
    s_children = strings.num_children
    # Depth 1: every string edge, matched against the root's children.
    start = strings.parent[1:]
    node = np.arange(1, strings.num_nodes, dtype=np.int32)
    where = token_trie.root_children[strings.byte[1:]]
    found_start, found_node, found_where = [], [], []
    while node.size:
        ok = where >= 0
        if not ok.all():
            start, node, where = start[ok], node[ok], where[ok]
        ends = token_count[where] > 0
        found_start.append(start[ends])
        found_node.append(node[ends])
        found_where.append(where[ends])
        counts = np.where(token_more[where], s_children[node], 0)
        live = counts > 0
        if not live.any():
            break
        start, node, where, counts = start[live], node[live], where[live], counts[live]
        first_child = strings.first_child[node]
        if counts.max() == 1:  # chains: the usual case below the first bytes
            node = first_child
        else:
            row = np.repeat(np.arange(node.size, dtype=np.int32), counts)
            before = np.cumsum(counts, dtype=np.int32) - counts
            node = first_child[row] + (np.arange(row.size, dtype=np.int32) - before[row])
            start, where = start[row], where[row]
        where = tokens.child(where, strings.byte[node]).astype(np.int32, copy=False)
    start = np.concatenate(found_start)
    node = np.concatenate(found_node)
    where = np.concatenate(found_where)
    # Expand each token-trie node into its token ids (usually exactly one).
    counts = token_count[where]
    if counts.max(initial=1) == 1:
        return start, tokens.token_ids[tokens.token_indptr[where]], node
    row = np.repeat(np.arange(where.size), counts)
    before = np.cumsum(counts) - counts
    offset = np.arange(row.size) - before[row]
    token = tokens.token_ids[tokens.token_indptr[where][row] + offset]
    return start[row], token, node[row]


def _shift_or_at(masks: list[np.ndarray], sources, targets) -> None:
    """masks[targets] |= masks[sources] << 1 (multi-word bitsets, unbuffered)."""
    carry = None
    for word in range(len(masks)):
        values = masks[word][sources]
        shifted = values << np.uint64(1)
        if carry is not None:
            shifted |= carry
        carry = values >> np.uint64(63)
        np.bitwise_or.at(masks[word], targets, shifted)


def _bits(masks: list[np.ndarray], rows) -> np.ndarray:
    """bool `[len(rows), 64 * words]`: the step bitsets of `rows` unpacked."""
    stacked = np.stack([m[rows] for m in masks], axis=1).astype("<u8")
    return np.unpackbits(stacked.view(np.uint8), axis=1, bitorder="little").astype(bool)


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
    encoded = encode_strings(strings)

    # 1. The byte trie of the distinct strings.
    unique, first, _ = sort_unique(encoded)
    trie, member_node = build_byte_trie(unique)
    num_nodes, num_members = trie.num_nodes, len(unique)
    clock["string_trie"] = time.perf_counter()

    # 2. Join with the vocabulary's token trie (built once per vocabulary).
    tokens = vocabulary.trie
    clock["vocabulary_trie"] = time.perf_counter()
    src, tok, dst = _join(trie, tokens)
    if tokens.allowed[eos]:  # EOS is never text, even where the vocabulary spells it
        keep = tok != eos
        src, tok, dst = src[keep], tok[keep], dst[keep]
    join_edges = int(src.size)
    # EOS edges from member nodes; their target is set after renumbering.
    member = np.arange(num_members, dtype=np.int32)
    src = np.concatenate([src, member_node.astype(np.int32)])
    tok = np.concatenate([tok, np.full(num_members, eos, np.int32)])
    dst = np.concatenate([dst, -1 - member])  # -1 - m marks accept state m
    # Each byte depth's matches come sorted by start node: a stable sort merges runs.
    order = np.argsort(src.astype(np.int64) * vocab_size + tok, kind="stable")
    src, tok, dst = src[order], tok[order], dst[order]
    clock["join"] = time.perf_counter()

    # 3. Dead ends: states that cannot complete a member.
    bounds = np.searchsorted(src, trie.level_offsets)
    alive = np.zeros(num_nodes, bool)
    alive[member_node] = True
    for depth in range(trie.max_depth, -1, -1):
        lo, hi = bounds[depth], bounds[depth + 1]
        if lo == hi:
            continue
        target = dst[lo:hi]
        hit = (target >= 0) & alive[np.maximum(target, 0)]
        alive[src[lo:hi][hit]] = True
    keep = (dst < 0) | alive[np.maximum(dst, 0)]
    src, tok, dst = src[keep], tok[keep], dst[keep]
    to_trie = dst >= 0
    bounds = np.searchsorted(src, trie.level_offsets)

    # 4. Step bitsets: bit t of state n is set when some t-token path reaches n.
    words = (trie.max_depth + 2 + 63) // 64
    masks = [np.zeros(num_nodes, np.uint64) for _ in range(words)]
    masks[0][0] = 1
    for depth in range(trie.max_depth + 1):
        lo, hi = bounds[depth], bounds[depth + 1]
        if lo == hi:
            continue
        inner = np.flatnonzero(to_trie[lo:hi]) + lo
        _shift_or_at(masks, src[inner], dst[inner])
    reached = np.zeros(num_nodes, bool)
    for mask in masks:
        reached |= mask != 0
    if not reached[member_node].all():
        bad = np.flatnonzero(~reached[member_node])
        names = ", ".join(repr(encoded[first[m]].decode("utf-8", "replace")) for m in bad[:_SHOW])
        raise ValueError(
            f"{bad.size} of the {num_members} strings cannot be spelled by any token "
            f"sequence of this vocabulary (a byte without a token, or only special "
            f"tokens): {names}{' ...' if bad.size > _SHOW else ''}"
        )
    clock["prune"] = time.perf_counter()

    # Steps: members finish at step k (k tokens, then EOS at step k).
    member_bits = _bits(masks, member_node)
    last_step = member_bits.shape[1] - 1 - np.argmax(member_bits[:, ::-1], axis=1)
    first_step = np.argmax(member_bits, axis=1)
    needed = int(last_step.max()) + 1
    if max_length is None:
        max_length = needed
    elif int(first_step.max()) + 1 > max_length:
        bad = np.flatnonzero(first_step + 1 > max_length)
        names = ", ".join(repr(encoded[first[m]].decode("utf-8", "replace")) for m in bad[:_SHOW])
        raise ValueError(
            f"`max_length`={max_length} is too short for {bad.size} strings, whose "
            f"shortest tokenization plus EOS takes up to {int(first_step.max()) + 1} "
            f"steps: {names}{' ...' if bad.size > _SHOW else ''}"
        )
    max_length = int(max_length)

    # Renumber: live trie states in order, then one accept state per member.
    live = reached & alive
    new_id = np.cumsum(live) - 1
    num_trie_states = int(live.sum())
    keep = live[src]
    src, tok, dst = src[keep], tok[keep], dst[keep]
    to_trie = dst >= 0
    next_state = np.where(to_trie, new_id[np.maximum(dst, 0)], num_trie_states + (-1 - dst))
    src = new_id[src]
    num_states = num_trie_states + num_members
    # Accept states: EOS loops back.
    accept = np.arange(num_trie_states, num_states, dtype=np.int64)
    src = np.concatenate([src, accept])
    tok = np.concatenate([tok, np.full(num_members, eos, np.int64)])
    next_state = np.concatenate([next_state, accept])
    counts = np.bincount(src, minlength=num_states)
    indptr = np.zeros(num_states + 1, np.int64)
    np.cumsum(counts, out=indptr[1:])

    # Widths: B_t = the largest fan-out among states reachable at step t.
    fan_out = counts[:num_trie_states]
    live_nodes = np.flatnonzero(live)
    order = np.argsort(fan_out, kind="stable")
    sorted_fan = fan_out[order]
    group = np.flatnonzero(np.r_[True, sorted_fan[1:] != sorted_fan[:-1]])
    unions = np.stack(
        [np.bitwise_or.reduceat(m[live_nodes][order], group) for m in masks], axis=1
    ).astype("<u8")
    union_bits = np.unpackbits(unions.view(np.uint8), axis=1, bitorder="little").astype(bool)
    widths = np.where(union_bits, sorted_fan[group][:, None], 0).max(axis=0)
    widths = np.maximum(widths, 1)  # accept states (EOS loop) or nothing at all
    if widths.size < max_length:
        widths = np.concatenate([widths, np.ones(max_length - widths.size, widths.dtype)])
    step_widths = widths[:max_length]
    clock["widths"] = time.perf_counter()

    layout = StringIndexLayout.create(
        vocab_size=vocab_size,
        length=max_length,
        eos_token_id=eos,
        num_states=num_states,
        num_edges=int(src.size),
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
    lengths = np.fromiter(map(len, encoded), np.int64, len(encoded))
    string_offsets = np.zeros(len(encoded) + 1, np.int64)
    np.cumsum(lengths, out=string_offsets[1:])
    host_arrays = {
        "string_data": np.frombuffer(b"".join(encoded), np.uint8).copy(),
        "string_offsets": string_offsets,
    }
    names = ["string_trie", "vocabulary_trie", "join", "prune", "widths"]
    previous, seconds = clock["start"], {}
    for name in names:
        seconds[name] = clock[name] - previous
        previous = clock[name]
    seconds["total"] = previous - clock["start"]
    stats = BuildStats(
        num_strings=len(encoded),
        num_members=num_members,
        trie_nodes=num_nodes,
        trie_states=num_trie_states,
        join_edges=join_edges,
        seconds=seconds,
    )
    return layout, arrays, host_arrays, stats
