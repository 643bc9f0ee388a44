"""Member ranges and eligibility sets against brute-force oracles.

- `member_ranges` of every state (valid or not) of small semantic-ID indexes,
  every dense depth 0..L, and of string indexes, against the members found by
  walking every member's path (semantic IDs) or searching the automaton
  (strings);
- `EligibilitySets` counts, refreshes, exclusions and files against Python
  sets;
- the keras.ops kernels against the NumPy ones (the test backend, plus JAX
  under `jax.jit` and torch in fresh interpreters).
"""

from __future__ import annotations

import os
import textwrap

import numpy as np
import pytest
from backend_subprocess import run_under

from static_keras.index import StaticIndex
from static_keras.index import eligibility
from static_keras.index import member_ranges
from static_keras.index.eligibility import EligibilitySets
from static_keras.index.eligibility import MemberCatalogue

# ----------------------------------------------------------------------------
# Oracles
# ----------------------------------------------------------------------------


def reachable_members_by_walk(index: StaticIndex) -> dict[int, set[int]]:
    """state -> members below it, from every prefix of every member's sequence."""
    sequences = index.sequences()
    members = np.arange(index.num_members)
    np.testing.assert_array_equal(index.walk(sequences), index.layout.first_member_state + members)
    below: dict[int, set[int]] = {}
    for t in range(index.length + 1):
        for state, member in zip(index.walk(sequences[:, :t]).tolist(), members.tolist()):
            below.setdefault(state, set()).add(member)
    return below


def reachable_members_by_search(index) -> dict[int, set[int]]:
    """state -> members reachable over the automaton's edges (any tokens)."""
    row, _, target = index.edges(np.arange(index.num_states))
    children: dict[int, set[int]] = {}
    for state, child in zip(row.tolist(), target.tolist()):
        children.setdefault(state, set()).add(child)
    first = index.layout.first_member_state
    below = {s: {s - first} for s in range(first, index.num_states)}
    for state in range(first - 1, -1, -1):  # every edge leads to a larger state
        below[state] = set().union(*(below[c] for c in children.get(state, ())))
    return below


def check_ranges(index, below: dict[int, set[int]], *, contiguous: bool = True):
    states = np.arange(-2, index.layout.state_space + 3)
    lo, hi = index.member_ranges(states)
    assert lo.dtype == hi.dtype == np.int64 and lo.shape == states.shape
    for state, a, b in zip(states.tolist(), lo.tolist(), hi.tolist()):
        members = below.get(state, set())
        if not members:
            assert a == b, (state, a, b)
            if not 0 <= state < index.layout.state_space:
                assert a == b == 0
            continue
        assert (a, b) == (min(members), max(members) + 1), (state, a, b, members)
        if contiguous:
            assert b - a == len(members), (state, members)


def semantic_cases():
    rng = np.random.default_rng(0)
    shared = np.concatenate([np.full((30, 2), 3), rng.integers(0, 5, (30, 3))], axis=1)
    # Depth 2 -> 3 has one child per state (no row pointers), depth 3 branches.
    single_then_branch = np.array(
        [[0, 0, 0, 1], [0, 0, 0, 2], [0, 1, 1, 0], [2, 2, 2, 2], [2, 2, 2, 3], [2, 3, 0, 0]]
    )
    return {
        "random_v4_l4": (rng.integers(0, 4, (40, 4)), 4),
        "random_v8_l3": (rng.integers(0, 8, (150, 3)), 8),
        "v2_l6": (rng.integers(0, 2, (25, 6)), 2),
        "one_member": (np.array([[1, 0, 2]]), 3),
        "all_share_a_prefix": (shared, 5),
        "single_child_then_branch": (single_then_branch, 4),
        "deep_single_child_levels": (rng.integers(0, 16, (12, 7)), 16),
        "every_sequence_v2": (np.array(np.meshgrid(*[[0, 1]] * 4)).reshape(4, -1).T, 2),
        "length_one": (np.array([[0], [2], [3]]), 5),
    }


