"""Eligibility-aware decoding steps and beam search against brute force.

- device member ranges (`layer.member_ranges`) against the host
  `member_ranges` at every state, static and mixed depths, both kinds;
- the candidates of a step with eligibility (and the mask-mode allowed
  tokens) against the host enterable rule over each allowed token's next
  state, every step, static and tensor steps;
- beam search with per-row set ids and exclusions against exhaustive ranking
  of exactly the eligible, non-excluded members (beam >= their number), and
  every result eligible with no padding while eligible results exist (beam
  smaller), every dense depth, both kinds, and the edge cases: empty set,
  all excluded, duplicate and unknown excluded ids, -1 = no set.
"""

from __future__ import annotations

import os
import textwrap

import keras
import numpy as np
import pytest
from backend_subprocess import run_under
from decoding_oracles import exhaustive_ranking
from decoding_oracles import prefix_logits
from decoding_oracles import random_table
from keras import ops

from static_keras import ConstrainedBeamSearch
from static_keras import ConstrainedDecoding
from static_keras import Eligibility
from static_keras import StaticIndex
from static_keras import beam_search
from static_keras import constraint_for
from static_keras.index.eligibility import EligibilitySets
from static_keras.index.eligibility import MemberCatalogue

VOCAB, LENGTH = 4, 3


def semantic_index(dense_levels: int, seed: int = 0, n: int = 30) -> StaticIndex:
    rng = np.random.default_rng(seed)
    rows = np.unique(rng.integers(0, VOCAB, (n, LENGTH)), axis=0)
    rows = rows[rng.permutation(len(rows))]
    return StaticIndex.build(
        rows, VOCAB, dense_levels=dense_levels, item_ids=100 + np.arange(len(rows))
    )


