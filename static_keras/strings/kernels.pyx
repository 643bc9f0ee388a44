# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False
"""Compiled loops of the string compiler and the host-side bitmask (Cython).

The string side of a compile is a walk over a trie: every node starts a
token-trie walk down its own subtree, and every state pushes what it knows
to the states its tokens reach. Vectorised NumPy pays a full pass over the
frontier arrays per byte depth and per operation (about 30 passes over a
million-element frontier at K = 10,000), so these loops are compiled: one
pass, no temporaries. They are compiled when the package is installed (a C
extension), so the first compile in a fresh environment costs no JIT.
Every function takes and returns plain NumPy arrays.

The string trie is numbered in preorder (root 0, each node followed by its
subtree): a token always moves to a larger id, so increasing id order is a
topological order of the automaton and decreasing id order its reverse.
"""

import numpy as np

from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport qsort
from libc.string cimport memcpy
from libc.string cimport memset
from cpython.buffer cimport PyBUF_C_CONTIGUOUS, PyBUF_FORMAT, PyBUF_WRITABLE
from cpython.buffer cimport PyBuffer_Release, PyObject_GetBuffer

cdef int32_t _INT32_MAX = 2147483647


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
    cdef const uint8_t[::1] data = np.ascontiguousarray(flat, np.uint8)
    cdef const int64_t[::1] offset = np.ascontiguousarray(offsets, np.int64)
    cdef Py_ssize_t count = offset.shape[0] - 1
    byte_out = np.zeros(data.shape[0] + 1, np.uint8)
    depth_out = np.zeros(data.shape[0] + 1, np.int32)
    parent_out = np.full(data.shape[0] + 1, -1, np.int32)
    member_out = np.zeros(count, np.int64)
    cdef uint8_t[::1] byte = byte_out
    cdef int32_t[::1] depth = depth_out
    cdef int32_t[::1] parent = parent_out
    cdef int64_t[::1] member_node = member_out
    cdef int64_t longest = 0, i, d, start, end, shared, previous, most, nodes = 1, n
    for i in range(count):
        longest = max(longest, offset[i + 1] - offset[i])
    path_out = np.zeros(longest + 1, np.int32)  # node at each depth of the current string
    cdef int32_t[::1] path = path_out
    for i in range(count):
        start, end = offset[i], offset[i + 1]
        shared = 0
        if i > 0:
            previous = offset[i - 1]
            most = min(end - start, start - previous)
            while shared < most and data[start + shared] == data[previous + shared]:
                shared += 1
        for d in range(shared, end - start):
            parent[nodes] = path[d]
            byte[nodes] = data[start + d]
            depth[nodes] = d + 1
            path[d + 1] = nodes
            nodes += 1
        member_node[i] = path[end - start]
    subtree_out = np.arange(1, nodes + 1, dtype=np.int32)
    cdef int32_t[::1] subtree_end = subtree_out
    for n in range(nodes - 1, 0, -1):
        if subtree_end[n] > subtree_end[parent[n]]:
            subtree_end[parent[n]] = subtree_end[n]
    return byte_out[:nodes].copy(), depth_out[:nodes].copy(), subtree_out, member_out


cdef inline int64_t _token_child(
    int64_t node,
    uint8_t value,
    const int32_t* dense,
    int64_t dense_rows,
    const int32_t* info,
    const uint8_t* token_byte,
) noexcept nogil:
    """The child of a token-trie node by one byte, -1 if none."""
    if node < dense_rows:
        return dense[node * 256 + value]
    cdef int64_t lo = info[node * 4 + 2]
    cdef int64_t end = lo + info[node * 4 + 3]
    cdef int64_t hi = end, mid
    while lo < hi:  # children are sorted by byte
        mid = (lo + hi) >> 1
        if token_byte[mid] < value:
            lo = mid + 1
        else:
            hi = mid
    if lo < end and token_byte[lo] == value:
        return lo
    return -1


cdef int _by_token(const void* a, const void* b) noexcept nogil:
    cdef int64_t x = (<const int64_t*>a)[0], y = (<const int64_t*>b)[0]
    return (x > y) - (x < y)


