"""Compiled loops of the string compiler and the host-side bitmask (Numba).

The string side of a compile is a walk over a trie: every node starts a
token-trie walk down its own subtree, and every state pushes what it knows
to the states its tokens reach. Vectorised NumPy pays a full pass over the
frontier arrays per byte depth and per operation (about 30 passes over a
million-element frontier at K = 10,000), so these loops are compiled with
Numba instead: one pass, no temporaries, compiled once per machine
(`cache=True`). Every function takes and returns plain NumPy arrays.

The string trie is numbered in preorder (root 0, each node followed by its
subtree): a token always moves to a larger id, so increasing id order is a
topological order of the automaton and decreasing id order its reverse.
"""

from __future__ import annotations

import numba
import numpy as np

_jit = numba.njit(cache=True, nogil=True)


@_jit
def preorder_trie(flat, offsets):
    """The byte trie of sorted, distinct, non-empty strings, in preorder.

    Args:
        flat: uint8, the strings concatenated.
        offsets: int64 `[K + 1]`, where each string starts in `flat`.

    Returns:
        `(byte, depth, subtree_end, member_node)`: per node its incoming
        byte and depth, the end of its subtree (its descendants are the ids
        `n + 1 .. subtree_end[n] - 1`), and the node of each string.
    """
    count = offsets.size - 1
    capacity = flat.size + 1
    byte = np.zeros(capacity, np.uint8)
    depth = np.zeros(capacity, np.int32)
    parent = np.full(capacity, -1, np.int32)
    member_node = np.zeros(count, np.int64)
    longest = 0
    for i in range(count):
        longest = max(longest, offsets[i + 1] - offsets[i])
    path = np.zeros(longest + 1, np.int32)  # node at each depth of the current string
    nodes = 1
    for i in range(count):
        start, end = offsets[i], offsets[i + 1]
        shared = 0
        if i > 0:
            previous = offsets[i - 1]
            most = min(end - start, start - previous)
            while shared < most and flat[start + shared] == flat[previous + shared]:
                shared += 1
        for d in range(shared, end - start):
            parent[nodes] = path[d]
            byte[nodes] = flat[start + d]
            depth[nodes] = d + 1
            path[d + 1] = nodes
            nodes += 1
        member_node[i] = path[end - start]
    subtree_end = np.arange(1, nodes + 1).astype(np.int32)
    for n in range(nodes - 1, 0, -1):
        subtree_end[parent[n]] = max(subtree_end[parent[n]], subtree_end[n])
    return byte[:nodes].copy(), depth[:nodes].copy(), subtree_end, member_node


@_jit
def _token_child(node, value, dense, info, token_byte):
    """The child of a token-trie node by one byte, -1 if none."""
    if node < dense.shape[0]:
        return dense[node, value]
    lo = info[node, 2]
    end = lo + info[node, 3]
    hi = end
    while lo < hi:  # children are sorted by byte
        mid = (lo + hi) >> 1
        if token_byte[mid] < value:
            lo = mid + 1
        else:
            hi = mid
    if lo < end and token_byte[lo] == value:
        return lo
    return -1


