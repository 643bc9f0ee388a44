"""Live eligibility in Python serving: the registry and per-request subsets.

- `ConstraintIndexRegistry`: not-ready errors, versions, unknown sets, and
  readers under load that only ever see a published version (threads);
- `StringLogitsProcessor` with `set_ids` / `excluded_item_ids` /
  `excluded_members` against a brute-force oracle over the member strings
  (which members are eligible and not excluded, which token prefixes can
  still spell one of them), on random string sets and small vocabularies,
  with and without every single byte (`member_ranges_exact` True / False),
  plus the edges (empty set, all excluded, duplicates, unknown ids, bad set
  ids, bad dtypes).
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time

import numpy as np
import pytest
from string_oracles import Oracle
from string_oracles import explore
from string_oracles import random_byte_vocabulary

from static_keras.constants import MASKED_LOGIT
from static_keras.index import StaticIndex
from static_keras.index.eligibility import EligibilitySets
from static_keras.serving.registry import ConstraintIndexRegistry
from static_keras.serving.registry import IndexNotReadyError
from static_keras.serving.registry import UnknownSetError
from static_keras.strings import StringIndex
from static_keras.strings import StringLogitsProcessor
from static_keras.strings import TokenVocabulary

# ----------------------------------------------------------------------------
# Registry
# ----------------------------------------------------------------------------


def _static_index(num_members: int = 300, seed: int = 0) -> StaticIndex:
    rng = np.random.default_rng(seed)
    codes = np.unique(rng.integers(0, 16, (num_members, 3)), axis=0)
    ids = rng.permutation(10 * len(codes))[: len(codes)] + 1000
    return StaticIndex.build(codes, vocab_size=16, item_ids=ids)


def _item_ids(index) -> np.ndarray:
    first = index.layout.first_member_state
    return index.item_ids(np.arange(first, index.layout.state_space))


def test_reads_before_the_first_load_raise_not_ready():
    registry = ConstraintIndexRegistry()
    assert not registry.ready and "not ready" in repr(registry)
    reads = [
        registry.snapshot,
        lambda: registry.version,
        lambda: registry.index,
        lambda: registry.eligibility,
        lambda: registry.set_id("in_stock"),
        lambda: registry.refresh_eligibility("in_stock", [1]),
        lambda: registry.replace_index(_static_index(), None),
        lambda: registry.wait_until_ready(timeout=0.01),
    ]
    for read in reads:
        with pytest.raises(IndexNotReadyError, match=r"load\(index, eligibility\)"):
            read()
    assert issubclass(IndexNotReadyError, RuntimeError)


def test_versions_increase_with_every_publication():
    index = _static_index()
    ids = _item_ids(index)
    registry = ConstraintIndexRegistry()
    first = registry.load(index, {"in_stock": ids[:10], "fr": ids})
    assert registry.ready and first.version == registry.version == 1
    assert registry.refresh_eligibility("in_stock", ids[:5]).version == 2
    both = registry.refresh_sets({"in_stock": ids[:3], "fr": ids[:4]})
    assert both.version == 3 and both.eligibility.sizes() == {"in_stock": 3, "fr": 4}
    assert registry.replace_index(index, both.eligible_item_ids()).version == 4
    assert registry.load(index, version=10).version == 10
    for bad in (10, 3, True, 11.0, "12"):
        with pytest.raises(ValueError, match="version"):
            registry.load(index, version=bad)
    assert registry.version == 10
    assert registry.refresh_sets.__doc__ and "ConstraintIndexRegistry(version=10" in repr(registry)


def test_snapshots_are_immutable_and_outlive_refreshes():
    index = _static_index()
    ids = _item_ids(index)
    registry = ConstraintIndexRegistry()
    registry.load(index, {"in_stock": ids[:10]})
    held = registry.snapshot()
    words = held.eligibility.words.copy()
    registry.refresh_eligibility("in_stock", ids[10:])
    np.testing.assert_array_equal(held.eligibility.words, words)
    assert held.eligibility.sizes() == {"in_stock": 10}
    assert registry.snapshot().eligibility.sizes() == {"in_stock": len(ids) - 10}
    with pytest.raises(dataclasses.FrozenInstanceError):
        held.version = 7
    with pytest.raises(ValueError):
        held.eligibility.words[0, 0] = 1


def test_unknown_set_names_name_the_known_sets():
    index = _static_index()
    registry = ConstraintIndexRegistry()
    registry.load(index, {"in_stock": [], "fr": []})
    for call in (
        lambda: registry.refresh_eligibility("de", [1]),
        lambda: registry.refresh_sets({"fr": [1], "de": [2]}),
        lambda: registry.set_id("de"),
    ):
        with pytest.raises(UnknownSetError, match=r"'de'; known sets: \['in_stock', 'fr'\]"):
            call()
    assert issubclass(UnknownSetError, KeyError) and issubclass(UnknownSetError, ValueError)
    assert registry.version == 1  # a failed refresh publishes nothing (not even "fr")
    assert registry.set_id("fr") == 1
    registry.load(index)  # no sets
    with pytest.raises(UnknownSetError, match="holds no sets"):
        registry.refresh_eligibility("fr", [1])
    with pytest.raises(ValueError, match="non-empty mapping"):
        registry.refresh_sets({})


def test_load_checks_its_arguments():
    index, other = _static_index(seed=0), _static_index(seed=1)
    registry = ConstraintIndexRegistry()
    with pytest.raises(ValueError, match="TokenAutomaton"):
        registry.load(np.zeros(3))
    with pytest.raises(ValueError, match="another index"):
        registry.load(index, EligibilitySets.build(other, {"s": [1]}))
    with pytest.raises(ValueError, match="EligibilitySets, a mapping"):
        registry.load(index, [1, 2])
    assert not registry.ready
    sets = EligibilitySets.build(index, {"s": _item_ids(index)[:2]})
    assert registry.load(index, sets).eligibility is sets


def test_replace_index_carries_sets_over_by_item_id():
    old = _static_index(seed=0)
    ids = _item_ids(old)
    registry = ConstraintIndexRegistry()
    registry.load(old, {"in_stock": ids[::3]})
    # A rebuilt index with half the items and some new ones (new member numbers).
    new_ids = np.concatenate([ids[::2], np.arange(10) + 10**6])
    codes = np.unique(np.random.default_rng(5).integers(0, 16, (new_ids.size * 2, 3)), axis=0)
    new = StaticIndex.build(codes[: new_ids.size], vocab_size=16, item_ids=new_ids)
    carried = registry.replace_index(new, registry.snapshot().eligible_item_ids())
    assert carried.index is new and carried.version == 2
    expected = np.sort(np.intersect1d(ids[::3], new_ids))
    np.testing.assert_array_equal(carried.eligible_item_ids()["in_stock"], expected)


def test_wait_until_ready_returns_once_loaded():
    registry = ConstraintIndexRegistry()
    got = []
    waiter = threading.Thread(target=lambda: got.append(registry.wait_until_ready(5).version))
    waiter.start()
    time.sleep(0.02)
    registry.load(_static_index())
    waiter.join(5)
    assert got == [1]


def test_readers_under_load_see_exactly_one_published_version():
    index = _static_index(num_members=2000)
    ids = _item_ids(index)
    rng = np.random.default_rng(3)
    refreshes = 50
    lists = [rng.choice(ids, int(rng.integers(0, ids.size)), replace=False) for _ in range(51)]
    lists[7] = np.zeros(0, np.int64)  # one empty version
    other = ids[::5]
    expected = {}  # version -> the exact arrays of that version
    for v, chosen in enumerate(lists, start=1):
        sets = EligibilitySets.build(index, {"in_stock": chosen, "fr": other})
        expected[v] = (sets.words.copy(), sets.directory.copy(), len(np.unique(chosen)))

    registry = ConstraintIndexRegistry()
    registry.load(index, {"in_stock": lists[0], "fr": other})
    done = threading.Event()
    errors, seen = [], [set() for _ in range(4)]

    def reader(slot: int):
        last = 0
        try:
            while not done.is_set():
                snap = registry.snapshot()
                words, directory, size = expected[snap.version]
                assert snap.version >= last, (snap.version, last)
                last = snap.version
                np.testing.assert_array_equal(snap.eligibility.words, words)
                np.testing.assert_array_equal(snap.eligibility.directory, directory)
                row = snap.set_id("in_stock")
                assert snap.eligibility.count(row, 0, index.num_members) == size
                seen[slot].add(snap.version)
        except Exception as error:  # reported below, with the thread's version
            errors.append(error)

    def writer():
        try:
            for i in range(1, refreshes + 1):
                snap = registry.refresh_eligibility("in_stock", lists[i])
                assert snap.version == i + 1
                time.sleep(0.0005)
        except Exception as error:
            errors.append(error)
        finally:
            done.set()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        threads = [threading.Thread(target=reader, args=(k,)) for k in range(4)]
        threads.append(threading.Thread(target=writer))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        sys.setswitchinterval(interval)
    assert not errors, errors
    assert registry.version == refreshes + 1
    assert all(seen), "every reader read"
    assert len(set().union(*seen)) > 2, "readers saw the versions change"


def test_snapshot_makes_a_logits_processor_for_string_indexes():
    vocabulary = random_byte_vocabulary(0, size=20, alphabet=b"abc")
    index = StringIndex.from_strings(["ab", "ba", "cab"], vocabulary)
    registry = ConstraintIndexRegistry()
    registry.load(index, {"s": [2]})
    processor = registry.snapshot().logits_processor()
    assert processor.eligibility is registry.eligibility
    allowed = processor.allowed([0], set_ids=[0])[0]
    assert {vocabulary.token_bytes[t][:1] for t in np.flatnonzero(allowed)} == {b"c"}
    registry.load(_static_index())
    with pytest.raises(ValueError, match="needs a StringIndex"):
        registry.snapshot().logits_processor()


# ----------------------------------------------------------------------------
# Per-request subsets: brute-force oracle
# ----------------------------------------------------------------------------


def _members(strings) -> list[bytes]:
    """Distinct member strings in member-number order (sorted bytes)."""
    return sorted({s.encode() if isinstance(s, str) else s for s in strings})


def _first_positions(strings) -> dict[bytes, int]:
    out = {}
    for i, s in enumerate(strings):
        out.setdefault(s.encode() if isinstance(s, str) else s, i)
    return out


def eligible_strings(strings, sets, set_id, excluded_ids, excluded_members) -> set[bytes]:
    """Members whose item id (first position) is in the row's set and that
    are not excluded (by item id or member number)."""
    first = _first_positions(strings)
    members = _members(strings)
    names = list(sets)
    if set_id < 0:
        pool = set(members)
    else:
        chosen = set(int(i) for i in sets[names[set_id]])
        pool = {m for m in members if first[m] in chosen}
    out_ids = {int(i) for i in excluded_ids if i >= 0}
    pool -= {m for m in members if first[m] in out_ids}
    pool -= {members[int(m)] for m in excluded_members if m >= 0}
    return pool


def oracle_allowed(oracle: Oracle, prefix: bytes, pool: set[bytes]) -> set[int]:
    """Tokens t such that prefix + t can still be completed into a pool member
    (its remaining bytes spellable by some token sequence); EOS iff prefix is one."""
    out = set()
    for token, data in oracle.tokens:
        q = prefix + data
        if any(m.startswith(q) and oracle.spellable(m[len(q) :]) for m in pool):
            out.add(int(token))
    if prefix in pool:
        out.add(oracle.eos)
    return out


def _random_strings(rng, alphabet: bytes, count: int) -> list[bytes]:
    lengths = rng.integers(1, 6, count)
    strings = [bytes(rng.choice(list(alphabet), int(n)).tolist()) for n in lengths]
    return strings + [strings[0], strings[3]]  # duplicates: later positions name no member


def _missing_byte_vocabulary(seed: int) -> TokenVocabulary:
    """Single bytes a, b and d only; c comes inside multi-byte tokens ("ac")."""
    rng = np.random.default_rng(seed)
    tokens = [b"a", b"b", b"d", b"ac"]
    seen = set(tokens)
    while len(tokens) < 24:
        token = bytes(rng.choice(list(b"abcd"), int(rng.integers(2, 4))).tolist())
        if token not in seen:
            seen.add(token)
            tokens.append(token)
    tokens.append(b"</s>")
    return TokenVocabulary.from_token_bytes(tokens, special=[24], eos_token_id=24)


def _case(seed: int, exact: bool):
    rng = np.random.default_rng(seed)
    if exact:
        vocabulary = random_byte_vocabulary(seed, size=30, alphabet=b"abc", max_len=3)
        strings = _random_strings(rng, b"abc", 18)
    else:
        vocabulary = _missing_byte_vocabulary(seed)
        spell = Oracle([b"x"], vocabulary, vocabulary.eos_token_id)
        # "ab", "ac", "ad": "ac" is not spelled from the node after "a" (a hole).
        spelled = [s for s in _random_strings(rng, b"abcd", 40) if spell.spellable(s)]
        strings = [b"ab", b"ac", b"ad"] + spelled[:15]
    index = StringIndex.from_strings(strings, vocabulary)
    n = len(strings)
    sets = {
        "some": rng.choice(n + 5, n // 2, replace=False).tolist() + [999, 10**12],
        "few": rng.choice(n, 3, replace=False).tolist(),
        "empty": [],
    }
    return vocabulary, strings, index, sets


def _rows(index, vocabulary, strings, rng, per_state: int = 5):
    """(states, prefixes, set_ids, excluded item ids, excluded members) of
    every reachable state under a few random restrictions each."""
    states, prefixes = [], []
    for state, prefix, _ in explore(index, vocabulary):
        for _ in range(per_state):
            states.append(state)
            prefixes.append(prefix)
    rows = len(states)
    set_ids = rng.choice([-1, 0, 1, 2], rows, p=[0.4, 0.35, 0.15, 0.1])
    width = 3
    excluded = rng.integers(-1, len(strings) + 3, (rows, width))
    excluded[::4, 1] = excluded[::4, 0]  # duplicates
    excluded[1::5, :] = -1
    members = rng.integers(-1, index.num_members, (rows, 2))
    members[::3] = -1
    return np.array(states), prefixes, set_ids, excluded, members


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("exact", [True, False], ids=["exact", "inexact"])
def test_restricted_queries_match_the_brute_force_oracle(seed, exact):
    vocabulary, strings, index, sets = _case(seed, exact)
    assert index.member_ranges_exact == exact
    rng = np.random.default_rng(100 + seed)
    eligibility = EligibilitySets.build(index, sets)
    processor = StringLogitsProcessor(index, eligibility=eligibility)
    states, prefixes, set_ids, excluded, members = _rows(index, vocabulary, strings, rng)
    kwargs = dict(set_ids=set_ids, excluded_item_ids=excluded, excluded_members=members)
    allowed = processor.allowed(states, **kwargs)
    unrestricted = processor.allowed(states)
    oracle = Oracle(strings, vocabulary, vocabulary.eos_token_id)
    eos = vocabulary.eos_token_id
    for r, prefix in enumerate(prefixes):
        pool = eligible_strings(strings, sets, set_ids[r], excluded[r], members[r])
        want = oracle_allowed(oracle, prefix, pool)
        got = set(np.flatnonzero(allowed[r]).tolist())
        if exact:
            assert got == want, (r, prefix, pool)
        else:  # a covering range: never less, never outside the index, EOS exact
            assert want <= got <= set(np.flatnonzero(unrestricted[r]).tolist()), (r, prefix)
            assert (eos in got) == (eos in want)

    # Every query agrees with `allowed`.
    logits = rng.normal(size=allowed.shape).astype(np.float32)
    masked = processor.mask_logits(logits, states, **kwargs)
    np.testing.assert_array_equal(masked, np.where(allowed, logits, np.float32(MASKED_LOGIT)))
    bits = processor.fill_bitmask(states, **kwargs)
    unpacked = np.unpackbits(bits.view(np.uint8), axis=1, bitorder="little")
    np.testing.assert_array_equal(unpacked[:, : index.vocab_size].astype(bool), allowed)
    buffer = np.full((states.size + 2, bits.shape[1]), -1, np.int32)
    assert processor.fill_bitmask(states, buffer, **kwargs) is buffer
    np.testing.assert_array_equal(buffer[: states.size], bits)
    scores, tokens, nxt = processor.candidates(logits, states, **kwargs)
    for r in range(states.size):
        valid = tokens[r] >= 0
        assert set(tokens[r][valid].tolist()) == set(np.flatnonzero(allowed[r]).tolist())
        assert np.all(np.diff(scores[r][valid]) <= 0) and np.all(scores[r][~valid] == -np.inf)
    top = processor.candidates(logits, states, top_k=2, **kwargs)
    np.testing.assert_array_equal(top[1], tokens[:, :2])
    # advance: -1 exactly where the index allows the token but the subset does not.
    row, edge_tokens, _ = index.edges(states)
    moved = processor.advance(states[row], edge_tokens, **_take(kwargs, row))
    np.testing.assert_array_equal(moved >= 0, allowed[row, edge_tokens])
    assert moved.dtype == processor.advance(states[row], edge_tokens).dtype


def _take(kwargs, rows):
    return {name: np.asarray(value)[rows] for name, value in kwargs.items()}


@pytest.mark.parametrize("exact", [True, False], ids=["exact", "inexact"])
def test_restricted_decoding_finishes_only_on_eligible_members(exact):
    vocabulary, strings, index, sets = _case(7, exact)
    eligibility = EligibilitySets.build(index, sets)
    processor = StringLogitsProcessor(index, eligibility)
    rng = np.random.default_rng(8)
    rows = 120
    set_ids = rng.integers(-1, 3, rows)
    excluded = rng.integers(-1, len(strings), (rows, 3))
    states = processor.initial_states(rows)
    kwargs = dict(set_ids=set_ids, excluded_item_ids=excluded)
    dead = ~processor.allowed(states, **kwargs).any(axis=1)  # nothing left at all
    for _ in range(index.length):
        live = ~processor.is_finished(states) & (states >= 0)
        if not live.any():
            break
        logits = processor.mask_logits(rng.normal(size=(rows, index.vocab_size)), states, **kwargs)
        tokens = np.where(live, logits.argmax(axis=1), 0)
        states = np.where(live, processor.advance(states, tokens, **kwargs), states)
    first = _first_positions(strings)
    finished = processor.is_finished(states)
    for r in range(rows):
        pool = eligible_strings(strings, sets, set_ids[r], excluded[r], [])
        if finished[r]:
            item = int(processor.item_ids(states[r : r + 1])[0])
            assert first[index.string_bytes(item)] == item
            assert index.string_bytes(item) in pool, (r, item)
        elif exact:
            assert dead[r] and not pool, r  # with exact ranges, only empty rows fail
    assert finished.sum() > rows // 2


def test_inexact_ranges_can_enter_a_dead_end_but_never_finish_wrong():
    # No token "c": from the state after "a", "ab" and "ad" are reachable but
    # "ac" (spelled only by the token "ac" from the root) is not; the state's
    # range [0, 3) still covers it.
    tokens = [b"a", b"b", b"d", b"ac", b"<eos>"]
    vocabulary = TokenVocabulary.from_token_bytes(tokens, special=[4], eos_token_id=4)
    index = StringIndex.from_strings(["ab", "ac", "ad"], vocabulary)
    assert not index.member_ranges_exact
    processor = StringLogitsProcessor(index, EligibilitySets.build(index, {"ac": [1]}))
    root = processor.allowed([0], set_ids=[0])[0]
    assert np.flatnonzero(root).tolist() == [0, 3]  # "a" (a dead end) and "ac"
    after_a = processor.advance([0], [0], set_ids=[0])
    assert after_a[0] >= 0 and not processor.allowed(after_a, set_ids=[0]).any()
    after_ac = processor.advance([0], [3], set_ids=[0])
    assert processor.allowed(after_ac, set_ids=[0])[0].tolist() == [0, 0, 0, 0, 1]


# ----------------------------------------------------------------------------
# Per-request subsets: edges and errors
# ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small():
    vocabulary = random_byte_vocabulary(4, size=16, alphabet=b"abc", max_len=3)
    strings = ["ab", "abc", "b", "ca", "cab", "ab"]  # item 5 repeats item 0
    index = StringIndex.from_strings(strings, vocabulary)
    sets = EligibilitySets.build(index, {"all": range(6), "b": [2], "empty": []})
    return vocabulary, strings, index, StringLogitsProcessor(index, eligibility=sets)


def _nothing_allowed(processor, rows, **kwargs):
    states = processor.initial_states(rows)
    logits = np.zeros((rows, processor.vocab_size), np.float32)
    assert not processor.allowed(states, **kwargs).any()
    assert np.all(processor.mask_logits(logits, states, **kwargs) == np.float32(MASKED_LOGIT))
    assert not processor.fill_bitmask(states, **kwargs).any()
    scores, tokens, nxt = processor.candidates(logits, states, **kwargs)
    assert np.all(tokens == -1) and np.all(nxt == -1) and np.all(scores == -np.inf)
    assert np.all(processor.advance(states, np.zeros(rows, np.int32), **kwargs) == -1)


def test_an_empty_set_and_everything_excluded_allow_nothing(small):
    _, strings, index, processor = small
    _nothing_allowed(processor, 2, set_ids=[2, 2])
    _nothing_allowed(processor, 2, excluded_item_ids=[[0, 1, 2, 3, 4], [4, 3, 2, 1, 0]])
    _nothing_allowed(processor, 1, excluded_members=[np.arange(index.num_members)])
    _nothing_allowed(processor, 1, set_ids=[1], excluded_item_ids=[[2]])  # the set's one member
    # Item 5 is a repeat of "ab": it names no member, so "ab" stays.
    kept = processor.allowed([0], excluded_item_ids=[[0, 1, 2, 3, 4, 5][:4] + [5]])
    assert kept.any()


def test_duplicates_and_unknown_ids_in_exclusions_are_ignored(small):
    vocabulary, _, index, processor = small
    state = index.walk([[vocabulary.token_bytes.index(b"a")]])  # below: "ab", "abc"
    plain = processor.allowed(state, excluded_item_ids=[[0]])
    for excluded in ([[0, 0, 0, -1]], [[0, 999, -7, 10**15]], [[-1, 0, 0, 5]]):
        np.testing.assert_array_equal(processor.allowed(state, excluded_item_ids=excluded), plain)
    member_of_ab = 0  # "ab" sorts first
    np.testing.assert_array_equal(
        processor.allowed(state, excluded_members=[[member_of_ab, member_of_ab, -1]]), plain
    )
    assert plain.any()  # "abc" is left
    both = processor.allowed(state, excluded_item_ids=[[0]], excluded_members=[[1]])
    assert not both.any()  # "ab" by item id, "abc" by member number
    empty = processor.allowed(state, excluded_item_ids=np.zeros((1, 0), np.int64))
    np.testing.assert_array_equal(empty, processor.allowed(state))


def test_unrestricted_calls_are_unchanged(small):
    vocabulary, _, index, processor = small
    states = np.array([0, 1, 2, -1, 10**6])
    np.testing.assert_array_equal(processor.allowed(states), index.allowed_tokens(states))
    np.testing.assert_array_equal(
        processor.allowed(states, set_ids=-1), index.allowed_tokens(states)
    )
    np.testing.assert_array_equal(
        processor.allowed(states, set_ids=[None, -1, None, -1, None]), processor.allowed(states)
    )
    np.testing.assert_array_equal(
        processor.allowed(states, set_ids=[0] * 5), processor.allowed(states)
    )
    plain = StringLogitsProcessor(index)  # backwards compatible: no sets
    assert plain.eligibility is None
    np.testing.assert_array_equal(plain.fill_bitmask(states), processor.fill_bitmask(states))
    token_b = vocabulary.token_bytes.index(b"b")  # leads to member "b" (item 2) only
    assert plain.allowed([0])[0, token_b]
    assert not plain.allowed([0], excluded_item_ids=[[2]])[0, token_b]  # exclusions need no sets


def test_bad_restrictions_get_clear_errors(small):
    vocabulary, _, index, processor = small
    states = processor.initial_states(2)
    with pytest.raises(ValueError, match=r"`set_ids` must lie in \[-1, 3\).*'all', 'b', 'empty'"):
        processor.allowed(states, set_ids=[0, 3])
    with pytest.raises(ValueError, match=r"\[-1, 3\)"):
        processor.mask_logits(np.zeros((2, index.vocab_size)), states, set_ids=[-2, 0])
    with pytest.raises(ValueError, match="needs eligibility sets"):
        StringLogitsProcessor(index).allowed(states, set_ids=[0, 0])
    with pytest.raises(ValueError, match="`set_ids` must hold integers"):
        processor.allowed(states, set_ids=[0.0, 1.0])
    with pytest.raises(ValueError, match="`set_ids` must hold integers"):
        processor.fill_bitmask(states, set_ids=np.array([True, False]))
    with pytest.raises(ValueError, match=r"`set_ids` must have shape \(2,\)"):
        processor.candidates(np.zeros((2, index.vocab_size)), states, set_ids=[0, 0, 0])
    with pytest.raises(ValueError, match="`excluded_item_ids` must hold integers"):
        processor.allowed(states, excluded_item_ids=[[0.5], [1.0]])
    with pytest.raises(ValueError, match=r"`excluded_item_ids` must have shape \(2, E\)"):
        processor.allowed(states, excluded_item_ids=[0, 1])
    with pytest.raises(ValueError, match=r"`excluded_members` must lie in \[0, 5\)"):
        processor.advance(states, [0, 0], excluded_members=[[5], [0]])
    with pytest.raises(ValueError, match="`excluded_members` must hold integers"):
        processor.allowed(states, excluded_members=[["a"], ["b"]])
    with pytest.raises(ValueError, match="`states` must hold integers"):
        processor.allowed([0.5], set_ids=[0])
    other = StringIndex.from_strings(["ab", "b"], vocabulary)
    with pytest.raises(ValueError, match="another index"):
        StringLogitsProcessor(index, EligibilitySets.build(other, {"s": [0]}))
    with pytest.raises(ValueError, match="must be EligibilitySets"):
        StringLogitsProcessor(index, {"s": [0]})