cdef void _sort_row(int32_t* tokens, int32_t* targets, int64_t lo, int64_t hi, int64_t* scratch) noexcept nogil:
    """Sorts `tokens[lo:hi]` (distinct), `targets` alongside."""
    cdef int64_t i, j
    cdef int32_t token, target
    if hi - lo > 32:  # pack (token, target) into one key; tokens are distinct
        for i in range(lo, hi):
            scratch[i - lo] = (<int64_t>tokens[i] << 32) | <uint32_t>targets[i]
        qsort(scratch, hi - lo, sizeof(int64_t), _by_token)
        for i in range(lo, hi):
            tokens[i] = <int32_t>(scratch[i - lo] >> 32)
            targets[i] = <int32_t><uint32_t>scratch[i - lo]  # the low 32 bits
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


def join(byte, subtree_end, member_of, dense, info, token_byte, token_ids, int64_t eos):
    """Every (start node, token, end node) with the token's bytes on a trie
    path from the start node, plus EOS at member nodes.

    `member_of[n]` is the member ending at node n (-1 if none); EOS edges
    lead to `-1 - member`. The token trie is `dense` (the child table of its
    shallow nodes), `info` (int32 `[nodes, 4]`: first token, token count,
    first child, child count of each node, one cache line per lookup),
    `token_byte` and `token_ids`. Returns `(indptr, tokens, targets)`: CSR
    rows per start node, tokens sorted within a row.
    """
    cdef const uint8_t[::1] node_byte = np.ascontiguousarray(byte, np.uint8)
    cdef const int32_t[::1] end_of = np.ascontiguousarray(subtree_end, np.int32)
    cdef const int32_t[::1] member = np.ascontiguousarray(member_of, np.int32)
    dense_array = np.ascontiguousarray(dense, np.int32).reshape(-1, 256)
    cdef const int32_t[::1] dense_flat = dense_array.reshape(-1)
    cdef const int32_t[::1] info_flat = np.ascontiguousarray(info, np.int32).reshape(-1)
    cdef const uint8_t[::1] child_byte = np.ascontiguousarray(token_byte, np.uint8)
    cdef const int32_t[::1] ids = np.ascontiguousarray(token_ids, np.int32)
    cdef int64_t dense_rows = dense_array.shape[0]
    cdef const int32_t* dense_p = &dense_flat[0] if dense_flat.shape[0] else NULL
    cdef const int32_t* info_p = &info_flat[0]
    cdef const uint8_t* byte_p = &child_byte[0] if child_byte.shape[0] else NULL
    cdef Py_ssize_t nodes = node_byte.shape[0]
    indptr_out = np.zeros(nodes + 1, np.int64)
    cdef int64_t[::1] indptr = indptr_out
    cdef int64_t capacity = 4 * nodes + 16
    tokens_out = np.empty(capacity, np.int32)
    targets_out = np.empty(capacity, np.int32)
    cdef int32_t[::1] tokens = tokens_out
    cdef int32_t[::1] targets = targets_out
    stack_out = np.empty((2, nodes + 1), np.int32)
    cdef int32_t[:, ::1] stack = stack_out  # (trie node, token-trie node) pairs
    scratch_out = np.empty(ids.shape[0] + 2, np.int64)  # a row has at most every token + EOS
    cdef int64_t[::1] scratch = scratch_out
    cdef int64_t edges = 0, row, top, child, start, node, where, lo, hi, k, deeper
    for start in range(nodes):
        row = edges
        top = 0
        child = start + 1
        while child < end_of[start]:
            where = _token_child(0, node_byte[child], dense_p, dense_rows, info_p, byte_p)
            if where >= 0:
                stack[0, top] = child
                stack[1, top] = where
                top += 1
            child = end_of[child]
        while top > 0:
            top -= 1
            node = stack[0, top]
            where = stack[1, top]
            lo = info_p[where * 4]
            hi = lo + info_p[where * 4 + 1]
            if edges + (hi - lo) + 1 > capacity:
                capacity = 2 * capacity + (hi - lo) + 1
                tokens_out = _grow(tokens_out, edges, capacity)
                targets_out = _grow(targets_out, edges, capacity)
                tokens, targets = tokens_out, targets_out
            for k in range(lo, hi):
                if ids[k] != eos:  # EOS is never text
                    tokens[edges] = ids[k]
                    targets[edges] = node
                    edges += 1
            if info_p[where * 4 + 3] == 0:
                continue
            child = node + 1
            while child < end_of[node]:
                deeper = _token_child(where, node_byte[child], dense_p, dense_rows, info_p, byte_p)
                if deeper >= 0:
                    stack[0, top] = child
                    stack[1, top] = deeper
                    top += 1
                child = end_of[child]
        if member[start] >= 0:
            if edges + 1 > capacity:
                capacity = 2 * capacity
                tokens_out = _grow(tokens_out, edges, capacity)
                targets_out = _grow(targets_out, edges, capacity)
                tokens, targets = tokens_out, targets_out
            tokens[edges] = eos
            targets[edges] = -1 - member[start]
            edges += 1
        if edges > row + 1:
            _sort_row(&tokens[0], &targets[0], row, edges, &scratch[0])
        indptr[start + 1] = edges
    return indptr_out, tokens_out[:edges].copy(), targets_out[:edges].copy()