def random_sets(index, seed: int) -> EligibilitySets:
    rng = np.random.default_rng(seed)
    ids = 100 + np.arange(index.num_members)
    return EligibilitySets.build(
        index,
        {
            "half": rng.choice(ids, ids.size // 2, replace=False),
            "few": rng.choice(ids, 3, replace=False),
            "empty": [],
            "all": np.concatenate([ids, [5, 99999]]),  # ids outside the catalogue too
        },
    )


def requests(index, sets: EligibilitySets):
    """Per batch row `(set_ids [B], excluded item ids [B, E])`: the edges."""
    half = np.flatnonzero(sets.contains(sets.set_id("half"), np.arange(index.num_members)))
    few = np.flatnonzero(sets.contains(sets.set_id("few"), np.arange(index.num_members)))
    excluded = np.full((7, 5), -1, np.int64)
    excluded[1, :3] = 100 + np.r_[half[:2], half[0]]  # a duplicate id
    excluded[2, :2] = [7, 123456]  # ids not in the catalogue
    excluded[3, :3] = 100 + few  # every member of the set
    excluded[4, :2] = [100, 101]  # no set: plain exclusion
    set_ids = np.array(
        [sets.set_id(n) for n in ("half", "half", "few", "few")] + [-1, sets.set_id("empty"), -1]
    )
    return set_ids.astype(np.int32), excluded


def eligible_layer(dense_levels: int, seed: int, sets_seed: int):
    """`(index, sets, layer, catalogue, set_ids, excluded_ids)`: a layer with
    the `random_sets` of a `semantic_index` and the edge-case `requests`."""
    index = semantic_index(dense_levels, seed=seed)
    sets = random_sets(index, sets_seed)
    layer = ConstrainedDecoding(index, eligibility=sets)
    set_ids, excluded_ids = requests(index, sets)
    return index, sets, layer, MemberCatalogue.from_index(index), set_ids, excluded_ids


def eligible_members(sets, catalogue, set_id: int, excluded_ids) -> np.ndarray:
    members = np.arange(catalogue.num_members)
    keep = np.ones(members.size, bool) if set_id < 0 else sets.contains(set_id, members)
    keep[catalogue.members(excluded_ids[excluded_ids >= 0])] = False
    return members[keep]


# Device member ranges -------------------------------------------------------


@pytest.mark.parametrize("dense_levels", range(LENGTH + 1))
def test_semantic_member_ranges_match_the_host_at_every_state(dense_levels):
    index = semantic_index(dense_levels)
    layer = ConstrainedDecoding(index, eligibility=random_sets(index, 0))
    states = np.arange(-2, index.layout.state_space + 3)
    for got, want in zip(layer.member_ranges(states), index.member_ranges(states)):
        np.testing.assert_array_equal(np.asarray(got), want)
    starts = list(index.layout.depth_starts) + [index.layout.state_space]
    for depth in range(LENGTH + 1):
        states = np.arange(starts[depth] - 1, starts[depth + 1] + 1)  # a neighbour each side
        inside = (states >= starts[depth]) & (states < starts[depth + 1])
        lo, hi = (np.asarray(x) for x in layer.member_ranges(states, depth=depth))
        want_lo, want_hi = index.member_ranges(states)
        np.testing.assert_array_equal(lo, np.where(inside, want_lo, 0))
        np.testing.assert_array_equal(hi, np.where(inside, want_hi, 0))


@pytest.mark.parametrize("dense_levels", [0, 2])
def test_member_starts_bound_abutting_ranges_and_dead_rows_keep_nothing(dense_levels):
    """`tree_member_starts` at every state of each tail depth and one past
    its end, and the sparse step's K + 1 bounds (`keep_mask_between`) against
    the two-ended `keep_mask` for rows with an edge each and a dead row."""
    from static_keras.kernels import member_ranges

    index = semantic_index(dense_levels)
    sets = random_sets(index, 0)
    layer = ConstrainedDecoding(index, eligibility=sets)
    layout = index.layout
    for depth in range(dense_levels, LENGTH + 1):
        start = layout.depth_starts[depth]
        states = np.arange(start, start + layout.level_sizes[depth] + 1)
        got = member_ranges.tree_member_starts(layout, layer.index_weights["indptr"], states, depth)
        want = np.r_[index.member_ranges(states[:-1])[0], layout.num_members]
        np.testing.assert_array_equal(ops.convert_to_numpy(got), want)
    catalogue = MemberCatalogue.from_index(index)
    set_ids, excluded_ids = requests(index, sets)
    request = layer.check_eligibility(
        Eligibility(set_ids, catalogue.exclusion_members(excluded_ids))
    )
    sequences = index.sequences()
    for step in range(dense_levels, LENGTH):
        states = index.walk(np.unique(sequences[:, :step], axis=0)).astype(np.int32)
        rows = np.resize(states, set_ids.size)
        rows[-1] = -1  # a dead beam
        edges, ok = layer.sparse_step.slots(rows, step)
        between = np.asarray(layer._sparse_keep(request, edges, step))
        lo, hi = layer.member_ranges(layer.transitions.edge_targets(edges), step + 1)
        both = np.asarray(layer.eligibility_filter.keep(request, lo, hi))
        ok = np.asarray(ok)
        np.testing.assert_array_equal(between[ok], both[ok])
        assert not ok[-1].any()


@pytest.mark.parametrize("vocab, dense_levels", [(5, 1), (5, 2), (3, 3), (4, 2)])
def test_dense_codes_of_members_are_their_first_tokens(vocab, dense_levels):
    """Each excluded member's dense code (one gather of `dense_member_codes`),
    with a vocabulary that is not a power of two and codes with no member."""
    from static_keras.kernels import dense_exclusions

    rng = np.random.default_rng(vocab + dense_levels)
    rows = np.unique(rng.integers(0, vocab, (40, 4)), axis=0)
    index = StaticIndex.build(rows, vocab, dense_levels=dense_levels, item_ids=np.arange(len(rows)))
    layer = ConstrainedDecoding(index, eligibility_sets=1)
    member_codes = layer.member_range_weights["dense_member_codes"]
    members = np.concatenate([np.arange(len(rows)), [len(rows), 2**31 - 1]]).astype("int32")
    real = members < len(rows)
    got = dense_exclusions.dense_codes(member_codes, members[None, :], real[None, :])
    want = rows[:, :dense_levels] @ (vocab ** np.arange(dense_levels)[::-1])  # rows are sorted
    np.testing.assert_array_equal(ops.convert_to_numpy(got)[0], np.r_[want, -1, -1])


def test_floor_division_by_a_power_of_two_is_a_shift_and_equals_numpy():
    from static_keras.kernels import dense_exclusions

    x = np.array([-(2**31), -4097, -2049, -2048, -1, 0, 1, 2047, 2048, 2**31 - 1], np.int32)
    for divisor in (1, 2, 5, 2048, 2**30):
        got = ops.convert_to_numpy(
            dense_exclusions._floor_divide(ops.convert_to_tensor(x), divisor)
        )
        np.testing.assert_array_equal(got, x // divisor)


@pytest.mark.parametrize("vocab", [5, 64, 70])
def test_grouped_blocked_words_equal_each_rows_own(vocab):
    """A beam search's exclusions stay one row per batch row; the dense step
    clears the same bits as with every beam's own copy (dead beams: -1)."""
    from static_keras.kernels import dense_exclusions

    rng = np.random.default_rng(vocab)
    groups, group, mask_words = 3, 4, -(-vocab // 32)
    parent = np.stack([rng.permutation(vocab)[:group] for _ in range(groups)])
    parent[1, 2] = -1
    codes = rng.integers(0, vocab * vocab, (groups, 9))
    codes[:, :group] = parent * vocab + rng.integers(0, vocab, (groups, group))  # hits
    codes = np.sort(np.where(codes < 0, 0, codes), axis=1)
    blocked = np.where(np.diff(codes, axis=1, prepend=-1) > 0, codes, -1).astype("int32")
    blocked[0, -2:] = -1
    parent = parent.reshape(-1).astype("int32")
    own = dense_exclusions.blocked_words(np.repeat(blocked, group, axis=0), parent, vocab,
                                         mask_words)  # fmt: skip
    grouped = dense_exclusions.grouped_blocked_words(blocked, parent, group, vocab, mask_words)
    np.testing.assert_array_equal(ops.convert_to_numpy(grouped), ops.convert_to_numpy(own))
    assert ops.convert_to_numpy(own).any()


def test_string_member_ranges_match_the_host(tiny):
    vocab, members, index = tiny
    layer = constraint_for(index)
    sets = EligibilitySets.build(index, {"x": [0, 2]})
    layer = type(layer)(index, eligibility=sets)
    states = np.arange(-2, index.num_states + 2)
    for got, want in zip(layer.member_ranges(states), index.member_ranges(states)):
        np.testing.assert_array_equal(np.asarray(got), want)


# One step ---------------------------------------------------------------------


@pytest.mark.parametrize("dense_levels", range(LENGTH + 1))
def test_candidates_keep_exactly_the_enterable_next_states(dense_levels):
    index, sets, layer, catalogue, set_ids, excluded_ids = eligible_layer(dense_levels, 1, 1)
    sequences = index.sequences()
    rng = np.random.default_rng(2)
    for step in range(LENGTH):
        prefixes = np.unique(sequences[:, :step], axis=0)
        states = index.walk(prefixes)
        rows = rng.integers(0, len(states), set_ids.size)
        row_states = states[rows].astype(np.int32)
        excluded = catalogue.exclusion_members(excluded_ids)
        logits = rng.normal(size=(row_states.size, VOCAB)).astype("float32")
        allowed = index.allowed_tokens(row_states)
        expected = []
        for r in range(row_states.size):
            tokens = np.flatnonzero(allowed[r])
            nxt = index.next_states(np.full(tokens.size, row_states[r]), tokens)
            lo, hi = index.member_ranges(nxt)
            eligible = set(eligible_members(sets, catalogue, set_ids[r], excluded_ids[r]).tolist())
            keep = [not eligible.isdisjoint(range(a, b)) for a, b in zip(lo, hi)]
            expected.append(set(tokens[keep].tolist()))
        for any_step in (step, None, ops.convert_to_tensor(step)):
            _, tokens, nxt = layer.candidates(
                logits, row_states, any_step, eligibility=Eligibility(set_ids, excluded)
            )
            tokens, nxt = np.asarray(tokens), np.asarray(nxt)
            for r in range(row_states.size):
                got = tokens[r][tokens[r] >= 0]
                assert set(got.tolist()) == expected[r], (step, any_step, r)
                assert got.size == len(expected[r])
                np.testing.assert_array_equal(
                    nxt[r][tokens[r] >= 0],
                    index.next_states(np.full(got.size, row_states[r]), got),
                )
            # Mask mode keeps exactly the same tokens.
            allowed = np.asarray(
                layer.allowed_mask(row_states, any_step, eligibility=Eligibility(set_ids, excluded))
            )
            masked = np.asarray(
                layer.mask_logits(
                    logits, row_states, any_step, eligibility=Eligibility(set_ids, excluded)
                )
            )
            for r in range(row_states.size):
                assert set(np.flatnonzero(allowed[r]).tolist()) == expected[r], (step, any_step)
                assert set(np.flatnonzero(masked[r] > -1e8).tolist()) == expected[r]
        scores = layer.vocabulary_scores(
            logits, row_states, step, eligibility=Eligibility(set_ids, excluded)
        )
        if step < dense_levels:
            scores = np.asarray(scores)
            for r in range(row_states.size):
                assert set(np.flatnonzero(np.isfinite(scores[r])).tolist()) == expected[r]
        else:
            assert scores is None


@pytest.mark.parametrize("dense_levels", [0, 1, 2])
def test_excluded_members_in_any_order_with_repeats_and_padding(dense_levels):
    # `exclusion_members` gives sorted distinct rows; a caller may pass raw
    # member numbers (any order, repeats, -1 or out-of-range padding): the
    # step sets them out itself and keeps the same candidates.
    index, sets, layer, catalogue, set_ids, excluded_ids = eligible_layer(dense_levels, 3, 2)
    canonical = catalogue.exclusion_members(excluded_ids)
    rng = np.random.default_rng(4)
    raw = np.concatenate([canonical, canonical[:, :2], np.full((7, 2), -1)], axis=1)
    raw[:, -1] = index.num_members + 7
    raw = np.stack([row[rng.permutation(row.size)] for row in raw])
    prefixes = np.unique(index.sequences()[:, :1], axis=0)
    states = index.walk(prefixes)[rng.integers(0, len(prefixes), 7)].astype(np.int32)
    logits = rng.normal(size=(7, VOCAB)).astype("float32")
    for step in (1, None):
        want = layer.candidates(logits, states, step, eligibility=Eligibility(set_ids, canonical))
        got = layer.candidates(logits, states, step, eligibility=Eligibility(set_ids, raw))
        for a, b in zip(want, got):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_without_eligibility_the_layer_is_unchanged():
    index = semantic_index(1)
    plain = ConstrainedDecoding(index)
    assert len(plain.weights) == len(index.arrays)
    assert "eligibility_sets" not in plain.get_config()
    with pytest.raises(ValueError, match="eligibility sets"):
        plain.candidates(
            np.zeros((1, VOCAB)), np.zeros(1), 0, eligibility=Eligibility(np.zeros(1), None)
        )
    sets = random_sets(index, 0)
    layer = ConstrainedDecoding(index, eligibility=sets)
    logits = np.random.default_rng(0).normal(size=(3, VOCAB)).astype("float32")
    states = index.walk([[0], [1], [2]]).astype(np.int32)
    every = Eligibility(np.full(3, -1, np.int32), None)
    for a, b in zip(
        plain.candidates(logits, states, 1), layer.candidates(logits, states, 1, eligibility=every)
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_set_eligibility_refreshes_in_place_and_checks():
    index = semantic_index(2)
    sets = random_sets(index, 0)
    layer = ConstrainedDecoding(index, eligibility=sets)
    config = layer.get_config()
    assert config["eligibility_sets"] == 4 and config["eligibility_names"] == list(sets.names)
    words = layer.eligibility_weights["eligibility_words"]
    fresh = sets.replace("few", [100])
    layer.set_eligibility(fresh)
    assert layer.eligibility_weights["eligibility_words"] is words
    np.testing.assert_array_equal(np.asarray(words), fresh.device_arrays()["eligibility_words"])
    with pytest.raises(ValueError, match="names differ"):
        layer.set_eligibility(EligibilitySets.build(index, {"a": [], "b": [], "c": [], "d": []}))
    with pytest.raises(ValueError, match="holds 4"):
        layer.set_eligibility(EligibilitySets.build(index, {"a": []}))
    with pytest.raises(ValueError, match="EligibilitySets"):
        layer.set_eligibility({"few": [1]})
    with pytest.raises(ValueError, match=r"\[-1, 4\)"):
        layer.candidates(
            np.zeros((1, VOCAB)), np.zeros(1), 0, eligibility=Eligibility(np.array([4]), None)
        )
    # The config and weights (what a `.keras` file keeps) restore the sets,
    # their names and the member ranges.
    clone = ConstrainedDecoding.from_config(config)
    clone.set_weights(layer.get_weights())
    assert clone.eligibility_names == sets.names
    for a, b in zip(clone.weights, layer.weights):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_graph_and_xla_steps_equal_eager_and_mask_unknown_set_ids():
    tf = pytest.importorskip("tensorflow")
    if keras.config.backend() != "tensorflow":
        pytest.skip("a TF graph needs the TensorFlow backend")
    index = semantic_index(2, seed=3)
    sets = random_sets(index, 3)
    layer = ConstrainedDecoding(index, eligibility=sets)
    set_ids, excluded_ids = requests(index, sets)
    excluded = MemberCatalogue.from_index(index).exclusion_members(excluded_ids)
    states = index.walk(index.sequences()[:7, :1]).astype(np.int32)
    logits = np.random.default_rng(0).normal(size=(7, VOCAB)).astype("float32")

    @tf.function(jit_compile=True)
    def compiled(logits, states, set_ids, excluded):
        return [
            layer.candidates(logits, states, step, eligibility=Eligibility(set_ids, excluded))
            for step in (1, None)
        ]

    for got, step in zip(compiled(logits, states, set_ids, excluded), (1, None)):
        want = layer.candidates(logits, states, step, eligibility=Eligibility(set_ids, excluded))
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a.numpy(), np.asarray(b))
    # In a graph an unknown set id cannot raise: its row gets no candidates.
    unknown = np.array([0, 99, -5, 1, 1, 1, 1], np.int32)
    _, tokens, _ = compiled(logits, states, unknown, excluded)[0]
    assert np.all(tokens.numpy()[1:3] == -1) and np.any(tokens.numpy()[0] >= 0)


_JAX_SCRIPT = textwrap.dedent(
    """
    import jax
    import numpy as np
    from static_keras import ConstrainedDecoding, Eligibility, StaticIndex, beam_search
    from static_keras.index.eligibility import EligibilitySets

    rows = np.array([[0, 1, 2], [0, 1, 3], [1, 0, 0], [2, 2, 1], [3, 3, 3]])
    for d in range(4):
        index = StaticIndex.build(rows, 4, dense_levels=d, item_ids=np.arange(5) + 10)
        sets = EligibilitySets.build(index, {"s": [10, 12, 13]})
        layer = ConstrainedDecoding(index, eligibility=sets)
        excluded = np.array([[2, 5], [5, 5]], np.int32)  # member 2 (id 12); 5 = padding
        set_ids = np.array([0, -1], np.int32)
        table = np.random.default_rng(0).normal(size=(4,)).astype("float32")

        @jax.jit
        def search(set_ids, excluded):
            step = lambda p, s: (jax.numpy.tile(table, (p.shape[0], 1)), s)
            return beam_search(layer, step, 2, 5, eligibility=Eligibility(set_ids, excluded))

        ids = np.asarray(search(set_ids, excluded)["item_ids"])
        assert sorted(ids[0][ids[0] >= 0].tolist()) == [10, 13], ids
        assert sorted(ids[1][ids[1] >= 0].tolist()) == [10, 11, 12, 13, 14], ids
    print("jax ok")
    """
)


@pytest.mark.slow  # keeps the default run under 15 minutes
def test_jax_backend_under_jit():
    pytest.importorskip("jax", reason="JAX is an optional backend (pip install .[jax])")
    run_under("jax", _JAX_SCRIPT, "jax ok")


# Beam search ------------------------------------------------------------------


def _check_search(index, sets, out, set_ids, excluded_ids, table, beam_size):
    catalogue = MemberCatalogue.from_index(index)
    sequences = index.sequences()
    tokens, scores = np.asarray(out["tokens"]), np.asarray(out["scores"])
    items = np.asarray(out["item_ids"])
    for b in range(set_ids.size):
        members = eligible_members(sets, catalogue, set_ids[b], excluded_ids[b])
        allowed_ids = set(catalogue.item_ids[members].tolist())
        live = np.isfinite(scores[b])
        assert live.sum() == min(beam_size, members.size), b  # no padding while some exist
        assert set(items[b][live].tolist()) <= allowed_ids
        assert np.all(items[b][~live] == -1) and np.all(tokens[b][~live] == -1)
        if beam_size >= members.size:
            want_tokens, want_scores = exhaustive_ranking(sequences[members], table)
            np.testing.assert_array_equal(tokens[b, : members.size], want_tokens)
            np.testing.assert_allclose(scores[b, : members.size], want_scores, atol=1e-5)


@pytest.mark.parametrize("dense_levels", range(LENGTH + 1))
def test_beam_search_ranks_exactly_the_eligible_members(dense_levels):
    index = semantic_index(dense_levels, seed=dense_levels)
    sets = random_sets(index, dense_levels)
    layer = ConstrainedDecoding(index, eligibility=sets)
    catalogue = MemberCatalogue.from_index(index)
    set_ids, excluded_ids = requests(index, sets)
    excluded = catalogue.exclusion_members(excluded_ids)
    table = random_table(VOCAB, seed=dense_levels)
    logits_of = prefix_logits(ops.convert_to_tensor(table))
    for beam_size, per_beam in ((index.num_members, None), (3, None), (4, 2)):
        out = beam_search(
            layer,
            lambda p, s: (logits_of(p), s),
            set_ids.size,
            beam_size,
            dense_top_k=per_beam,
            eligibility=Eligibility(set_ids, excluded),
        )
        _check_search(index, sets, out, set_ids, excluded_ids, table, beam_size)
    # Set ids alone, and exclusions alone.
    out = beam_search(
        layer, lambda p, s: (logits_of(p), s), 7, 30, eligibility=Eligibility(set_ids, None)
    )
    _check_search(index, sets, out, set_ids, np.full((7, 1), -1), table, 30)
    out = beam_search(
        layer, lambda p, s: (logits_of(p), s), 7, 30, eligibility=Eligibility(None, excluded)
    )
    _check_search(index, sets, out, np.full(7, -1), excluded_ids, table, 30)


def test_beam_search_without_eligibility_is_unchanged():
    index = semantic_index(1)
    logits_of = prefix_logits(ops.convert_to_tensor(random_table(VOCAB, seed=0)))
    plain = beam_search(index, lambda p, s: (logits_of(p), s), 2, 5)
    layer = ConstrainedDecoding(index, eligibility=random_sets(index, 0))
    every = beam_search(
        layer, lambda p, s: (logits_of(p), s), 2, 5, eligibility=Eligibility(np.full(2, -1), None)
    )
    for key in plain:
        np.testing.assert_array_equal(np.asarray(plain[key]), np.asarray(every[key]))


def test_constrained_beam_search_layer_takes_per_row_inputs():
    index = semantic_index(1)
    sets = random_sets(index, 0)
    layer = ConstrainedDecoding(index, eligibility=sets)
    catalogue = MemberCatalogue.from_index(index)
    set_ids, excluded_ids = requests(index, sets)
    excluded = catalogue.exclusion_members(excluded_ids)
    table = random_table(VOCAB, seed=1)
    logits_of = prefix_logits(ops.convert_to_tensor(table))

    class Decoder(keras.layers.Layer):
        def call(self, prefix, state):
            return logits_of(prefix), state

    search = ConstrainedBeamSearch(constraint=layer, decoder=Decoder(), beam_size=30)
    context = np.zeros((7, 1), "float32")
    out = search(context, eligibility=Eligibility(set_ids, excluded))
    _check_search(index, sets, out, set_ids, excluded_ids, table, 30)
    plain = search(context)  # the old call
    assert np.isfinite(np.asarray(plain["scores"])[:, : index.num_members]).all()


# String sets --------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny():
    pytest.importorskip("tokenizers")
    from static_keras.strings import StringIndex
    from static_keras.strings import TokenVocabulary

    tokens = [b"a", b"b", b"c", b"ab", b"bc", b"abc", b"ca", b"</s>"]
    vocab = TokenVocabulary.from_token_bytes(tokens, special=[7], eos_token_id=7)
    members = ["abc", "ab", "cab", "b", "bca"]
    return vocab, members, StringIndex.from_strings(members, vocab)


def test_string_beam_search_ranks_exactly_the_eligible_members(tiny):
    from string_oracles import ranked_tokenizations
    from string_oracles import string_step_fn
    from string_oracles import string_table

    vocab, members, index = tiny
    sets = EligibilitySets.build(index, {"odd": [1, 3], "none": [], "most": [0, 1, 2, 4]})
    layer = constraint_for(index)
    layer = type(layer)(index, eligibility=sets)
    catalogue = MemberCatalogue.from_index(index)
    table = string_table(vocab.vocab_size, seed=4)
    sequences, scores = ranked_tokenizations(vocab, members, index, table)
    best = {}
    for sequence, score in zip(sequences, scores):
        best.setdefault(vocab.decode(sequence).decode(), (sequence, score))
    set_ids = np.array([0, 1, 2, 2, -1], np.int32)
    excluded_ids = np.array([[-1, -1], [-1, -1], [0, 0], [0, 9], [1, 2]])
    excluded = catalogue.exclusion_members(excluded_ids)
    for beam_size in (32, 2):
        out = beam_search(
            layer,
            string_step_fn(table),
            set_ids.size,
            beam_size,
            eligibility=Eligibility(set_ids, excluded),
        )
        tokens, got, items = (np.asarray(out[k]) for k in ("tokens", "scores", "item_ids"))
        for b in range(set_ids.size):
            eligible = eligible_members(sets, catalogue, set_ids[b], excluded_ids[b])
            ids = set(catalogue.item_ids[eligible].tolist())
            live = items[b] >= 0
            assert set(items[b][live].tolist()) <= ids
            assert np.all(np.isneginf(got[b][~live]))
            if beam_size < 32:
                continue
            want = sorted((best[members[i]] for i in ids), key=lambda x: -x[1])
            assert live.sum() == len(want)
            for rank, (sequence, score) in enumerate(want):
                row = list(sequence) + [-1] * (index.length - len(sequence))
                assert tokens[b, rank].tolist() == row
                assert got[b, rank] == pytest.approx(score, abs=1e-4)


@pytest.mark.slow  # 18 s: keeps the default run under 15 minutes
def test_keras_file_round_trip_keeps_sets_and_per_row_inputs(tmp_path):
    from static_keras import CachedTransformerDecoder

    index = semantic_index(1, seed=5)
    sets = random_sets(index, 5)
    set_ids, excluded_ids = requests(index, sets)
    excluded = MemberCatalogue.from_index(index).exclusion_members(excluded_ids)
    keras.utils.set_random_seed(0)
    decoder = CachedTransformerDecoder(VOCAB, LENGTH, context_vocab_size=10, hidden_dim=8)
    context = keras.Input((3,), dtype="int32")
    set_in = keras.Input((), dtype="int32")
    excluded_in = keras.Input((excluded.shape[1],), dtype="int32")
    layer = ConstrainedDecoding(index, eligibility=sets, name="constraint")
    search = ConstrainedBeamSearch(constraint=layer, decoder=decoder, beam_size=30)
    model = keras.Model([context, set_in, excluded_in], search(context, set_in, excluded_in))
    path = os.path.join(tmp_path, "eligible.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert loaded.layers[-1].constraint.eligibility_names == sets.names
    batch = [np.arange(21).reshape(7, 3) % 10, set_ids, excluded]
    expected, actual = model.predict(batch, verbose=0), loaded.predict(batch, verbose=0)
    for key in expected:
        np.testing.assert_array_equal(expected[key], actual[key])
    items = expected["item_ids"]
    catalogue = MemberCatalogue.from_index(index)
    for b in range(7):
        members = eligible_members(sets, catalogue, set_ids[b], excluded_ids[b])
        assert set(items[b][items[b] >= 0].tolist()) == set(catalogue.item_ids[members].tolist())


def test_a_layer_saved_before_dense_member_codes_loads_with_them():
    """Layers saved before the per-member dense codes lack that one weight
    (their last): loading fills it in from the saved boundary table."""
    index = semantic_index(2, seed=6)
    sets = random_sets(index, 6)
    layer = ConstrainedDecoding(index, eligibility=sets)
    store = {}
    layer.save_own_variables(store)
    last = str(len(store) - 1)
    want = store.pop(last)  # what an older layer wrote: everything else
    np.testing.assert_array_equal(want, layer.member_range_weights["dense_member_codes"])
    fresh = ConstrainedDecoding.from_config(layer.get_config())
    fresh.build()
    fresh.load_own_variables(store)
    np.testing.assert_array_equal(
        ops.convert_to_numpy(fresh.member_range_weights["dense_member_codes"]), want
    )
    set_ids, excluded_ids = requests(index, sets)
    request = Eligibility(
        set_ids, MemberCatalogue.from_index(index).exclusion_members(excluded_ids)
    )
    states = np.zeros(set_ids.size, np.int32)
    logits = np.random.default_rng(6).normal(size=(set_ids.size, VOCAB)).astype("float32")
    for a, b in zip(layer.candidates(logits, states, 0, eligibility=request),
                    fresh.candidates(logits, states, 0, eligibility=request)):  # fmt: skip
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(ValueError):  # any other count is still an error
        store.pop("0")
        fresh.load_own_variables(store)


def test_the_eligibility_argument_is_an_eligibility_checked_for_its_layer():
    """Anything but an `Eligibility` (or 0.1's pair, with a warning) is
    refused naming `eligibility`, eagerly and while a graph is traced; a
    request set out for another index is refused; the search's call takes
    one spelling at a time."""
    import tensorflow as tf

    from static_keras import Eligibility

    index = semantic_index(2, seed=3)
    sets = random_sets(index, 3)
    layer = ConstrainedDecoding(index, eligibility=sets)
    states = np.zeros(2, np.int32)
    logits = np.zeros((2, VOCAB), "float32")
    set_ids = np.array([0, -1], np.int32)
    for bad in ({"set_ids": set_ids}, (set_ids, None, None), sets, set_ids):
        with pytest.raises(ValueError, match="`eligibility` must be a static_keras.Eligibility"):
            layer.candidates(logits, states, 0, eligibility=bad)
        with pytest.raises(ValueError, match="`eligibility` must be a static_keras.Eligibility"):
            tf.function(lambda s: layer.candidates(logits, s, 0, eligibility=bad))(states)
    want = layer.candidates(logits, states, 0, eligibility=Eligibility(set_ids, None))
    with pytest.warns(DeprecationWarning, match="static_keras.Eligibility"):
        got = layer.candidates(logits, states, 0, eligibility=(set_ids, None))
    for a, b in zip(got, want):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # A request set out by a layer of another index (other member numbers).
    other_index = semantic_index(2, seed=4, n=index.num_members // 2)
    other = ConstrainedDecoding(other_index, eligibility=random_sets(other_index, 4))
    foreign = other.check_eligibility(Eligibility(set_ids, None))
    with pytest.raises(ValueError, match="set out for an index of"):
        layer.candidates(logits, states, 0, eligibility=foreign)
    own = layer.check_eligibility(Eligibility(set_ids, None))
    for a, b in zip(layer.candidates(logits, states, 0, eligibility=own), want):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

    class Decoder(keras.layers.Layer):
        def call(self, prefix, state):
            return ops.zeros((ops.shape(state)[0], VOCAB)), state

    search = ConstrainedBeamSearch(constraint=layer, decoder=Decoder(), beam_size=3)
    context = np.zeros((2, 1), "float32")
    with pytest.raises(ValueError, match="not both"):
        search(context, set_ids=set_ids, eligibility=Eligibility(set_ids, None))