@_jit
def join(
    byte,
    subtree_end,
    member_of,
    dense,
    info,
    token_byte,
    token_ids,
    eos,
):
    """Every (start node, token, end node) with the token's bytes on a trie
    path from the start node, plus EOS at member nodes.

    `member_of[n]` is the member ending at node n (-1 if none); EOS edges
    lead to `-1 - member`. The token trie is `dense` (the child table of its
    shallow nodes), `info` (int32 `[nodes, 4]`: first token, token count,
    first child, child count of each node, one cache line per lookup),
    `token_byte` and `token_ids`. Returns `(indptr, tokens, targets)`: CSR rows per
    start node, tokens sorted within a row.
    """
    nodes = byte.size
    indptr = np.zeros(nodes + 1, np.int64)
    capacity = 4 * nodes + 16
    tokens = np.empty(capacity, np.int32)
    targets = np.empty(capacity, np.int32)
    stack_node = np.empty(nodes + 1, np.int32)
    stack_token = np.empty(nodes + 1, np.int32)
    edges = 0
    for start in range(nodes):
        row = edges
        top = 0
        child = start + 1
        while child < subtree_end[start]:
            where = _token_child(0, byte[child], dense, info, token_byte)
            if where >= 0:
                stack_node[top] = child
                stack_token[top] = where
                top += 1
            child = subtree_end[child]
        while top > 0:
            top -= 1
            node = stack_node[top]
            where = stack_token[top]
            lo = info[where, 0]
            hi = lo + info[where, 1]
            if edges + (hi - lo) + 1 > capacity:
                capacity = 2 * capacity + (hi - lo) + 1
                tokens = _grow(tokens, capacity)
                targets = _grow(targets, capacity)
            for k in range(lo, hi):
                if token_ids[k] != eos:  # EOS is never text
                    tokens[edges] = token_ids[k]
                    targets[edges] = node
                    edges += 1
            if info[where, 3] == 0:
                continue
            child = node + 1
            while child < subtree_end[node]:
                deeper = _token_child(where, byte[child], dense, info, token_byte)
                if deeper >= 0:
                    stack_node[top] = child
                    stack_token[top] = deeper
                    top += 1
                child = subtree_end[child]
        if member_of[start] >= 0:
            if edges + 1 > capacity:
                capacity = 2 * capacity
                tokens = _grow(tokens, capacity)
                targets = _grow(targets, capacity)
            tokens[edges] = eos
            targets[edges] = -1 - member_of[start]
            edges += 1
        _sort_row(tokens, targets, row, edges)
        indptr[start + 1] = edges
    return indptr, tokens[:edges].copy(), targets[:edges].copy()


@_jit
def _sort_row(tokens, targets, lo, hi):
    """Sorts `tokens[lo:hi]` (distinct), `targets` alongside."""
    if hi - lo > 32:
        order = np.argsort(tokens[lo:hi]) + lo
        tokens[lo:hi] = tokens[order]
        targets[lo:hi] = targets[order]
        return
    for i in range(lo + 1, hi):  # insertion sort: rows are short
        token, target = tokens[i], targets[i]
        j = i - 1
        while j >= lo and tokens[j] > token:
            tokens[j + 1] = tokens[j]
            targets[j + 1] = targets[j]
            j -= 1
        tokens[j + 1] = token
        targets[j + 1] = target


@_jit
def _grow(array, capacity):
    out = np.empty(capacity, array.dtype)
    out[: array.size] = array
    return out


@_jit
def live_states(indptr, targets):
    """Dead ends and the step counts that reach each state.

    A state's step counts (the t for which some t-token path through alive
    states reaches it) are kept as the exact range `[lo, hi]` plus a 64-bit
    window of exact counts from `lo` (bit b: step lo + b). Memory is 16
    bytes a state whatever the members' lengths; a bitset over every step
    would grow with states x longest member. Counts past the window
    (`hi - lo >= 64`, only along members of more than 64 tokens) are taken
    as the whole range up to `hi`: a superset, so widths stay safe.

    Returns `(alive, lo, hi, window)`: whether a member can be completed from
    each node, and its step counts (`hi` = -1: unreachable).
    """
    nodes = indptr.size - 1
    alive = np.zeros(nodes, np.bool_)
    for n in range(nodes - 1, -1, -1):  # targets come after their sources
        for e in range(indptr[n], indptr[n + 1]):
            if targets[e] < 0 or alive[targets[e]]:
                alive[n] = True
                break
    lo = np.full(nodes, np.iinfo(np.int32).max, np.int32)
    hi = np.full(nodes, -1, np.int32)
    window = np.zeros(nodes, np.uint64)
    if nodes == 0 or not alive[0]:
        return alive, lo, hi, window
    lo[0], hi[0], window[0] = 0, 0, 1
    for n in range(nodes):  # pass 1: the exact range of each state
        if hi[n] < 0:
            continue
        for e in range(indptr[n], indptr[n + 1]):
            target = targets[e]
            if target >= 0 and alive[target]:
                lo[target] = min(lo[target], lo[n] + 1)
                hi[target] = max(hi[target], hi[n] + 1)
    for n in range(nodes):  # pass 2: the window, relative to each state's lo
        if hi[n] < 0:
            continue
        spill = hi[n] - lo[n] >= 64  # counts beyond the window, as a range
        for e in range(indptr[n], indptr[n + 1]):
            target = targets[e]
            if target < 0 or not alive[target]:
                continue
            shift = lo[n] + 1 - lo[target]  # >= 0: lo[target] <= lo[n] + 1
            if shift < 64:
                window[target] |= window[n] << np.uint64(shift)
            if spill:  # steps lo[n] + 65 .. hi[n] + 1 of the target's
                for b in range(max(0, shift + 64), min(64, hi[n] + 2 - lo[target])):
                    window[target] |= np.uint64(1) << np.uint64(b)
    return alive, lo, hi, window