cdef object _grow(object array, int64_t used, int64_t capacity):
    out = np.empty(capacity, array.dtype)
    out[:used] = array[:used]
    return out


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
    cdef const int64_t[::1] row = np.ascontiguousarray(indptr, np.int64)
    cdef const int32_t[::1] target = np.ascontiguousarray(targets, np.int32)
    cdef Py_ssize_t nodes = row.shape[0] - 1
    alive_out = np.zeros(nodes, np.bool_)
    lo_out = np.full(nodes, _INT32_MAX, np.int32)
    hi_out = np.full(nodes, -1, np.int32)
    window_out = np.zeros(nodes, np.uint64)
    cdef uint8_t[::1] alive = alive_out.view(np.uint8)
    cdef int32_t[::1] lo = lo_out
    cdef int32_t[::1] hi = hi_out
    cdef uint64_t[::1] window = window_out
    cdef int64_t n, e, t, shift, b
    cdef bint spill
    for n in range(nodes - 1, -1, -1):  # targets come after their sources
        for e in range(row[n], row[n + 1]):
            if target[e] < 0 or alive[target[e]]:
                alive[n] = 1
                break
    if nodes == 0 or not alive[0]:
        return alive_out, lo_out, hi_out, window_out
    lo[0], hi[0], window[0] = 0, 0, 1
    for n in range(nodes):  # pass 1: the exact range of each state
        if hi[n] < 0:
            continue
        for e in range(row[n], row[n + 1]):
            t = target[e]
            if t >= 0 and alive[t]:
                lo[t] = min(lo[t], lo[n] + 1)
                hi[t] = max(hi[t], hi[n] + 1)
    for n in range(nodes):  # pass 2: the window, relative to each state's lo
        if hi[n] < 0:
            continue
        spill = hi[n] - lo[n] >= 64  # counts beyond the window, as a range
        for e in range(row[n], row[n + 1]):
            t = target[e]
            if t < 0 or not alive[t]:
                continue
            shift = lo[n] + 1 - lo[t]  # >= 0: lo[t] <= lo[n] + 1
            if shift < 64:
                window[t] |= window[n] << shift
            if spill:  # steps lo[n] + 65 .. hi[n] + 1, in the target's window
                for b in range(max(0, shift + 64), min(64, hi[n] + 2 - lo[t])):
                    window[t] |= (<uint64_t>1) << b
    return alive_out, lo_out, hi_out, window_out