@pytest.mark.parametrize("case", sorted(semantic_cases()))
def test_semantic_member_ranges_match_every_prefix_walk(case):
    sequences, vocab = semantic_cases()[case]
    length = sequences.shape[1]
    tried = 0
    for d in range(length + 1):
        if vocab**d > 2**16:
            break
        index = StaticIndex.build(sequences, vocab, dense_levels=d)
        check_ranges(index, reachable_members_by_walk(index))
        tried += 1
    assert tried >= min(length + 1, 3)


def test_hi_is_lo_of_the_next_state_of_a_depth():
    index = StaticIndex.build(semantic_cases()["random_v4_l4"][0], 4, dense_levels=1)
    layout = index.layout
    for t in range(layout.dense_levels, layout.length + 1):
        first = layout.depth_starts[t]
        states = np.arange(first, first + layout.level_sizes[t])
        lo, hi = index.member_ranges(states)
        np.testing.assert_array_equal(hi[:-1], lo[1:])
        assert lo[0] == 0 and hi[-1] == index.num_members and (hi > lo).all()
    # The only extra array: a first member per dense code block (plus the end).
    assert index.member_range_nbytes == 8 * (1 + 1)


def test_member_ranges_of_finished_states_and_checks():
    index = StaticIndex.build(semantic_cases()["random_v8_l3"][0], 8, dense_levels=2)
    members = np.arange(index.num_members)
    lo, hi = index.member_ranges(index.layout.first_member_state + members)
    np.testing.assert_array_equal(lo, members)
    np.testing.assert_array_equal(hi, members + 1)
    assert [r.tolist() for r in index.member_ranges([0])] == [[0], [index.num_members]]
    with pytest.raises(ValueError, match="must hold integers"):
        index.member_ranges([0.5])


def _string_index(members, vocabulary):
    from static_keras.strings import StringIndex

    return StringIndex.from_strings(members, vocabulary, eos_token_id=vocabulary.eos_token_id)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_string_member_ranges_are_exact_with_every_single_byte(seed):
    from string_oracles import random_byte_vocabulary

    rng = np.random.default_rng(seed)
    vocabulary = random_byte_vocabulary(seed, size=40, alphabet=b"abc", max_len=4)
    members = sorted(
        {bytes(rng.choice(list(b"abc"), int(rng.integers(1, 7))).tolist()) for _ in range(20)}
    )
    index = _string_index(members, vocabulary)
    check_ranges(index, reachable_members_by_search(index))
    assert index.member_ranges_exact
    # Members are numbered in sorted order: member m's item id is its string.
    ids = index.item_ids(np.arange(index.layout.first_member_state, index.num_states))
    assert [members[i] for i in ids] == sorted(members)


def test_string_member_ranges_with_a_byte_level_bpe():
    pytest.importorskip("tokenizers", reason="the BPE vocabulary is trained with `tokenizers`")
    from string_oracles import MEMBERS
    from string_oracles import byte_level_vocabulary

    index = _string_index(MEMBERS, byte_level_vocabulary())
    check_ranges(index, reachable_members_by_search(index))
    assert index.member_ranges_exact


def test_string_member_ranges_without_some_single_bytes_may_have_holes():
    from static_keras.strings import TokenVocabulary

    # No token "c": from the state after "a", "ab" and "ad" are reachable
    # but "ac" (only the token "ac" from the root spells it) is not.
    tokens = [b"a", b"b", b"d", b"ac", b"<eos>"]
    vocabulary = TokenVocabulary.from_token_bytes(tokens, special=[4], eos_token_id=4)
    index = _string_index(["ab", "ac", "ad"], vocabulary)
    below = reachable_members_by_search(index)
    after_a = int(index.walk([[0]])[0])
    assert below[after_a] == {0, 2}
    check_ranges(index, below, contiguous=False)  # the smallest covering range
    assert not index.member_ranges_exact
    _, _, exact = member_ranges.automaton_member_bounds(
        index.arrays["indptr"], index.arrays["next_states"], index.layout.first_member_state
    )
    assert not exact[after_a] and not exact[0]
    assert exact[int(index.walk([[3]])[0])]


# ----------------------------------------------------------------------------
# Eligibility sets
# ----------------------------------------------------------------------------

BOUNDARIES = (0, 1, 30, 31, 32, 33, 63, 64, 65)