@_jit
def renumber(indptr, tokens, targets, live, lo, hi, window, eos, num_members):
    """The final automaton over live states, then one accept state per member.

    Returns `(indptr, tokens, next_states, widths)`: CSR rows in state
    order, and per step t the largest fan-out among live states that some
    t-token path reaches (an upper bound past a state's 64-step window).
    """
    nodes = live.size
    new_id = np.full(nodes, -1, np.int64)
    states = 0
    longest = 0
    for n in range(nodes):
        if live[n]:
            new_id[n] = states
            states += 1
            longest = max(longest, hi[n])
    total = states + num_members
    out_indptr = np.zeros(total + 1, np.int64)
    out_tokens = np.empty(tokens.size + num_members, np.int32)
    out_next = np.empty(tokens.size + num_members, np.int32)
    widths = np.zeros(longest + 1, np.int64)
    spilled = False
    for n in range(nodes):
        spilled |= live[n] and hi[n] - lo[n] >= 64
    spans = _range_max_table(longest + 1 if spilled else 0)
    edges = 0
    for n in range(nodes):
        if not live[n]:
            continue
        row = edges
        for e in range(indptr[n], indptr[n + 1]):
            target = targets[e]
            if target < 0:
                out_tokens[edges] = tokens[e]
                out_next[edges] = states + (-1 - target)
                edges += 1
            elif live[target]:
                out_tokens[edges] = tokens[e]
                out_next[edges] = new_id[target]
                edges += 1
        out_indptr[new_id[n] + 1] = edges
        fan_out = edges - row
        bits, t = window[n], lo[n]
        while bits:  # the exact step counts in the window
            if bits & np.uint64(1):
                widths[t] = max(widths[t], fan_out)
            bits >>= np.uint64(1)
            t += 1
        if hi[n] - lo[n] >= 64:
            _range_max_update(spans, lo[n] + 64, hi[n], fan_out)
    _range_max_apply(spans, widths)
    for m in range(num_members):  # accept states: EOS loops back
        out_tokens[edges] = eos
        out_next[edges] = states + m
        edges += 1
        out_indptr[states + m + 1] = edges
    return out_indptr, out_tokens[:edges].copy(), out_next[:edges].copy(), widths


@_jit
def _range_max_table(size):
    """Pending "at least v on [a, b]" updates over `size` steps: level k holds
    updates to the 2**k steps from each position (a sparse table, so an
    update costs O(1) and applying all of them O(size log size))."""
    levels = 1
    while (1 << levels) <= size:
        levels += 1
    return np.zeros((levels, size), np.int32)


@_jit
def _range_max_update(table, a, b, value):
    k = 0
    while (2 << k) <= b - a + 1:
        k += 1
    table[k, a] = max(table[k, a], value)  # two blocks of 2**k cover [a, b]
    table[k, b - (1 << k) + 1] = max(table[k, b - (1 << k) + 1], value)


@_jit
def _range_max_apply(table, out):
    size = table.shape[1]
    for k in range(table.shape[0] - 1, 0, -1):
        half = 1 << (k - 1)
        for i in range(size - (1 << k) + 1):
            value = table[k, i]
            if value:
                table[k - 1, i] = max(table[k - 1, i], value)
                table[k - 1, i + half] = max(table[k - 1, i + half], value)
    for i in range(size):
        out[i] = max(out[i], table[0, i])


@_jit
def fill_bitmask(states, indptr, tokens, wide, masks, out):
    """Writes the allowed tokens of each state as bits into `out` rows
    (uint32, token t at word t // 32, bit t % 32).

    State -1 allows nothing. A state with `wide[state] >= 0` copies that
    precomputed row of `masks`; the others zero the row and set a bit per
    edge.
    """
    for r in range(states.size):
        state = states[r]
        if state >= 0 and wide[state] >= 0:
            out[r, :] = masks[wide[state]]
            continue
        out[r, :] = 0
        if state < 0:
            continue
        for e in range(indptr[state], indptr[state + 1]):
            token = tokens[e]
            out[r, token >> 5] |= np.uint32(1) << np.uint32(token & 31)