def renumber(indptr, tokens, targets, live, lo, hi, window, int64_t eos, int64_t num_members):
    """The final automaton over live states, then one accept state per member.

    Returns `(indptr, tokens, next_states, widths)`: CSR rows in state
    order, and per step t the largest fan-out among live states that some
    t-token path reaches (an upper bound past a state's 64-step window).
    """
    cdef const int64_t[::1] row = np.ascontiguousarray(indptr, np.int64)
    cdef const int32_t[::1] token = np.ascontiguousarray(tokens, np.int32)
    cdef const int32_t[::1] target = np.ascontiguousarray(targets, np.int32)
    cdef const uint8_t[::1] is_live = np.ascontiguousarray(live, np.bool_).view(np.uint8)
    cdef const int32_t[::1] low = np.ascontiguousarray(lo, np.int32)
    cdef const int32_t[::1] high = np.ascontiguousarray(hi, np.int32)
    cdef const uint64_t[::1] steps = np.ascontiguousarray(window, np.uint64)
    cdef Py_ssize_t nodes = is_live.shape[0]
    new_id_out = np.full(nodes, -1, np.int64)
    cdef int64_t[::1] new_id = new_id_out
    cdef int64_t states = 0, longest = 0, n, e, t, edges = 0, first, fan_out, m, step
    cdef bint spilled = False
    cdef uint64_t bits
    for n in range(nodes):
        if is_live[n]:
            new_id[n] = states
            states += 1
            longest = max(longest, high[n])
            spilled = spilled or high[n] - low[n] >= 64
    out_indptr_a = np.zeros(states + num_members + 1, np.int64)
    out_tokens_a = np.empty(token.shape[0] + num_members, np.int32)
    out_next_a = np.empty(token.shape[0] + num_members, np.int32)
    widths_a = np.zeros(longest + 1, np.int64)
    spans_a = _range_max_table(longest + 1 if spilled else 0)
    cdef int64_t[::1] out_indptr = out_indptr_a
    cdef int32_t[::1] out_tokens = out_tokens_a
    cdef int32_t[::1] out_next = out_next_a
    cdef int64_t[::1] widths = widths_a
    cdef int32_t[:, ::1] spans = spans_a
    for n in range(nodes):
        if not is_live[n]:
            continue
        first = edges
        for e in range(row[n], row[n + 1]):
            t = target[e]
            if t < 0:
                out_tokens[edges] = token[e]
                out_next[edges] = states + (-1 - t)
                edges += 1
            elif is_live[t]:
                out_tokens[edges] = token[e]
                out_next[edges] = new_id[t]
                edges += 1
        out_indptr[new_id[n] + 1] = edges
        fan_out = edges - first
        bits, step = steps[n], low[n]
        while bits:  # the exact step counts in the window
            if bits & 1:
                widths[step] = max(widths[step], fan_out)
            bits >>= 1
            step += 1
        if high[n] - low[n] >= 64:
            _range_max_update(spans, low[n] + 64, high[n], fan_out)
    _range_max_apply(spans, widths)
    for m in range(num_members):  # accept states: EOS loops back
        out_tokens[edges] = eos
        out_next[edges] = states + m
        edges += 1
        out_indptr[states + m + 1] = edges
    return out_indptr_a, out_tokens_a[:edges].copy(), out_next_a[:edges].copy(), widths_a


def _range_max_table(int64_t size):
    """Pending "at least v on [a, b]" updates over `size` steps: level k holds
    updates to the 2**k steps from each position (a sparse table, so an
    update costs O(1) and applying all of them O(size log size))."""
    cdef int64_t levels = 1
    while (1 << levels) <= size:
        levels += 1
    return np.zeros((levels, size), np.int32)


cdef void _range_max_update(int32_t[:, ::1] table, int64_t a, int64_t b, int64_t value) noexcept:
    cdef int64_t k = 0
    while (2 << k) <= b - a + 1:
        k += 1
    table[k, a] = max(table[k, a], value)  # two blocks of 2**k cover [a, b]
    table[k, b - (1 << k) + 1] = max(table[k, b - (1 << k) + 1], value)


cdef void _range_max_apply(int32_t[:, ::1] table, int64_t[::1] out) noexcept:
    cdef int64_t size = table.shape[1], k, half, i
    cdef int32_t value
    for k in range(table.shape[0] - 1, 0, -1):
        half = 1 << (k - 1)
        for i in range(size - (1 << k) + 1):
            value = table[k, i]
            if value:
                table[k - 1, i] = max(table[k - 1, i], value)
                table[k - 1, i + half] = max(table[k - 1, i + half], value)
    for i in range(size):
        out[i] = max(out[i], table[0, i])


cdef inline int64_t _load(const char* data, int size, int64_t i) noexcept nogil:
    """Element i of an integer array of `size` bytes per element (the index
    keeps its narrowest dtypes; the branch is the same for every element)."""
    if size == 1:
        return (<const uint8_t*>data)[i]
    if size == 2:
        return (<const uint16_t*>data)[i]
    if size == 4:
        return (<const int32_t*>data)[i]
    return (<const int64_t*>data)[i]


cdef extern from *:
    """
    #if defined(__GNUC__) || defined(__clang__)
    #define SK_PREFETCH(p) __builtin_prefetch((const void*)(p))
    #else
    #define SK_PREFETCH(p) ((void)(p))
    #endif
    """
    void _prefetch "SK_PREFETCH"(const void* address) noexcept nogil

# The writer's entry of a state (uint64): the kind in the top 2 bits, then
# - _SPAN: edge count in bits 40-61, first edge in bits 0-39;
# - _INLINE: the state's 1-3 tokens themselves (count in bits 60-61, tokens
#   in fields of `_token_bits` from bit 0): no read of `tokens` at all;
# - _WIDE: the number of its precomputed row in the low bits.
cdef uint64_t _SPAN = 0, _INLINE = 1, _WIDE = 2
cdef uint64_t _LOW40 = (<uint64_t>1 << 40) - 1
cdef int64_t _MAX_SPAN_COUNT = (<int64_t>1 << 22) - 1
#: Rows zeroed by one memset: a cold buffer is written faster in long runs
#: than row by row, and a chunk stays in L2 while its bits are set.
cdef Py_ssize_t _CHUNK_BYTES = 128 * 1024