def eligible_oracle(index, item_ids) -> set[int]:
    """Members whose item id is in `item_ids` (the catalogue of the index)."""
    first = index.layout.first_member_state
    if index.has_item_ids:
        ids = index.item_ids(np.arange(first, index.layout.state_space)).tolist()
    else:
        ids = list(range(index.num_members))
    wanted = set(np.asarray(item_ids, np.int64).reshape(-1).tolist())
    return {m for m, item in enumerate(ids) if item in wanted}


def semantic_index(n: int, seed: int = 0, item_ids: bool = True) -> StaticIndex:
    """Exactly n distinct members (n may be a multiple of 32)."""
    rng = np.random.default_rng(seed)
    codes = rng.choice(16**4, size=n, replace=False)
    rows = np.stack([(codes // 16**k) % 16 for k in (3, 2, 1, 0)], axis=1)
    ids = rng.permutation(n) * 3 + 5 if item_ids else None
    return StaticIndex.build(rows, 16, item_ids=ids, dense_levels=1)


def check_counts(sets: EligibilitySets, expected: list[set[int]], rng):
    n = sets.num_members
    edges = sorted({p for p in BOUNDARIES + (n - 33, n - 32, n - 31, n - 1, n) if 0 <= p <= n})
    lo, hi = np.meshgrid(edges, edges)
    lo, hi = np.minimum(lo, hi).ravel(), np.maximum(lo, hi).ravel()
    random = np.sort(rng.integers(0, n + 1, (2, 300)), axis=0)
    lo, hi = np.concatenate([lo, random[0]]), np.concatenate([hi, random[1]])
    for s, members in enumerate(expected):
        got = sets.count(s, lo, hi)
        want = [sum(a <= m < b for m in members) for a, b in zip(lo.tolist(), hi.tolist())]
        np.testing.assert_array_equal(got, want)
        ranks = sets.rank(np.full(n + 1, s), np.arange(n + 1))
        np.testing.assert_array_equal(ranks[1:] - ranks[:-1], [m in members for m in range(n)])
        np.testing.assert_array_equal(
            sets.contains(s, np.arange(n + 1)), [m in members for m in range(n + 1)]
        )
    assert sets.sizes() == {name: len(e) for name, e in zip(sets.names, expected)}


@pytest.mark.parametrize("n", [1, 31, 64, 97, 320])
def test_counts_match_python_sets_at_word_boundaries(n):
    rng = np.random.default_rng(n)
    index = semantic_index(n)
    catalogue = eligibility.MemberCatalogue.from_index(index)
    ids = catalogue.item_ids
    half = rng.choice(ids, n // 2 + 1, replace=True)  # duplicates
    lists = {
        "half": np.concatenate([half, [-1, 4, 10**12, ids.max() + 3]]),  # not in the catalogue
        "empty": [],
        "all": ids,
    }
    sets = EligibilitySets.build(index, lists)
    assert sets.names == ("half", "empty", "all") and sets.num_sets == 3
    assert sets.set_id("all") == 2
    check_counts(sets, [eligible_oracle(index, v) for v in lists.values()], rng)
    words = eligibility.words_per_set(n)
    assert words == n // 32 + 1 and sets.words.shape == (3, words)
    assert sets.directory.shape == (3, (words + 1) // 2)  # one entry per pair of words
    assert sets.nbytes == 3 * (words + (words + 1) // 2) * 4
    one = EligibilitySets.build(index, {"only": half})
    check_counts(one, [eligible_oracle(index, half)], rng)


def test_bits_per_member_is_one_and_a_half():
    index = semantic_index(4096, item_ids=False)
    sets = EligibilitySets.build(index, {"a": [1, 2], "b": np.arange(0, 4096, 7)})
    assert 1.5 <= sets.bits_per_member <= 1.5 + 64 / 4096
    assert sets.catalogue.nbytes == 0  # identity: item id = member number
    check_counts(sets, [{1, 2}, set(range(0, 4096, 7))], np.random.default_rng(0))


def test_replace_returns_a_new_object_and_leaves_the_old_one_intact():
    rng = np.random.default_rng(1)
    index = semantic_index(200)
    ids = MemberCatalogue.from_index(index).item_ids
    first = {"a": ids[:50], "b": ids[50:120], "c": ids[::3]}
    sets = EligibilitySets.build(index, first)
    refreshed = sets.replace("b", ids[100:])
    assert refreshed is not sets and refreshed.catalogue is sets.catalogue
    before = [eligible_oracle(index, v) for v in first.values()]
    check_counts(sets, before, rng)
    check_counts(refreshed, [before[0], eligible_oracle(index, ids[100:]), before[2]], rng)
    for array in (sets.words, sets.directory, refreshed.words):
        with pytest.raises(ValueError, match="read-only"):
            array[0, 0] = 1
    with pytest.raises(ValueError, match="No eligibility set 'd'"):
        sets.replace("d", [])


def test_enterable_rule_with_exclusions_matches_brute_force():
    rng = np.random.default_rng(2)
    index = semantic_index(300, seed=2)
    catalogue = MemberCatalogue.from_index(index)
    ids = catalogue.item_ids
    lists = {name: rng.choice(ids, int(rng.integers(0, 300))) for name in "xyz"}
    sets = EligibilitySets.build(index, lists)
    eligible = [eligible_oracle(index, v) for v in lists.values()]
    rows, width, slots = 40, 12, 6
    set_ids = rng.integers(0, 3, rows)
    bounds = np.sort(rng.integers(0, 301, (rows, width, 2)), axis=-1)
    lo, hi = bounds[..., 0], bounds[..., 1]
    raw = rng.choice(np.concatenate([ids, [10**9, -1, -1]]), (rows, slots))
    raw[:, -1] = raw[:, 0]  # duplicates
    excluded = catalogue.exclusion_members(raw)
    assert excluded.shape == (rows, slots) and excluded.dtype == np.int32
    got = sets.eligible_in_range(set_ids, lo, hi, excluded)
    for r in range(rows):
        gone = eligible_oracle(index, raw[r])
        assert sorted(gone) == [m for m in excluded[r].tolist() if m < index.num_members]
        assert excluded[r].tolist() == sorted(excluded[r].tolist())
        for b in range(width):
            keep = {m for m in eligible[set_ids[r]] - gone if lo[r, b] <= m < hi[r, b]}
            assert got[r, b] == len(keep)
    np.testing.assert_array_equal(sets.enterable(set_ids, lo, hi, excluded), got > 0)
    np.testing.assert_array_equal(
        sets.eligible_in_range(set_ids, lo, hi), sets.count(set_ids[:, None], lo, hi)
    )


def test_candidates_of_a_beam_step_are_enterable_exactly_when_a_member_is():
    rng = np.random.default_rng(3)
    index = semantic_index(500, seed=3)
    ids = MemberCatalogue.from_index(index).item_ids
    in_stock = rng.choice(ids, 40, replace=False)
    sets = EligibilitySets.build(index, {"stock": []}).replace("stock", in_stock)
    eligible = eligible_oracle(index, in_stock)
    below = reachable_members_by_walk(index)
    states = np.unique(index.walk(index.sequences()[:, :2]))
    row, _, target = index.edges(states)
    lo, hi = index.member_ranges(target)
    got = sets.enterable(np.zeros(target.size, np.int64), lo[:, None], hi[:, None])[:, 0]
    np.testing.assert_array_equal(got, [bool(below[s] & eligible) for s in target.tolist()])
    assert got.any() and not got.all()


def test_string_sets_use_string_positions_as_item_ids():
    from string_oracles import random_byte_vocabulary

    vocabulary = random_byte_vocabulary(0, size=40, alphabet=b"abc")
    strings = ["cab", "ab", "abc", "b", "ab"]  # the duplicate keeps item id 1
    index = _string_index(strings, vocabulary)
    sets = EligibilitySets.build(index, {"s": [0, 2, 4, 9]})
    members = sorted(set(strings))
    assert {members[m] for m in eligible_oracle(index, [0, 2, 4, 9])} == {"cab", "abc"}
    state = index.walk([[0]])  # after "a": members "ab", "abc"
    lo, hi = index.member_ranges(state)
    assert sets.count(0, lo, hi).tolist() == [1]


def test_catalogue_lookup_paths_and_exclusions():
    # A table gather (dense ids), a search (sparse ids), an id with two members.
    dense = MemberCatalogue(np.array([4, 0, 2]), 3)
    sparse = MemberCatalogue(np.array([10**15, 7, 10**12]), 3)
    shared = MemberCatalogue(np.array([5, 9, 5, 1]), 4)
    assert dense._table is not None and sparse._table is None and shared._table is None
    query = np.array([2, 4, 10**12, -3, 99, 7, 5])
    assert sorted(zip(*map(np.ndarray.tolist, dense.lookup(query)))) == [(0, 2), (1, 0)]
    assert sorted(zip(*map(np.ndarray.tolist, sparse.lookup(query)))) == [(2, 2), (5, 1)]
    assert sorted(zip(*map(np.ndarray.tolist, shared.lookup(query)))) == [(6, 0), (6, 2)]
    assert shared.exclusion_members([[5, -1], [1, 1]]).tolist() == [[0, 2], [3, 4]]
    with pytest.raises(ValueError, match="distinct excluded members, more than width=1"):
        shared.exclusion_members([[5], [1]])
    assert dense.exclusion_members(np.zeros((2, 0), np.int64)).shape == (2, 0)
    assert dense.exclusion_members([[-1, -1]], width=3).tolist() == [[3, 3, 3]]
    with pytest.raises(ValueError, match="rank 2"):
        dense.exclusion_members([1, 2])
    with pytest.raises(ValueError, match="integer item ids"):
        dense.lookup([1.5])
    sets = EligibilitySets.build(shared, {"five": [5, 5, 5]})
    assert sets.contains(0, np.arange(5)).tolist() == [True, False, True, False, False]


def test_bad_sets_get_clear_errors():
    index = semantic_index(40)
    with pytest.raises(ValueError, match="non-empty mapping"):
        EligibilitySets.build(index, {})
    with pytest.raises(ValueError, match="integer item ids"):
        EligibilitySets.build(index, {"a": [0.5]})
    sets = EligibilitySets.build(index, {"a": [5]})
    with pytest.raises(ValueError, match="must lie in"):
        sets.count(0, [0], [41])
    with pytest.raises(ValueError, match="must lie in"):
        sets.count(1, [0], [1])
    with pytest.raises(ValueError, match="distinct"):
        EligibilitySets(["a", "a"], np.zeros((2, 2), np.uint32), np.zeros((2, 2), np.uint32),
                        sets.catalogue)  # fmt: skip


def test_save_load_round_trip_binds_to_the_catalogue(tmp_path):
    index = semantic_index(100)
    ids = MemberCatalogue.from_index(index).item_ids
    sets = EligibilitySets.build(index, {"a": ids[:10], "b": ids[::2]})
    path = tmp_path / "sets.npz"
    sets.save(path)
    assert sorted(os.listdir(tmp_path)) == ["sets.npz"]  # written, then renamed
    loaded = EligibilitySets.load(path, index)
    assert loaded.names == sets.names
    np.testing.assert_array_equal(loaded.words, sets.words)
    np.testing.assert_array_equal(loaded.directory, sets.directory)
    loaded.replace("a", [])  # read-only arrays from the file are fine to replace
    other = semantic_index(100, seed=9)
    with pytest.raises(ValueError, match="another catalogue"):
        EligibilitySets.load(path, other)
    with pytest.raises(ValueError, match="holds sets over 100 members"):
        EligibilitySets.load(path, semantic_index(99))
    words = sets.words.copy()
    words[0, 0] ^= 1
    broken = EligibilitySets(sets.names, words, sets.directory.copy(), sets.catalogue)
    broken.save(path)
    with pytest.raises(ValueError, match="rank directory does not match"):
        EligibilitySets.load(path, index)
    index.save(tmp_path / "index.npz")
    with pytest.raises(ValueError, match="not a static-keras eligibility sets file"):
        EligibilitySets.load(tmp_path / "index.npz", index)


# ----------------------------------------------------------------------------
# Device kernels (keras.ops)
# ----------------------------------------------------------------------------


def kernel_cases(seed: int = 0):
    """Random sets over 1..200 members, positions at word boundaries and ends."""
    rng = np.random.default_rng(seed)
    cases = []
    for n in (1, 32, 63, 64, 200):
        catalogue = MemberCatalogue(None, n)
        lists = {"dense": rng.integers(0, n, n), "sparse": rng.integers(0, n, 3), "none": []}
        sets = EligibilitySets.build(catalogue, lists)
        edges = np.array([p for p in BOUNDARIES if p <= n] + [n - 1, n])
        pos = np.concatenate([edges, rng.integers(0, n + 1, 64)])
        set_ids = rng.integers(0, 3, pos.size)
        bounds = np.sort(rng.integers(0, n + 1, (16, 8, 2)), axis=-1)
        rows = rng.integers(0, 3, 16)
        raw = rng.integers(-1, n + 5, (16, 4))
        cases.append((sets, pos, set_ids, bounds, rows, catalogue.exclusion_members(raw)))
    return cases


_KERNEL_CHECKS = textwrap.dedent(
    """
    import sys
    import numpy as np
    import keras
    sys.path.insert(0, sys.argv[1])
    import test_eligibility as t
    from static_keras.kernels import eligibility_kernels as k

    values = np.random.default_rng(0).integers(-2**31, 2**31, 4000).astype(np.int32)
    values[:6] = [0, -1, -2**31, 2**31 - 1, 1, 2**30]
    def run(fn, *args):
        if keras.backend.backend() == "jax":
            import jax
            fn = jax.jit(fn)
        return np.asarray(keras.ops.convert_to_numpy(fn(*args)))
    got = run(k.popcount32, values)
    assert (got == np.bitwise_count(values.view(np.uint32))).all(), "popcount"
    for sets, pos, set_ids, bounds, rows, excluded in t.kernel_cases():
        arrays = sets.device_arrays()
        w, d = arrays["eligibility_words"], arrays["eligibility_directory"]
        assert (run(k.rank, w, d, set_ids, pos) == sets.rank(set_ids, pos)).all(), "rank"
        assert (run(k.contains, w, set_ids, pos) == sets.contains(set_ids, pos)).all()
        lo, hi = bounds[..., 0].astype("int32"), bounds[..., 1].astype("int32")
        want = sets.eligible_in_range(rows, lo, hi)
        assert (run(k.eligible_in_range, w, d, rows, lo, hi) == want).all(), "range"
        want = sets.eligible_in_range(rows, lo, hi, excluded)
        got = run(k.eligible_in_range, w, d, rows, lo, hi, excluded)
        assert (got == want).all(), "exclusions"
    print("kernels ok", keras.backend.backend())
    """
)


def test_kernels_match_numpy_on_the_test_backend():
    exec(compile(_KERNEL_CHECKS.replace("sys.path.insert(0, sys.argv[1])", ""), "k", "exec"), {})


def test_kernels_match_numpy_in_a_tf_graph_with_xla():
    tf = pytest.importorskip("tensorflow", reason="TF graph mode needs TensorFlow")
    import keras

    if keras.backend.backend() != "tensorflow":
        pytest.skip("the test process runs another backend")
    from static_keras.kernels import eligibility_kernels as k

    for sets, _, _, bounds, rows, excluded in kernel_cases(1):
        arrays = sets.device_arrays()
        w, d = arrays["eligibility_words"], arrays["eligibility_directory"]
        lo, hi = bounds[..., 0].astype("int32"), bounds[..., 1].astype("int32")
        want = sets.eligible_in_range(rows, lo, hi, excluded)
        for jit in (False, True):
            fn = tf.function(k.eligible_in_range, jit_compile=jit)
            np.testing.assert_array_equal(fn(w, d, rows, lo, hi, excluded).numpy(), want)


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_kernels_match_numpy_on_other_backends(backend):
    pytest.importorskip(backend, reason=f"{backend} is an optional backend")
    run_under(backend, _KERNEL_CHECKS, f"kernels ok {backend}")


@pytest.mark.parametrize("size", [0, 1, 5, 1000, (1 << 20) + 7])
@pytest.mark.parametrize("kind", ["identity", "sparse", "headroom", "repeats", "shifted"])
def test_a_served_table_is_the_catalogue_it_was_made_from(kind, size, monkeypatch):
    """`from_sorted` (what a rules job reads) keeps the table and derives the
    ids in member order only when asked: identity, fingerprint (hashed from
    the table, chunk by chunk) and lookups equal the catalogue's own, across
    chunk edges (a small chunk here), with no-item slots and repeated ids."""
    from static_keras.index import member_catalogue

    monkeypatch.setattr(member_catalogue, "_CHUNK", 1 << 10)
    rng = np.random.default_rng(size)
    ids = {
        "identity": np.arange(size),
        "sparse": 10**12 + 3 * rng.permutation(size),
        "headroom": np.where(rng.random(size) < 0.2, -1, 10**9 + rng.permutation(size)),
        "repeats": rng.integers(0, max(size // 3, 1), size) * 1000,
        "shifted": np.arange(size) + 1,
    }[kind]
    own = MemberCatalogue(ids, size)
    served = MemberCatalogue.from_sorted(*own.exclusion_table(), size)
    assert served._ids is None  # nothing in member order until asked
    assert (
        served.fingerprint == own.fingerprint == member_catalogue.catalogue_fingerprint(ids, size)
    )
    assert served._ids is None
    queries = np.concatenate([ids[: size // 2], [-1, 7 * 10**13]]).astype(np.int64)
    for got, want in zip(served.lookup(queries), own.lookup(queries)):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(served.item_ids, own.item_ids)
    assert served._identity == own._identity == np.array_equal(ids, np.arange(size))


@pytest.mark.parametrize("kind", ["identity", "dense", "sparse", "headroom", "repeats"])
@pytest.mark.parametrize("served", [False, True])
def test_carried_over_by_item_id_matches_the_oracle_across_chunks(kind, served, monkeypatch):
    """`carried_over` walks the shared items a chunk at a time (a small chunk
    here): a new member is eligible in a set exactly when its item id was
    eligible in the old catalogue, whatever the catalogues' kinds (a table
    gather, sorted ids, slots without an item, an id with several members,
    the served table as a rules job reads it)."""
    from static_keras.index import member_catalogue

    monkeypatch.setattr(member_catalogue, "_SHARED_CHUNK", 7)
    rng = np.random.default_rng(len(kind))
    size = 300

    def ids(seed):
        r = np.random.default_rng(seed)
        return {
            "identity": np.arange(size),
            "dense": r.permutation(size + 40)[:size],
            "sparse": 10**12 + 3 * r.permutation(size + 80)[:size],
            "headroom": np.where(r.random(size) < 0.2, -1, 10**9 + r.permutation(size)),
            "repeats": r.integers(0, size // 3, size) * 1000,
        }[kind]

    old_ids, new_ids = ids(1), ids(2)
    old = MemberCatalogue(old_ids, size)
    if served:
        old = MemberCatalogue.from_sorted(*old.exclusion_table(), size)
    chosen = {
        "a": rng.choice(old_ids[old_ids >= 0], size // 2),
        "b": old_ids[old_ids >= 0][:5],
    }
    sets = EligibilitySets.build(old, chosen)
    carried = sets.carried_over(MemberCatalogue(new_ids, size))
    for name, eligible in chosen.items():
        expected = np.isin(new_ids, eligible) & (new_ids >= 0)
        got = carried.contains(carried.set_id(name), np.arange(size))
        np.testing.assert_array_equal(got, expected)
    assert carried.sizes() == {name: int(np.isin(new_ids, c).sum()) for name, c in chosen.items()}


def test_shared_member_chunks_refuses_a_bad_chunk_or_catalogue():
    catalogue = MemberCatalogue(np.array([10**12, 5, 7]), 3)
    for chunk in (0, -4, 2.5, True):
        with pytest.raises(ValueError, match=r"`chunk` must be a positive int.*chunk="):
            list(catalogue.shared_member_chunks(catalogue, chunk=chunk))
    with pytest.raises(TypeError, match="`other` must be a MemberCatalogue"):
        list(catalogue.shared_member_chunks(np.array([5, 7])))


def test_a_table_out_of_order_is_refused():
    with pytest.raises(ValueError, match="sorted ascending"):
        MemberCatalogue.from_sorted(np.array([1, 3, 2, 4]), np.arange(4), 4)
