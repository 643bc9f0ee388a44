"""Tests of the NumPy-only index (`static_keras.index`) against Python oracles.

Every query of `StaticIndex` is compared with a plain dict-of-sets trie built
from Python tuples (`TrieOracle`), over random and skewed sets, many shapes,
and every dense/tail split (`dense_levels`) that fits in memory.
"""

from __future__ import annotations

import gc
import itertools
import json
import os
import pickle
import warnings
import zipfile
import zlib
from collections import defaultdict

import numpy as np
import pytest

from static_keras.index import StaticIndex
from static_keras.index import archive
from static_keras.index import npz_archive
from static_keras.index.builder import DEFAULT_DENSE_BUDGET_BYTES

# Dense heads need a `V**d` state map (plus `sum(V**t, t < d)` mask rows), so
# the exhaustive tests try every `d` in [0, L] only while `V**d <= 2**22`
# (a 16 MiB state map); larger `d` would cost seconds and hundreds of MiB per
# case without exercising any other code path.
MAX_DENSE_ENTRIES = 2**22

# Out-of-range token values that a query may receive; they must match nothing.
OUT_OF_RANGE = (-1, -(2**40), 2**40)


# ----------------------------------------------------------------------------
# Oracles
# ----------------------------------------------------------------------------


class TrieOracle:
    """The valid set as Python tuples: a set of rows and a dict-of-sets trie."""

    def __init__(self, rows, vocab_size: int):
        rows = np.asarray(rows)
        self.vocab_size = vocab_size
        self.length = rows.shape[1]
        self.rows = set(map(tuple, rows.tolist()))
        self.children: dict[tuple, set] = defaultdict(set)
        for row in self.rows:
            for t in range(self.length):
                self.children[row[:t]].add(row[t])
        self.prefixes = [sorted({row[:t] for row in self.rows}) for t in range(self.length + 1)]

    @property
    def level_sizes(self) -> tuple[int, ...]:
        return tuple(len(level) for level in self.prefixes)

    @property
    def num_states(self) -> int:
        # Distinct prefixes of every length 0..L; the empty prefix (root) once.
        return sum(self.level_sizes)

    @property
    def step_widths(self) -> tuple[int, ...]:
        return tuple(
            max(len(self.children[p]) for p in self.prefixes[t]) for t in range(self.length)
        )

    def allowed(self, prefixes) -> np.ndarray:
        prefixes = np.asarray(prefixes)
        out = np.zeros((prefixes.shape[0], self.vocab_size), dtype=bool)
        for i, prefix in enumerate(prefixes.tolist()):
            tokens = self.children.get(tuple(prefix))
            if tokens:
                out[i, sorted(tokens)] = True
        return out

    def contains(self, seqs) -> np.ndarray:
        return np.array([tuple(s) in self.rows for s in np.asarray(seqs).tolist()], bool)