cdef class BitmaskWriter:
    """Writes the allowed tokens of states as bitmask rows (XGrammar/vLLM
    layout: int32 words, token t at word t // 32, bit t % 32).

    Built once per index; a call does no allocation and holds no Python
    objects in its loop. Wide states (more edges than `wide_edges`, e.g. the
    root) copy a row precomputed here; the others have their bits set one
    per edge in rows zeroed a chunk at a time. States outside
    `[0, num_states)` allow nothing.

    In a decode loop the index is out of cache at every call (the model's
    forward pass ran in between), so the loop is built around its misses:
    one 8-byte entry per state says where the state's tokens are, or holds
    them when there are at most 3 (most states of a string set: no second
    lookup), and every row's entry and tokens are prefetched before use.

    Args:
        indptr: int `[num_states + 1]`, CSR row starts (any int dtype).
        tokens: int `[num_edges]`, the tokens of the edges (any int dtype).
        vocab_size: V.
        wide_edges: edge count above which a state's row is precomputed.
    """

    cdef object _tokens, _entries, _masks
    cdef const char* _tokens_p
    cdef int _tokens_size
    cdef const uint64_t* _entry_p
    cdef const int32_t* _precomputed_p
    cdef int64_t _num_states
    cdef int _token_bits
    cdef readonly Py_ssize_t words

    def __init__(self, indptr, tokens, int64_t vocab_size, int64_t wide_edges):
        cdef const char* starts
        cdef int size
        cdef int64_t state, wide = 0
        # Counts past the span's 22 bits are always precomputed.
        cdef int64_t wide_limit = min(wide_edges, _MAX_SPAN_COUNT)
        indptr = np.ascontiguousarray(indptr)
        self._tokens = np.ascontiguousarray(tokens)
        for name, array in (("indptr", indptr), ("tokens", self._tokens)):
            if array.dtype.kind not in "iu" or array.dtype.itemsize not in (1, 2, 4, 8):
                raise ValueError(f"`{name}` must be an integer array. Received {array.dtype}")
        if self._tokens.shape[0] > <int64_t>_LOW40:
            raise ValueError(f"At most 2**40 edges. Received {self._tokens.shape[0]}")
        self._tokens_size = self._tokens.dtype.itemsize
        self._tokens_p = <const char*><size_t>self._tokens.ctypes.data
        self._num_states = indptr.shape[0] - 1
        self.words = (vocab_size + 31) // 32
        # Up to 3 tokens of 20 bits, or 2 of 30, fit in the 60 bits below the tags.
        self._token_bits = 20 if vocab_size <= 1 << 20 else 30 if vocab_size <= 1 << 30 else 0
        starts = <const char*><size_t>indptr.ctypes.data
        size = indptr.dtype.itemsize
        for state in range(self._num_states):
            wide += _load(starts, size, state + 1) - _load(starts, size, state) > wide_limit
        self._masks = np.zeros((wide, self.words), np.int32)
        self._precomputed_p = <const int32_t*><size_t>self._masks.ctypes.data
        self._entries = np.empty(self._num_states, np.uint64)
        self._entry_p = <const uint64_t*><size_t>self._entries.ctypes.data
        self._build(starts, size, wide_limit)

    cdef void _build(self, const char* starts, int size, int64_t wide_limit) noexcept:
        cdef uint64_t* entry = <uint64_t*>self._entry_p
        cdef int capacity = 60 // self._token_bits if self._token_bits else 0
        cdef int64_t state, start, count, wide = 0, e
        cdef uint64_t packed
        for state in range(self._num_states):
            start = _load(starts, size, state)
            count = _load(starts, size, state + 1) - start
            if count > wide_limit:
                entry[state] = (_WIDE << 62) | <uint64_t>wide
                for e in range(start, start + count):
                    self._set_bit(<uint32_t*>(self._precomputed_p + wide * self.words), e)
                wide += 1
            elif 1 <= count <= capacity:
                packed = (_INLINE << 62) | (<uint64_t>count << 60)
                for e in range(count):
                    packed |= <uint64_t>_load(
                        self._tokens_p, self._tokens_size, start + e
                    ) << (e * self._token_bits)
                entry[state] = packed
            else:
                entry[state] = (<uint64_t>count << 40) | <uint64_t>start

    cdef inline void _set_bit(self, uint32_t* row, int64_t edge) noexcept nogil:
        cdef int64_t t = _load(self._tokens_p, self._tokens_size, edge)
        row[t >> 5] |= (<uint32_t>1) << (t & 31)

    @property
    def wide_states(self) -> int:
        """How many states have a precomputed row."""
        return self._masks.shape[0]

    def __call__(self, states, out):
        """Writes rows `0 .. len(states) - 1` of `out`.

        Args:
            states: C-contiguous int32 `[n]` (TypeError otherwise: the caller
                converts).
            out: C-contiguous, writable int32 `[>= n, words]` (XGrammar's and
                vLLM's bitmask).
        """
        # The raw buffer protocol: a step's call costs about as much as the
        # row writes (typed memoryviews cost microseconds to acquire).
        cdef Py_buffer given, rows
        try:
            PyObject_GetBuffer(states, &given, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)
        except (BufferError, ValueError):
            raise TypeError("`states` must be a C-contiguous 1-D int32 array") from None
        try:
            if given.ndim != 1 or not _is_int32(&given):
                raise TypeError("`states` must be a C-contiguous 1-D int32 array")
            try:
                PyObject_GetBuffer(out, &rows, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE)
            except (BufferError, ValueError, TypeError) as error:
                raise ValueError(f"{self._out_message(given.shape[0])} ({error})") from None
            try:
                if (
                    rows.ndim != 2
                    or not _is_int32(&rows)
                    or rows.shape[1] != self.words
                    or rows.shape[0] < given.shape[0]
                ):
                    raise ValueError(self._out_message(given.shape[0]))
                self._write(<const int32_t*>given.buf, given.shape[0], <int32_t*>rows.buf)
            finally:
                PyBuffer_Release(&rows)
        finally:
            PyBuffer_Release(&given)

    def _out_message(self, n):
        return f"`out` must be a C-contiguous int32 array [>= {n}, {self.words}]"

    cdef inline uint64_t _entry(self, int64_t state) noexcept nogil:
        if state < 0 or state >= self._num_states:
            return 0  # a span of no edges: the row stays zero
        return self._entry_p[state]

    cdef void _write(self, const int32_t* states, Py_ssize_t n, int32_t* out) noexcept:
        cdef Py_ssize_t words = self.words, r, first = 0, last
        cdef size_t row_bytes = words * sizeof(uint32_t)
        cdef Py_ssize_t chunk = max(1, _CHUNK_BYTES // <Py_ssize_t>row_bytes)
        cdef uint64_t entry, kind, field_mask = ((<uint64_t>1) << self._token_bits) - 1
        cdef int64_t e, end, t
        cdef uint32_t* row
        with nogil:
            for r in range(n):  # every row's entry in flight at once
                if 0 <= states[r] < self._num_states:
                    _prefetch(self._entry_p + states[r])
            while first < n:
                last = min(first + chunk, n)
                for r in range(first, last):  # their tokens, while the memset runs
                    entry = self._entry(states[r])
                    if entry >> 62 == _SPAN:
                        _prefetch(self._tokens_p + <int64_t>(entry & _LOW40) * self._tokens_size)
                memset(out + first * words, 0, (last - first) * row_bytes)
                for r in range(first, last):
                    row = <uint32_t*>(out + r * words)
                    entry = self._entry(states[r])
                    kind = entry >> 62
                    if kind == _INLINE:
                        for e in range((entry >> 60) & 3):
                            t = <int64_t>((entry >> (e * self._token_bits)) & field_mask)
                            row[t >> 5] |= (<uint32_t>1) << (t & 31)
                    elif kind == _WIDE:
                        memcpy(row, self._precomputed_p + (entry & _LOW40) * words, row_bytes)
                    else:
                        e = <int64_t>(entry & _LOW40)
                        end = e + <int64_t>((entry >> 40) & _MAX_SPAN_COUNT)
                        while e < end:
                            self._set_bit(row, e)
                            e += 1
                first = last


cdef inline bint _is_int32(Py_buffer* view) noexcept:
    """A buffer of 4-byte signed ints ('i', or 'l' where long is 4 bytes)."""
    if view.itemsize != 4 or view.format == NULL:
        return False
    cdef const char* code = view.format
    if code[0] in (b"@", b"=", b"<", b">", b"!"):
        code += 1
    return (code[0] == b"i" or code[0] == b"l") and code[1] == 0