def expected_auto_dense_levels(vocab_size, level_sizes, budget=DEFAULT_DENSE_BUDGET_BYTES):
    """The documented `dense_levels="auto"` rule, written independently.

    Largest d in [1, L] with `V**d` indexable by int32 whose tables (bit masks
    for steps < d: `V**t` rows of ceil(V/32) int32 words each, plus a `V**d`
    int32 state map) fit in the budget and are either at most 1 MiB or at
    least 1/64 full (`V**d <= 64 * n_d`); 0 if there is none.
    """
    words = -(-vocab_size // 32)
    best = 0
    for d in range(1, len(level_sizes)):
        if vocab_size**d > 2**31 - 1:
            break
        size = sum(vocab_size**t for t in range(d)) * words * 4 + vocab_size**d * 4
        if size > budget:
            break
        if size <= 2**20 or vocab_size**d <= 64 * level_sizes[d]:
            best = d
    return best


def valid_dense_levels(vocab_size: int, length: int) -> list[int]:
    return [d for d in range(length + 1) if vocab_size**d <= MAX_DENSE_ENTRIES]


# ----------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------


def make_rows(family: str, n: int, length: int, vocab: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if family == "uniform":
        return rng.integers(0, vocab, size=(n, length))
    if family == "zipf":
        # Heavy-tailed token popularity, popular tokens spread over the range
        # (including the last ones, which sit in the last mask word).
        ranks = np.minimum(rng.zipf(1.5, size=(n, length)) - 1, vocab - 1)
        return rng.permutation(vocab)[ranks]
    if family == "subrange":
        # Only the top 3 token ids (for V=257 this straddles a mask word).
        low = max(0, vocab - 3)
        return rng.integers(low, vocab, size=(n, length))
    if family == "shared_prefix":
        # A few stems; each row copies a long prefix of one stem, then random.
        stems = rng.integers(0, vocab, size=(3, length))
        rows = rng.integers(0, vocab, size=(n, length))
        cuts = rng.choice([max(0, length - 1), max(0, length - 2), length // 2], size=n)
        which = rng.integers(0, 3, size=n)
        for i in range(n):
            rows[i, : cuts[i]] = stems[which[i], : cuts[i]]
        return rows
    raise AssertionError(family)


def prefix_matrix(oracle: TrieOracle, t: int) -> np.ndarray:
    """The distinct valid prefixes of length t, sorted, as int64 `[n, t]`."""
    level = oracle.prefixes[t]
    return np.array(level, dtype=np.int64).reshape(len(level), t)


def query_prefixes(oracle: TrieOracle, t: int, rng, max_valid=None) -> np.ndarray:
    """Valid prefixes of length t, random ones and one-token mutations."""
    vocab = oracle.vocab_size
    valid = prefix_matrix(oracle, t)
    if max_valid is not None and len(valid) > max_valid:
        valid = valid[rng.choice(len(valid), max_valid, replace=False)]
    parts = [valid]
    if t:
        parts.append(rng.integers(0, vocab, size=(40, t)))
        if vocab > 1:
            mutated = valid[rng.integers(0, len(valid), size=40)].copy()
            col = rng.integers(0, t, size=40)
            mutated[np.arange(40), col] = (
                mutated[np.arange(40), col] + rng.integers(1, vocab, size=40)
            ) % vocab
            parts.append(mutated)
    return np.concatenate(parts).astype(np.int64)


def out_of_range_prefixes(oracle: TrieOracle, t: int, rng) -> np.ndarray:
    """Valid prefixes with one token replaced by an out-of-range value."""
    vocab = oracle.vocab_size
    valid = prefix_matrix(oracle, t)
    bad = valid[rng.integers(0, len(valid), size=12)].copy()
    values = np.resize(np.array(OUT_OF_RANGE + (vocab, vocab + 1, 2 * vocab + 5)), 12)
    bad[np.arange(12), rng.integers(0, t, size=12)] = values
    return bad


def check_valid_queries(index: StaticIndex, oracle: TrieOracle, rows, rng, max_valid=None):
    """Statistics, `sequences()` and queries on members of the set."""
    vocab, length = oracle.vocab_size, oracle.length
    assert index.vocab_size == vocab
    assert index.length == length
    assert index.num_sequences == len(oracle.rows)
    assert index.layout.level_sizes == oracle.level_sizes
    assert index.num_states == oracle.num_states
    assert index.step_widths == oracle.step_widths
    assert 0 <= index.dense_levels <= length
    assert index.nbytes == sum(a.nbytes for a in index.arrays.values())

    seqs = index.sequences()
    assert seqs.dtype == np.int32
    np.testing.assert_array_equal(seqs, np.unique(np.asarray(rows), axis=0))

    for t in range(length):
        prefixes = prefix_matrix(oracle, t)
        if max_valid is not None and len(prefixes) > max_valid:
            prefixes = prefixes[rng.choice(len(prefixes), max_valid, replace=False)]
        np.testing.assert_array_equal(
            index.allowed_tokens(prefixes), oracle.allowed(prefixes), err_msg=f"t={t}"
        )
    members = prefix_matrix(oracle, length)
    if max_valid is not None and len(members) > max_valid:
        members = members[rng.choice(len(members), max_valid, replace=False)]
    assert index.contains(members).all()


def check_invalid_queries(index: StaticIndex, oracle: TrieOracle, rng, max_valid=None):
    """Queries mixing members with random, mutated and out-of-range prefixes."""
    vocab, length = oracle.vocab_size, oracle.length
    for t in range(length):
        prefixes = query_prefixes(oracle, t, rng, max_valid)
        np.testing.assert_array_equal(
            index.allowed_tokens(prefixes), oracle.allowed(prefixes), err_msg=f"t={t}"
        )
        if t:
            bad = out_of_range_prefixes(oracle, t, rng)
            allowed = index.allowed_tokens(bad)
            assert allowed.shape == (len(bad), vocab)
            assert not allowed.any(), f"out-of-range prefix allowed tokens at t={t}"
    # Full-length rows: members, random rows and one-token mutations of members.
    candidates = query_prefixes(oracle, length, rng, max_valid=max_valid or 10**9)
    np.testing.assert_array_equal(index.contains(candidates), oracle.contains(candidates))
    assert not index.contains(out_of_range_prefixes(oracle, length, rng)).any()


def check_against_oracle(indexes, oracle: TrieOracle, rows, rng, max_valid=None):
    """Every property and query of each index against the oracle.

    Valid queries of every index run before any invalid one, so that a bug
    on invalid queries  cannot hide one on valid queries.
    """
    if isinstance(indexes, StaticIndex):
        indexes = [indexes]
    for index in indexes:
        check_valid_queries(index, oracle, rows, rng, max_valid)
    for index in indexes:
        check_invalid_queries(index, oracle, rng, max_valid)


# ----------------------------------------------------------------------------
# 1 + 2. Queries and statistics against the oracle, over a grid
# ----------------------------------------------------------------------------

SIZES = (1, 7, 100, 1000)
LENGTHS = (1, 2, 3, 5, 8)
VOCABS = (2, 3, 17, 256, 257, 4096)

# Seeded cases with non-branching tail levels above a branching one: invalid
# prefixes there once walked out of `indptr` (fixed in `StaticIndex._walk`).
GRID = [
    pytest.param(*case)
    for case in [
        (family, n, length, vocab)
        for family in ("uniform", "shared_prefix")
        for n, length, vocab in itertools.product(SIZES, LENGTHS, VOCABS)
    ]
    + [
        (family, n, length, vocab)
        for family in ("zipf", "subrange")
        for n, length, vocab in itertools.product((7, 1000), LENGTHS, VOCABS)
    ]
]


@pytest.mark.parametrize("family,n,length,vocab", GRID)
def test_queries_match_oracle_for_every_dense_split(family, n, length, vocab):
    seed = zlib.crc32(f"{family}/{n}/{length}/{vocab}".encode())
    rows = make_rows(family, n, length, vocab, seed)
    oracle = TrieOracle(rows, vocab)
    rng = np.random.default_rng(seed + 1)
    splits = valid_dense_levels(vocab, length)
    indexes = [StaticIndex.build(rows, vocab, dense_levels=d) for d in splits]
    assert [index.dense_levels for index in indexes] == splits
    assert len({index.checksum for index in indexes}) == len(splits)
    check_against_oracle(indexes, oracle, rows, rng)

    auto = StaticIndex.build(rows, vocab)
    assert auto.dense_levels == expected_auto_dense_levels(vocab, oracle.level_sizes)


def test_large_random_set_auto_picks_two_dense_levels():
    """The paper's setting, scaled down: V=2048, L=8, N=10**5 random IDs."""
    vocab, length, n = 2048, 8, 10**5
    rng = np.random.default_rng(2048)
    rows = rng.integers(0, vocab, size=(n, length), dtype=np.uint16)
    index = StaticIndex.build(rows, vocab)
    oracle = TrieOracle(rows, vocab)
    # d=1 is free (< 1 MiB); d=2 is ~17 MiB (within 64 MiB) and ~2.4 % full
    # (>= 1/64 = 1.6 %); d=3 would need 2048**3 > 2**31 - 1 entries.
    assert index.dense_levels == 2
    assert expected_auto_dense_levels(vocab, oracle.level_sizes) == 2
    check_against_oracle(index, oracle, rows, rng, max_valid=1500)


# ----------------------------------------------------------------------------
# 3. Edge cases
# ----------------------------------------------------------------------------


def check_all_splits(rows, vocab, seed=0):
    oracle = TrieOracle(rows, vocab)
    rng = np.random.default_rng(seed)
    splits = valid_dense_levels(vocab, oracle.length)
    indexes = [StaticIndex.build(rows, vocab, dense_levels=d) for d in splits]
    check_against_oracle(indexes, oracle, rows, rng)
    return oracle


@pytest.mark.parametrize("vocab", [1, 2, 300])
@pytest.mark.parametrize("length", [1, 4])
def test_single_item(vocab, length):
    rows = np.full((1, length), vocab - 1)
    oracle = check_all_splits(rows, vocab)
    assert oracle.num_states == length + 1
    index = StaticIndex.build(rows, vocab)
    assert index.num_sequences == 1
    assert index.num_states == length + 1
    assert index.step_widths == (1,) * length
    assert index.contains(rows).tolist() == [True]


@pytest.mark.parametrize("dense_levels", [0, 1, 2, 3])  # 50**4 > 2**22
def test_all_items_share_a_long_prefix(dense_levels):
    # L=8, only the last token differs: seven non-branching levels, then one.
    vocab = 50
    rows = np.tile(np.array([3, 1, 4, 1, 5, 9, 2, 0]), (vocab, 1))
    rows[:, -1] = np.arange(vocab)
    index = StaticIndex.build(rows, vocab, dense_levels=dense_levels)
    assert index.step_widths == (1,) * 7 + (vocab,)
    assert index.num_states == 8 + vocab
    for t in range(8):
        allowed = index.allowed_tokens(rows[:1, :t])[0]
        assert allowed.nonzero()[0].tolist() == (
            list(range(vocab)) if t == 7 else [int(rows[0, t])]
        )


def test_all_items_share_a_long_prefix_valid_queries_all_splits():
    vocab, length = 5, 8
    rows = np.tile(np.arange(length) % vocab, (vocab, 1))
    rows[:, -1] = np.arange(vocab)
    oracle = TrieOracle(rows, vocab)
    for d in valid_dense_levels(vocab, length):
        index = StaticIndex.build(rows, vocab, dense_levels=d)
        assert index.step_widths == oracle.step_widths == (1,) * 7 + (vocab,)
        for t in range(length):
            prefixes = prefix_matrix(oracle, t)
            np.testing.assert_array_equal(index.allowed_tokens(prefixes), oracle.allowed(prefixes))
        assert index.contains(rows).all()


def test_shared_prefix_set_rejects_non_members():
    """Non-members diverging early from a set with a long common stem.

    Every tail state at the non-branching depths 1..4 is a valid state, and
    the last level branches: an invalid prefix must answer "absent"/"nothing".
    """
    rows = np.array([[0, 0, 0, 0, 0], [0, 0, 0, 0, 1]])
    index = StaticIndex.build(rows, 2, dense_levels=0)
    assert index.contains([[1, 0, 0, 0, 0]]).tolist() == [False]
    assert not index.allowed_tokens([[1, 0, 0, 0]]).any()
    with_ids = StaticIndex.build(rows, 2, item_ids=[7, 8], dense_levels=0)
    assert with_ids.lookup_item_ids([[1, 0, 0, 0, 0], [0, 0, 0, 0, 1]]).tolist() == [-1, 8]


def test_every_token_at_every_level():
    vocab, length = 3, 3
    rows = np.array(list(itertools.product(range(vocab), repeat=length)))
    oracle = check_all_splits(rows[::-1], vocab)
    assert oracle.num_states == 1 + 3 + 9 + 27
    index = StaticIndex.build(rows, vocab, dense_levels=1)
    assert index.step_widths == (3, 3, 3)
    assert index.num_states == 40
    for t in range(length):
        assert index.allowed_tokens(rows[:, :t]).all()


@pytest.mark.parametrize("length", [1, 3, 8])
def test_vocab_of_one_token(length):
    rows = np.zeros((5, length), dtype=np.int64)
    check_all_splits(rows, 1)
    index = StaticIndex.build(rows, 1)
    assert index.num_sequences == 1
    assert index.step_widths == (1,) * length
    assert index.dense_levels == expected_auto_dense_levels(1, (1,) * (length + 1))
    assert index.allowed_tokens(np.zeros((1, length - 1), int)).tolist() == [[True]]
    if length > 1:
        assert index.allowed_tokens(np.ones((1, length - 1), int)).tolist() == [[False]]
    assert index.contains([[0] * length, [1] * length]).tolist() == [True, False]


@pytest.mark.parametrize("vocab", [2, 31, 32, 33, 64, 65, 1000])
def test_length_one(vocab):
    rng = np.random.default_rng(vocab)
    rows = rng.integers(0, vocab, size=(max(1, vocab // 2), 1))
    rows[0, 0] = vocab - 1  # the last token of the last mask word
    oracle = check_all_splits(rows, vocab)
    index = StaticIndex.build(rows, vocab)
    allowed = index.allowed_tokens(np.zeros((3, 0), dtype=np.int64))
    np.testing.assert_array_equal(allowed, np.tile(oracle.allowed([[]]), (3, 1)))
    assert index.step_widths == (len(oracle.rows),)


def test_duplicate_rows_count_once():
    base = np.array([[1, 2, 3], [0, 2, 3], [1, 2, 0]])
    rows = np.concatenate([base, base[::-1], base[[1, 1, 1]]])
    oracle = check_all_splits(rows, 4)
    index = StaticIndex.build(rows, 4)
    assert index.num_sequences == 3 == len(oracle.rows)
    np.testing.assert_array_equal(index.sequences(), np.unique(base, axis=0))
    assert index.checksum == StaticIndex.build(base, 4).checksum


@pytest.mark.parametrize(
    "dtype", [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64]
)
def test_any_integer_dtype_builds_the_same_index(dtype):
    rows = np.array([[1, 2, 3], [0, 2, 3], [1, 2, 0], [1, 2, 3]])
    reference = StaticIndex.build(rows.tolist(), 100)
    index = StaticIndex.build(rows.astype(dtype), np.int64(100))
    assert index.checksum == reference.checksum
    assert index.contains(rows.astype(dtype)).all()
    # After [1, 2]: {0, 3}; after [0, 2]: {3}.
    assert index.allowed_tokens(rows[:, :2].astype(dtype))[:, [0, 3]].tolist() == [
        [True, True],
        [False, True],
        [True, True],
        [True, True],
    ]


def test_non_contiguous_input():
    rng = np.random.default_rng(5)
    rows = rng.integers(0, 9, size=(60, 8))
    view = np.asfortranarray(rows)[::2, ::2]
    index = StaticIndex.build(view, 9, dense_levels=1)
    np.testing.assert_array_equal(index.sequences(), np.unique(rows[::2, ::2], axis=0))


@pytest.mark.parametrize(
    "length,vocab",
    [(40, 17), (130, 2), (20, 4096)],
)
def test_long_sequences_many_packed_words(length, vocab):
    """Rows that span several 64-bit sort keys and tie on the first ones."""
    rows = make_rows("shared_prefix", 300, length, vocab, seed=length)
    oracle = TrieOracle(rows, vocab)
    rng = np.random.default_rng(length)
    auto = StaticIndex.build(rows, vocab)
    assert auto.dense_levels == expected_auto_dense_levels(vocab, oracle.level_sizes)
    splits = sorted({0, 1, auto.dense_levels})
    indexes = [StaticIndex.build(rows, vocab, dense_levels=d) for d in splits]
    check_against_oracle(indexes, oracle, rows, rng, max_valid=200)


def test_queries_accept_lists_and_empty_batches():
    index = StaticIndex.build([[1, 2], [1, 3], [0, 2]], vocab_size=4)
    assert index.contains([[1, 3], [3, 1]]).tolist() == [True, False]
    assert index.allowed_tokens([[1]])[0].nonzero()[0].tolist() == [2, 3]
    assert index.allowed_tokens([[]]).shape == (1, 4)
    assert index.allowed_tokens([]).shape == (1, 4)  # one empty prefix
    assert index.allowed_tokens(np.zeros((0, 1), np.int64)).shape == (0, 4)
    assert index.allowed_tokens(np.zeros((0, 0), np.int64)).shape == (0, 4)
    assert index.contains(np.zeros((0, 2), np.int64)).shape == (0,)


def test_arrays_are_read_only_views():
    index = StaticIndex.build([[1, 2], [1, 3]], vocab_size=4, item_ids=[5, 6])
    arrays = index.arrays
    assert set(arrays) == {"dense_masks", "dense_states", "tokens", "indptr", "leaf_item_ids"}
    for array in arrays.values():
        with pytest.raises(ValueError, match="read-only"):
            array[...] = 0
    assert index.contains([[1, 2]]).tolist() == [True]


# ----------------------------------------------------------------------------
# 3b. The "auto" rule
# ----------------------------------------------------------------------------


def test_auto_tiny_set_with_big_vocab_takes_only_the_free_level():
    # d=1 costs V int32 (16 KiB) -> free; d=2 is a 64 MiB map, 3 states: over
    # the budget, and far below 1/64 full anyway.
    rows = [[1, 2, 3, 4], [4095, 0, 0, 0], [7, 7, 7, 7]]
    index = StaticIndex.build(rows, 4096)
    assert index.dense_levels == 1


def test_auto_budget_caps_dense_levels():
    rows = np.array(list(itertools.product(range(3), repeat=4)))
    assert StaticIndex.build(rows, 3).dense_levels == 4  # everything is tiny
    assert StaticIndex.build(rows, 3, dense_budget_bytes=0).dense_levels == 0
    # d=1: 1 mask row (4 B) + 3 states (12 B) = 16 B; d=2: 16 B + 36 B = 52 B.
    assert StaticIndex.build(rows, 3, dense_budget_bytes=16).dense_levels == 1
    assert StaticIndex.build(rows, 3, dense_budget_bytes=51).dense_levels == 1
    assert StaticIndex.build(rows, 3, dense_budget_bytes=52).dense_levels == 2


def test_auto_sparse_level_over_one_mebibyte_is_skipped():
    # V=1024, d=2: a 4 MiB map. 10 rows fill 10 of its 2**20 entries (< 1/64).
    rng = np.random.default_rng(0)
    sparse = rng.integers(0, 1024, size=(10, 3))
    assert StaticIndex.build(sparse, 1024).dense_levels == 1
    # 40 000 random rows fill ~3.8 % of it (>= 1/64): taken. d=3 > 64 MiB.
    dense = rng.integers(0, 1024, size=(40_000, 3))
    index = StaticIndex.build(dense, 1024)
    assert index.dense_levels == 2
    assert index.dense_levels == expected_auto_dense_levels(1024, index.layout.level_sizes)


def test_dense_tables_have_the_documented_size():
    rows = np.random.default_rng(1).integers(0, 40, size=(100, 4))
    for d in range(5):
        index = StaticIndex.build(rows, 40, dense_levels=d)
        arrays = index.arrays
        words = 2  # ceil(40 / 32)
        if d:
            assert arrays["dense_masks"].shape == (sum(40**t for t in range(d)), words)
            assert arrays["dense_states"].shape == (40**d,)
        else:  # placeholders of size 1
            assert arrays["dense_masks"].shape == (1, words)
            assert arrays["dense_states"].shape == (1,)


def test_numpy_integer_dense_levels():
    rows = [[1, 2], [1, 3], [0, 2]]
    assert StaticIndex.build(rows, 4, dense_levels=np.int64(1)).dense_levels == 1


# ----------------------------------------------------------------------------
# 4. Item ids
# ----------------------------------------------------------------------------


def test_lookup_item_ids_every_split():
    rng = np.random.default_rng(11)
    rows = rng.integers(0, 6, size=(200, 4))
    _, first = np.unique(rows, axis=0, return_index=True)
    rows = rows[np.sort(first)]  # distinct, in random order
    ids = rng.integers(0, 2**40, len(rows))
    ids[0] = 2**62
    expected = dict(zip(map(tuple, rows.tolist()), ids.tolist()))
    others = rng.integers(0, 6, size=(300, 4))
    for d in range(5):
        index = StaticIndex.build(rows, 6, item_ids=ids, dense_levels=d)
        assert index.has_item_ids
        got = index.lookup_item_ids(rows)
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, ids)
        got = index.lookup_item_ids(others)
        np.testing.assert_array_equal(got, [expected.get(tuple(r), -1) for r in others.tolist()])
        assert index.lookup_item_ids([[6, 0, 0, 0], [-1, 0, 0, 0]]).tolist() == [-1, -1]


def test_duplicate_rows_with_the_same_id_are_fine():
    rows = [[1, 2], [0, 1], [1, 2], [1, 2]]
    index = StaticIndex.build(rows, 3, item_ids=[9, 4, 9, 9])
    assert index.lookup_item_ids([[1, 2], [0, 1], [2, 2]]).tolist() == [9, 4, -1]


def test_conflicting_ids_raise_by_default():
    rows = [[1, 2], [0, 1], [1, 2]]
    with pytest.raises(ValueError, match="Two different item ids share one semantic ID"):
        StaticIndex.build(rows, 3, item_ids=[9, 4, 8])
    with pytest.raises(ValueError, match="on_duplicate_item='first'"):
        StaticIndex.build(rows, 3, item_ids=[9, 4, 8], on_duplicate_item="error")


@pytest.mark.parametrize("dense_levels", [0, 1, 2, 3])
def test_first_and_last_follow_input_order(dense_levels):
    # Duplicate groups whose input order disagrees with the ids' order and
    # with the sorted order of the rows.
    rows = [[2, 2, 1], [0, 0, 0], [2, 2, 1], [1, 0, 2], [2, 2, 1], [0, 0, 0], [1, 0, 2]]
    ids = [50, 7, 10, 3, 30, 1, 3]
    kw = dict(item_ids=ids, dense_levels=dense_levels)
    first = StaticIndex.build(rows, 3, on_duplicate_item="first", **kw)
    last = StaticIndex.build(rows, 3, on_duplicate_item="last", **kw)
    query = [[2, 2, 1], [0, 0, 0], [1, 0, 2], [1, 1, 1]]
    assert first.lookup_item_ids(query).tolist() == [50, 7, 3, -1]
    assert last.lookup_item_ids(query).tolist() == [30, 1, 3, -1]


def test_first_and_last_on_a_large_shuffled_set():
    rng = np.random.default_rng(3)
    rows = rng.integers(0, 4, size=(3000, 5))  # 1024 possible rows: many dups
    ids = np.arange(len(rows))
    first_seen, last_seen = {}, {}
    for row, i in zip(map(tuple, rows.tolist()), ids.tolist()):
        first_seen.setdefault(row, i)
        last_seen[row] = i
    keys = np.array(sorted(first_seen))
    for policy, expected in (("first", first_seen), ("last", last_seen)):
        index = StaticIndex.build(rows, 4, item_ids=ids, on_duplicate_item=policy)
        got = index.lookup_item_ids(keys)
        assert got.tolist() == [expected[tuple(k)] for k in keys.tolist()]


def test_lookup_without_item_ids_raises():
    index = StaticIndex.build([[1, 2]], 3)
    assert not index.has_item_ids
    with pytest.raises(ValueError, match="without `item_ids`"):
        index.lookup_item_ids([[1, 2]])


# ----------------------------------------------------------------------------
# 5. Bad inputs
# ----------------------------------------------------------------------------

ROWS = [[1, 2, 3], [0, 1, 2]]


@pytest.mark.parametrize(
    "sequences,vocab,match",
    [
        ([[1, -2, 3]], 5, "negative token -2"),
        ([[1, 2, 5]], 5, "token 5 .*out of range for vocab_size=5"),
        (np.array([[1.0, 2.0]]), 5, "must hold integers"),
        (np.array([[1.5, 2.0]]), 5, "must hold integers"),
        (np.array([[True, False]]), 5, "must hold integers"),
        (np.array([["a", "b"]]), 5, "must hold integers"),
        ([1, 2, 3], 5, "must have rank 2"),
        (np.zeros((2, 2, 2), int), 5, "must have rank 2"),
        (7, 5, "must have rank 2"),
        ([[1, 2], [3]], 5, "ragged"),
        ([[1, 2], [3, None]], 5, "ragged or holds non-numbers"),
        (np.zeros((0, 3), int), 5, "empty"),
        (np.zeros((3, 0), int), 5, "empty"),
        ([], 5, "empty"),
        (ROWS, 0, "at least 1"),
        (ROWS, -4, "at least 1"),
        (ROWS, 4.0, "must be an integer"),
        (ROWS, "4", "must be an integer"),
        (ROWS, True, "must be an integer"),
        (ROWS, None, "must be an integer"),
    ],
)
def test_bad_sequences_and_vocab(sequences, vocab, match):
    with pytest.raises(ValueError, match=match):
        StaticIndex.build(sequences, vocab)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(item_ids=[1]), r"one id per sequence: expected shape \(2,\)"),
        (dict(item_ids=[1, 2, 3]), "one id per sequence"),
        (dict(item_ids=[[1, 2]]), "one id per sequence"),
        (dict(item_ids=5), "one id per sequence"),
        (dict(item_ids=[1.0, 2.0]), "`item_ids` must hold integers"),
        (dict(item_ids=[True, False]), "`item_ids` must hold integers"),
        (dict(item_ids=np.array([2**63, 1], np.uint64)), "do not fit in int64"),
        (dict(dense_levels=-1), r"must lie in \[0, length=3\]"),
        (dict(dense_levels=4), r"must lie in \[0, length=3\]"),
        (dict(dense_levels="2"), "must be 'auto' or an integer"),
        (dict(dense_levels="full"), "must be 'auto' or an integer"),
        (dict(dense_levels=1.0), "must be 'auto' or an integer"),
        (dict(dense_levels=True), "must be 'auto' or an integer"),
        (dict(dense_levels=None), "must be 'auto' or an integer"),
        (dict(on_duplicate_item="keep"), "`on_duplicate_item` must be one of"),
        (dict(on_duplicate_item=None), "`on_duplicate_item` must be one of"),
    ],
)
def test_bad_build_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        StaticIndex.build(ROWS, 5, **kwargs)


def test_dense_levels_beyond_int32_state_map():
    with pytest.raises(ValueError, match="more than int32 can index"):
        StaticIndex.build([[1, 2, 3]], 4096, dense_levels=3)


@pytest.mark.parametrize(
    "method,query,match",
    [
        ("contains", [[1, 2]], "must have length 3"),
        ("contains", [[1, 2, 3, 4]], "at most 3"),
        ("contains", [1, 2, 3], "must have rank 2"),
        ("contains", [[[1, 2, 3]]], "must have rank 2"),
        ("contains", [[1.0, 2.0, 3.0]], "must hold integers"),
        ("contains", [[True, False, True]], "must hold integers"),
        ("allowed_tokens", [[1, 2, 3]], "at most 2"),
        ("allowed_tokens", [[[1, 2]]], "must have rank 2"),
        ("allowed_tokens", [0.5, 1.5], "must hold integers"),
        ("allowed_tokens", [[0.5]], "must hold integers"),
        ("lookup_item_ids", [[1, 2]], "must have length 3"),
        ("lookup_item_ids", [[1.0, 2.0, 3.0]], "must hold integers"),
    ],
)
def test_bad_queries(method, query, match):
    index = StaticIndex.build(ROWS, 5, item_ids=[1, 2])
    with pytest.raises(ValueError, match=match):
        getattr(index, method)(query)


# ----------------------------------------------------------------------------
# 6. save / load
# ----------------------------------------------------------------------------


@pytest.fixture
def saved(tmp_path):
    rng = np.random.default_rng(6)
    rows = rng.integers(0, 300, size=(2000, 5))
    _, keep = np.unique(rows, axis=0, return_index=True)
    rows = rows[keep]
    index = StaticIndex.build(rows, 300, item_ids=np.arange(len(rows)) * 3)
    path = tmp_path / "index.npz"
    index.save(path)
    return index, path, rows


def assert_same_index(a: StaticIndex, b: StaticIndex, rows):
    assert a.layout == b.layout
    assert a.checksum == b.checksum
    assert set(a.arrays) == set(b.arrays)
    for name, array in a.arrays.items():
        assert b.arrays[name].dtype == array.dtype, name
        np.testing.assert_array_equal(b.arrays[name], array, err_msg=name)
    np.testing.assert_array_equal(a.sequences(), b.sequences())
    np.testing.assert_array_equal(a.contains(rows), b.contains(rows))
    np.testing.assert_array_equal(a.allowed_tokens(rows[:, :2]), b.allowed_tokens(rows[:, :2]))
    if a.has_item_ids:
        np.testing.assert_array_equal(a.lookup_item_ids(rows), b.lookup_item_ids(rows))


def test_round_trip(saved, tmp_path):
    index, path, rows = saved
    assert os.listdir(tmp_path) == ["index.npz"]  # atomic: no temporary left
    assert zipfile.is_zipfile(path)
    with zipfile.ZipFile(path) as archive:
        names = sorted(archive.namelist())
        assert all(info.compress_type == zipfile.ZIP_STORED for info in archive.infolist())
    assert names == sorted(f"{n}.npy" for n in [*index.arrays, "__metadata__"])
    loaded = StaticIndex.load(path)
    assert_same_index(index, loaded, rows)
    assert loaded.lookup_item_ids(rows).tolist() == (np.arange(len(rows)) * 3).tolist()
    loaded.save(str(tmp_path / "again.npz"))  # str paths too
    assert_same_index(index, StaticIndex.load(str(tmp_path / "again.npz")), rows)
    assert sorted(os.listdir(tmp_path)) == ["again.npz", "index.npz"]


@pytest.mark.parametrize("d", [0, 1, 2, 3])
def test_round_trip_every_split(tmp_path, d):
    rows = make_rows("shared_prefix", 100, 3, 17, seed=d)
    index = StaticIndex.build(rows, 17, dense_levels=d)
    index.save(tmp_path / "i.npz")
    assert_same_index(index, StaticIndex.load(tmp_path / "i.npz"), rows)


def test_metadata_document(saved):
    index, path, _ = saved
    with np.load(path, allow_pickle=False) as archive:
        document = json.loads(archive["__metadata__"].tobytes().decode())
    assert document["format"] == "static-keras-automaton"
    assert document["format_version"] == 2
    assert document["kind"] == "semantic_ids"
    assert document["checksum"] == index.checksum
    assert document["num_members"] == index.num_sequences
    assert document["num_states"] == index.num_states
    assert document["nbytes"] == index.nbytes
    assert document["layout"] == index.layout.to_config()


def test_save_overwrites_atomically(saved, tmp_path):
    index, path, rows = saved
    other = StaticIndex.build([[1, 2, 3, 4, 5]], 300)
    other.save(path)
    assert os.listdir(tmp_path) == ["index.npz"]
    assert StaticIndex.load(path).checksum == other.checksum


def test_failed_save_leaves_old_file_and_no_temporary(saved, tmp_path, monkeypatch):
    index, path, rows = saved
    before = path.read_bytes()

    def broken_savez(file, **arrays):
        file.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(npz_archive.np, "savez", broken_savez)
    with pytest.raises(OSError, match="disk full"):
        StaticIndex.build([[1, 2, 3, 4, 5]], 300).save(path)
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["index.npz"]
    assert path.read_bytes() == before


def test_save_into_missing_directory(tmp_path):
    index = StaticIndex.build([[1, 2]], 3)
    with pytest.raises(FileNotFoundError):
        index.save(tmp_path / "no" / "such" / "dir.npz")
    assert os.listdir(tmp_path) == []


def load_error(path, match, error=ValueError) -> list:
    """`StaticIndex.load(path)` must raise `error`; returns unclosed-file warnings.

    NumPy's `np.load` leaves its file open when a file that starts like a zip
    archive is not one (see `test_load_closes_corrupt_zip_file`); the
    ResourceWarning is collected here so that it is reported by that test
    rather than, through the warnings-as-errors config, by whichever test the
    garbage collector happens to run in.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        with pytest.raises(error, match=match):
            StaticIndex.load(path)
        gc.collect()
    return [w for w in caught if issubclass(w.category, ResourceWarning)]


@pytest.mark.parametrize("keep", [0, 10, 100, 0.5, -22, -1])
def test_load_truncated_file(saved, keep):
    index, path, _ = saved
    data = path.read_bytes()
    cut = int(len(data) * keep) if isinstance(keep, float) else keep % len(data)
    path.write_bytes(data[:cut])
    load_error(path, "truncated or corrupt")


def test_load_an_array_shorter_than_its_header(saved, tmp_path):
    """The aligned reader fills exactly the bytes the header declares: an
    array whose data ends early is refused with the file named, not read
    with a tail of garbage."""
    import zipfile

    _, path, _ = saved
    short = tmp_path / "short.npz"
    with zipfile.ZipFile(path) as source, zipfile.ZipFile(short, "w") as target:
        for info in source.infolist():
            data = source.read(info)
            if info.filename == "tokens.npy":
                data = data[: len(data) - 8]
            target.writestr(info, data)
    load_error(short, r"short\.npz.*(truncated or corrupt|ends after)")


def test_load_closes_corrupt_zip_file(saved):
    _, path, _ = saved
    path.write_bytes(path.read_bytes()[:-22])  # cut the end-of-directory record
    leaked = load_error(path, "truncated or corrupt")
    assert leaked == [], [str(w.message) for w in leaked]


@pytest.mark.parametrize("name", ["tokens", "indptr", "leaf_item_ids", "dense_states"])
def test_load_flipped_byte_in_array_payload(saved, name):
    index, path, _ = saved
    data = bytearray(path.read_bytes())
    payload = index.arrays[name].tobytes()
    assert len(payload) > 64
    start = bytes(data).find(payload)
    assert start > 0 and bytes(data).find(payload, start + 1) == -1
    data[start + len(payload) // 2] ^= 0x10
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="corrupt"):
        StaticIndex.load(path)


def rewrite(path, out, *, edit_metadata=None, edit_arrays=None):
    """Copies an index file, editing its metadata or arrays on the way."""
    with np.load(path, allow_pickle=False) as archive:
        arrays = {name: archive[name] for name in archive.files}
    document = json.loads(arrays.pop("__metadata__").tobytes().decode())
    if edit_metadata:
        edit_metadata(document)
    if edit_arrays:
        edit_arrays(arrays)
    arrays["__metadata__"] = np.frombuffer(json.dumps(document).encode(), np.uint8)
    np.savez(out, **arrays)
    return out


def test_archive_of_version_0_1_0_loads(saved, tmp_path):
    # 0.1.0 wrote format "static-keras-index", version 1, without a kind.
    index, path, rows = saved

    def legacy(document):
        document.update(format="static-keras-index", format_version=1)
        document.pop("kind")

    out = rewrite(path, tmp_path / "old.npz", edit_metadata=legacy)
    assert_same_index(index, StaticIndex.load(out), rows)
    assert archive.load(out).checksum == index.checksum


def test_load_names_the_other_kind(tmp_path):
    from static_keras.strings import StringIndex
    from static_keras.strings import TokenVocabulary

    vocab = TokenVocabulary.from_token_bytes([b"a", b"b", b"<e>"], special=[2])
    StringIndex.from_strings(["ab"], vocab, eos_token_id=2).save(tmp_path / "s.npz")
    with pytest.raises(ValueError, match="holds a StringIndex .kind 'strings'., not a StaticIndex"):
        StaticIndex.load(tmp_path / "s.npz")
    assert type(archive.load(tmp_path / "s.npz")).__name__ == "StringIndex"


def test_load_array_edited_behind_the_checksum(saved, tmp_path):
    _, path, _ = saved

    def edit(arrays):
        arrays["leaf_item_ids"] = arrays["leaf_item_ids"].copy()
        arrays["leaf_item_ids"][3] += 1

    out = rewrite(path, tmp_path / "edited.npz", edit_arrays=edit)
    with pytest.raises(ValueError, match="failed its checksum"):
        StaticIndex.load(out)


def test_rewritten_unchanged_file_still_loads(saved, tmp_path):
    index, path, rows = saved
    out = rewrite(path, tmp_path / "copy.npz")
    assert_same_index(index, StaticIndex.load(out), rows)


@pytest.mark.parametrize(
    "edit,match",
    [
        (
            lambda m: m.update(format_version=3),
            "format version 3; this static-keras reads version 2",
        ),
        (
            lambda m: m.update(format="static-keras-index", format_version=2),
            "format version 2; this static-keras reads version 1",
        ),
        (lambda m: m.update(kind="graph"), "kind 'graph', which this static-keras does not"),
        (lambda m: m.update(kind="strings"), "invalid strings layout"),
        (
            lambda m: m.update(format_version="2"),
            r"format version is '2' \(str\), not an integer; this static-keras reads version 2",
        ),
        (lambda m: m.pop("format_version"), r"format version is None \(NoneType\)"),
        (lambda m: m.update(format="something-else"), "not a static-keras index file"),
        (lambda m: m["layout"].update(length=4), "Inconsistent index layout|holds arrays|shape"),
        (lambda m: m["layout"].update(vocab_size=301), "shape|failed its checksum"),
        (lambda m: m["layout"].update(has_item_ids=False), "holds arrays"),
        (lambda m: m.update(checksum="0" * 64), "failed its checksum"),
    ],
)
def test_load_bad_metadata(saved, tmp_path, edit, match):
    _, path, _ = saved
    out = rewrite(path, tmp_path / "bad.npz", edit_metadata=edit)
    with pytest.raises(ValueError, match=match):
        StaticIndex.load(out)


def test_load_missing_array(saved, tmp_path):
    _, path, _ = saved
    out = rewrite(path, tmp_path / "bad.npz", edit_arrays=lambda a: a.pop("tokens"))
    with pytest.raises(ValueError, match="holds arrays"):
        StaticIndex.load(out)


def test_load_metadata_without_layout(saved, tmp_path):
    _, path, _ = saved
    out = rewrite(path, tmp_path / "bad.npz", edit_metadata=lambda m: m.pop("layout"))
    with pytest.raises(ValueError):
        StaticIndex.load(out)


def test_load_corrupt_metadata_json(tmp_path):
    path = tmp_path / "bad.npz"
    np.savez(path, __metadata__=np.frombuffer(b"{not json", np.uint8))
    with pytest.raises(ValueError, match="truncated or corrupt"):
        StaticIndex.load(path)
    np.savez(path, __metadata__=np.frombuffer(b"[1, 2]", np.uint8))
    with pytest.raises(ValueError, match="no metadata"):
        StaticIndex.load(path)


def test_load_non_index_npz(tmp_path):
    path = tmp_path / "other.npz"
    np.savez(path, a=np.arange(3), b=np.eye(2))
    with pytest.raises(ValueError, match="not a static-keras index"):
        StaticIndex.load(path)


_UNPICKLED = []


def _tripwire():
    _UNPICKLED.append(True)
    return "tripped"


class _Tripwire:
    def __reduce__(self):
        return (_tripwire, ())


def test_load_never_unpickles(tmp_path):
    path = tmp_path / "pickled.npz"
    np.savez(path, __metadata__=np.array([_Tripwire()], dtype=object))
    with pytest.raises(ValueError, match="holds pickled Python objects.*unpickling can run code"):
        StaticIndex.load(path)
    raw = tmp_path / "raw.pkl"
    raw.write_bytes(pickle.dumps(_Tripwire()))
    with pytest.raises(ValueError):
        StaticIndex.load(raw)
    assert _UNPICKLED == []


@pytest.mark.parametrize("content", [b"", b"hello, world", b"PK\x03\x04" + b"\0" * 40])
def test_load_garbage_file(tmp_path, content):
    path = tmp_path / "garbage.npz"
    path.write_bytes(content)
    load_error(path, "truncated or corrupt")


def test_load_plain_npy_file(tmp_path):
    path = tmp_path / "array.npy"
    np.save(path, np.arange(10))
    with pytest.raises(ValueError):
        StaticIndex.load(path)


def test_load_missing_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="No index file"):
        StaticIndex.load(tmp_path / "missing.npz")
    with pytest.raises(FileNotFoundError, match="No index file"):
        StaticIndex.load(tmp_path)  # a directory is not an index file


# ----------------------------------------------------------------------------
# Large vocabularies (token dtype int32)
# ----------------------------------------------------------------------------


def test_vocab_above_uint16():
    vocab = 70_000
    rows = np.array([[69_999, 3, 1], [5, 6, 7], [5, 65_536, 0]])
    index = StaticIndex.build(rows, vocab)
    oracle = TrieOracle(rows, vocab)
    check_against_oracle(index, oracle, rows, np.random.default_rng(0))


@pytest.mark.parametrize(
    "vocab_size, length, n",
    [(2**20, 6, 500), (2**31 - 1, 4, 500), (16, 3, 400), (2048, 8, 3000)],
)
def test_rows_sort_as_python_sorts_them_with_ties_on_the_first_tokens(vocab_size, length, n):
    """The build's sort: one sort of (first tokens, row number) keys, then
    the rows tied on those tokens ordered by the rest. Few distinct first
    tokens and a narrow rest make many ties and duplicate rows; duplicates
    keep input order (the duplicate-item policies depend on it)."""
    from static_keras.index import builder

    rng = np.random.default_rng(length)
    prefixes = rng.integers(0, vocab_size, (7, 2))
    rows = np.concatenate(
        [prefixes[rng.integers(0, 7, n)], rng.integers(0, min(vocab_size, 5), (n, length - 2))],
        axis=1,
    ).astype(np.int32)
    order, columns = builder._sorted_rows(rows, vocab_size)
    expected = sorted(range(n), key=lambda i: (tuple(rows[i]), i))
    assert order.tolist() == expected
    for t, column in enumerate(columns):
        assert column.dtype == rows.dtype
        np.testing.assert_array_equal(column, rows[expected, t])
