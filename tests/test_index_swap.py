"""The daily index swap keeps eligibility, and sets never cross indexes.

- `replace_index` on a model with eligibility sets carries them over to the
  new index by item id (items gone from the catalogue drop out, new items
  are in no set), so the export keeps `serving_eligible`; where that is
  impossible (no item ids) it refuses and says what to pass instead;
- sets built over another index (same member count, other item ids) are
  refused by the layer, `set_eligibility` and the registry, with both
  catalogues named;
- the carry-over is exact against a plain Python oracle, and the sparse-id
  catalogue lookups equal a dict.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import CONTEXT_VOCAB
from conftest import HISTORY
from conftest import histories

from static_keras import CachedTransformerDecoder
from static_keras import ConstrainedBeamSearch
from static_keras import ConstrainedDecoding
from static_keras import Eligibility
from static_keras import StaticIndex
from static_keras.export import ELIGIBLE_SIGNATURE
from static_keras.export import export_saved_model
from static_keras.export import read_eligibility
from static_keras.export import read_metadata
from static_keras.export import replace_index
from static_keras.index import member_catalogue
from static_keras.index.eligibility import EligibilitySets
from static_keras.index.member_catalogue import MemberCatalogue
from static_keras.serving.registry import ConstraintIndexRegistry


def _index(seed: int, item_ids, vocab: int = 16, length: int = 3) -> StaticIndex:
    rng = np.random.default_rng(seed)
    rows = np.unique(rng.integers(0, vocab, (len(item_ids) * 3, length)), axis=0)
    rows = rows[rng.permutation(len(rows))[: len(item_ids)]]
    return StaticIndex.build(rows, vocab, item_ids=np.asarray(item_ids, np.int64))


def _model(index, sets):
    keras.utils.set_random_seed(0)
    decoder = CachedTransformerDecoder(
        index.vocab_size, index.length, context_vocab_size=CONTEXT_VOCAB, hidden_dim=16
    )
    layer = ConstrainedDecoding(index, eligibility=sets, name="constraint")
    search = ConstrainedBeamSearch(constraint=layer, decoder=decoder, beam_size=4)
    history = keras.Input((HISTORY,), dtype="int32", name="history")
    return keras.Model(history, search(history))


def _search(model):
    return next(layer for layer in model.layers if isinstance(layer, ConstrainedBeamSearch))


def test_replace_index_carries_the_sets_over_by_item_id(tmp_path):
    old_ids = 10**9 + 2 * np.random.default_rng(0).permutation(200)  # sparse catalogue ids
    old = _index(0, old_ids)
    in_stock, fr = old_ids[::2], old_ids[::3]
    model = _model(old, EligibilitySets.build(old, {"in_stock": in_stock, "fr": fr}))
    # The next day: a third of the items leave, 50 new ones arrive, every
    # semantic ID (so every member number) moves.
    new_ids = np.concatenate([old_ids[70:], 5 * 10**9 + np.arange(50)])
    new = _index(1, new_ids)

    swapped = replace_index(model, new)
    sets = _search(swapped).constraint.eligibility_sets()
    assert sets.names == ("in_stock", "fr")
    catalogue = MemberCatalogue.from_index(new)
    for name, eligible in (("in_stock", in_stock), ("fr", fr)):
        # Oracle: a member of the new index is eligible iff its item id was.
        expected = {m for m, item in enumerate(catalogue.item_ids) if item in set(eligible)}
        got = set(np.flatnonzero(sets.contains(sets.set_id(name), np.arange(new.num_members))))
        assert got == expected and expected
    # The decoder is shared; the export keeps the eligible signature.
    assert _search(swapped).decoder is _search(model).decoder
    info = export_saved_model(swapped, tmp_path / "v2")
    loaded = tf.saved_model.load(info.path)
    assert ELIGIBLE_SIGNATURE in loaded.signatures
    assert read_metadata(info.path)["eligibility_sets"] == ["in_stock", "fr"]
    served = read_eligibility(info.path)
    np.testing.assert_array_equal(served.words, sets.words)
    # Results of the eligible search are members of the set, by item id.
    out = _search(swapped)(histories(6), eligibility=Eligibility(np.zeros(6, "int32")))
    found = np.asarray(out["item_ids"])
    assert np.isin(found[found >= 0], in_stock).all()


def test_replace_index_takes_given_sets_and_refuses_what_it_cannot_carry():
    old = _index(0, np.arange(100) + 500)
    model = _model(old, EligibilitySets.build(old, {"s": np.arange(500, 550)}))
    new = _index(1, np.arange(100) + 520)
    given = EligibilitySets.build(new, {"s": [520, 521]})
    sets = _search(replace_index(model, new, eligibility=given)).constraint.eligibility_sets()
    assert sets.sizes() == {"s": 2}
    with pytest.raises(ValueError, match="another index"):
        replace_index(model, new, eligibility=EligibilitySets.build(old, {"s": [500]}))

    # Without item ids, member numbers are positions: carrying over would
    # restrict to other items, so the swap refuses and names the remedy.
    rows = np.random.default_rng(2).integers(0, 16, (60, 3))
    bare_old = StaticIndex.build(rows, 16)
    bare_model = _model(bare_old, EligibilitySets.build(bare_old, {"s": [0, 1]}))
    bare_new = StaticIndex.build(rows[:40], 16)
    with pytest.raises(ValueError, match=r"no item ids.*EligibilitySets.build\(new_index"):
        replace_index(bare_model, bare_new)
    # A model without sets gets none, and refuses sets it was not built with.
    plain = _model(old, None)
    assert not _search(replace_index(plain, new)).constraint.num_eligibility_sets
    with pytest.raises(ValueError, match="holds no eligibility sets"):
        replace_index(plain, new, eligibility=given)


def test_sets_over_another_index_are_refused_everywhere():
    # Same member count, other item ids: the sets' member numbers would
    # name other items.
    index = _index(0, np.arange(50) + 10)
    other = _index(0, np.arange(50) + 1000)
    foreign = EligibilitySets.build(other, {"only": [1003]})
    with pytest.raises(ValueError, match="another index.*catalogue [0-9a-f]{16}.*catalogue"):
        ConstrainedDecoding(index, eligibility=foreign)
    layer = ConstrainedDecoding(index, eligibility=EligibilitySets.build(index, {"only": [13]}))
    with pytest.raises(ValueError, match="another index"):
        layer.set_eligibility(foreign)
    with pytest.raises(ValueError, match="another index"):
        ConstraintIndexRegistry().load(index, foreign)
    # The sets of this index (or carried over to it) are taken.
    layer.set_eligibility(foreign.carried_over(index))
    assert layer.eligibility_sets().sizes() == {"only": 0}
    layer.set_eligibility(EligibilitySets.build(index, {"only": [13, 14]}))
    assert layer.eligibility_sets().sizes() == {"only": 2}


@pytest.mark.parametrize("block", [1, 7, 1 << 14])
@pytest.mark.parametrize("ids", ["sparse", "dense", "duplicates", "huge"])
def test_catalogue_lookups_equal_a_dict(ids, block, monkeypatch):
    # Small blocks walk `search_ascending`'s block windows, the default none.
    monkeypatch.setattr(member_catalogue, "_SEARCH_BLOCK", block)
    rng = np.random.default_rng(7)
    n = 5000
    item_ids = {
        "sparse": 10**9 + 2 * rng.permutation(n),
        "dense": rng.permutation(n),
        "duplicates": rng.integers(0, n // 2, n) * 3 + 10**12,
        "huge": rng.integers(-(2**62), 2**62, n),
    }[ids]
    catalogue = MemberCatalogue(item_ids, n)
    members_of = {}
    for member, item in enumerate(item_ids.tolist()):
        members_of.setdefault(item, []).append(member)
    queries = np.concatenate([rng.choice(item_ids, 3000), rng.integers(-5, 2 * n, 500)])
    query, member = catalogue.lookup(queries)
    expected = [(q, m) for q, item in enumerate(queries.tolist()) for m in members_of.get(item, [])]
    assert sorted(zip(query.tolist(), member.tolist())) == sorted(expected)
    assert np.all(np.diff(query) >= 0)
    assert sorted(catalogue.members(queries).tolist()) == sorted(m for _, m in expected)
    # Queries that come ascending take the path without a sort: the same answers.
    ascending = np.sort(queries)
    query, member = catalogue.lookup(ascending)
    expected = [
        (q, m) for q, item in enumerate(ascending.tolist()) for m in members_of.get(item, [])
    ]
    assert list(zip(query.tolist(), member.tolist())) == expected
    assert sorted(catalogue.members(ascending).tolist()) == sorted(m for _, m in expected)
    descending = ascending[::-1].copy()  # the sorted path must not take these
    query, member = catalogue.lookup(descending)
    expected = [
        (q, m) for q, item in enumerate(descending.tolist()) for m in members_of.get(item, [])
    ]
    assert sorted(zip(query.tolist(), member.tolist())) == sorted(expected)
    assert sorted(catalogue.members(descending).tolist()) == sorted(m for _, m in expected)
    # Shared members with another catalogue: exactly the pairs with one id.
    other_ids = np.concatenate([item_ids[::2], np.arange(100) + 7 * 10**13])
    other = MemberCatalogue(rng.permutation(other_ids), other_ids.size)
    pairs = {
        pair
        for here, there in catalogue.shared_member_chunks(other, chunk=37)
        for pair in zip(here.tolist(), there.tolist())
    }
    here, there = catalogue.shared_members(other)
    assert set(zip(here.tolist(), there.tolist())) == pairs
    other_of = {}
    for member, item in enumerate(other.item_ids.tolist()):
        other_of.setdefault(item, []).append(member)
    expected_pairs = {
        (m, o) for m, item in enumerate(item_ids.tolist()) for o in other_of.get(item, [])
    }
    assert pairs == expected_pairs
    # A served version's sorted table rebuilds the same catalogue.
    ids, members = catalogue._ascending()
    rebuilt = MemberCatalogue.from_sorted(ids, members, n)
    assert rebuilt.fingerprint == catalogue.fingerprint
    np.testing.assert_array_equal(rebuilt.item_ids, catalogue.item_ids)


def test_an_arange_catalogue_is_the_identity():
    assert MemberCatalogue(np.arange(9), 9).fingerprint == MemberCatalogue(None, 9).fingerprint
    assert MemberCatalogue(np.arange(9) + 1, 9).fingerprint != MemberCatalogue(None, 9).fingerprint


def _eligible_search():
    index = _index(0, np.arange(40) + 10)
    sets = EligibilitySets.build(index, {"a": np.arange(10, 30), "b": np.arange(20, 50)})
    return index, _search(_model(index, sets))


@pytest.mark.parametrize(
    "set_ids, excluded, error, pattern",
    [
        ([0, 1, 0, 1], None, ValueError, r"`set_ids` must have one row per batch row: expected 3"),
        ([0, 1], None, ValueError, r"`set_ids` must have one row per batch row: expected 3"),
        (None, np.zeros((4, 2), "int32"), ValueError, r"`excluded` must have one row per batch"),
        ([0.7, 1.9, 0.0], None, TypeError, r"`set_ids` must hold integers.*float"),
        (None, [[1.5], [0.0], [2.0]], TypeError, r"`excluded` must hold integers.*float"),
        (np.array(["a", "b", "a"]), None, TypeError, r"`set_ids` must hold integers.*str"),
        ([True, False, True], None, TypeError, r"`set_ids` must hold integers.*bool"),
    ],
)
def test_bad_eligibility_inputs_name_the_argument(set_ids, excluded, error, pattern):
    """Eagerly, in the layer call, in `beam_search`, and in a step of the
    constraint: the argument, its shape or dtype and what was expected."""
    from static_keras.decoding.beam_search import beam_search

    index, search = _eligible_search()
    context = histories(3)
    with pytest.raises(error, match=pattern):
        search(context, eligibility=Eligibility(set_ids, excluded))
    with pytest.raises(error, match=pattern):
        beam_search(
            search.constraint, search.decoder, 3, beam_size=2,
            initial_state=search.decoder.initial_state(context),
            eligibility=Eligibility(set_ids, excluded),
        )  # fmt: skip
    with pytest.raises(error, match=pattern):
        search.constraint.candidates(
            np.zeros((3, index.vocab_size), "float32"), np.zeros(3, "int32"), step=0,
            eligibility=Eligibility(set_ids, excluded),
        )  # fmt: skip


def test_good_eligibility_inputs_still_run():
    _, search = _eligible_search()
    out = search(histories(3), eligibility=Eligibility(np.array([0, 1, -1], np.int64)))
    found = np.asarray(out["item_ids"])
    assert np.isin(found[0][found[0] >= 0], np.arange(10, 30)).all()


def test_the_cli_swap_keeps_the_served_rules(capsys, tmp_path):
    """`publish --index` on a model with sets: the new version keeps
    `serving_eligible`, with the rules of the served version (refreshed
    since the .keras file was saved) carried over by item id."""
    from static_keras.cli import main

    old_ids = 10**9 + 2 * np.arange(120)
    old = _index(0, old_ids)
    model = _model(old, EligibilitySets.build(old, {"in_stock": old_ids[:60]}))
    model.save(tmp_path / "model.keras")
    base = tmp_path / "recs"
    assert main(["publish", str(tmp_path / "model.keras"), "--model-base-path", str(base),
                 "--warmup-batch-sizes", "1"]) == 0  # fmt: skip
    assert main(["refresh-eligibility", "--model-base-path", str(base)] + _set_file(
        tmp_path, "in_stock", old_ids[100:])) == 0  # fmt: skip
    new_ids = np.concatenate([old_ids[10:], 7 * 10**9 + np.arange(5)])
    _index(1, new_ids).save(tmp_path / "fresh.npz")
    capsys.readouterr()
    code = main(["publish", str(tmp_path / "model.keras"), "--model-base-path", str(base),
                 "--index", str(tmp_path / "fresh.npz"), "--warmup-batch-sizes", "1"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0 and "published version 3" in out
    assert "eligibility sets of version 2 carried over" in out and "in_stock 20 -> 20" in out
    served = read_eligibility(base / "3")
    catalogue = MemberCatalogue.from_index(_index(1, new_ids))
    eligible = catalogue.item_ids[served.contains(0, np.arange(catalogue.num_members))]
    assert sorted(eligible.tolist()) == sorted(old_ids[100:].tolist())
    assert ELIGIBLE_SIGNATURE in tf.saved_model.load(str(base / "3")).signatures


def _set_file(tmp_path, name, ids) -> list[str]:
    np.save(tmp_path / f"{name}.npy", np.asarray(ids))
    return ["--set", f"{name}={tmp_path / f'{name}.npy'}"]


def test_a_swap_between_indexes_with_and_without_item_ids_is_refused():
    """The model's outputs (`item_ids` or not) come from the old index: a new
    one that differs there would swap outputs silently."""
    rows = np.random.default_rng(4).integers(0, 16, (60, 3))
    with_ids = StaticIndex.build(rows, 16, item_ids=np.arange(60) + 7, on_duplicate_item="first")
    without = StaticIndex.build(rows, 16)
    for old, new in ((without, with_ids), (with_ids, without)):
        with pytest.raises(ValueError, match="has_item_ids is"):
            replace_index(_model(old, None), new)


def test_versions_exported_before_the_identity_fingerprint_or_the_digest_still_read(tmp_path):
    """Earlier exports hashed member numbers as ids where an index has no item
    ids; the sets of such a version still read (and so refresh)."""
    import hashlib
    import json

    from static_keras.export import publish

    rows = np.random.default_rng(6).integers(0, 16, (80, 3))
    index = StaticIndex.build(rows, 16)
    sets = EligibilitySets.build(index, {"s": [0, 3, 5]})
    publish(_model(index, sets), tmp_path / "recs", warmup_batch_sizes=(1,))
    path = tmp_path / "recs" / "1" / "assets" / "static_keras_index.json"
    metadata = json.loads(path.read_text())
    n = index.num_members
    legacy = hashlib.sha256(f"members:{n};".encode())
    legacy.update(np.arange(n, dtype="<i8").tobytes())
    current = dict(metadata["eligibility"])
    # Such a version has neither `has_item_ids` nor a table digest.
    metadata["eligibility"]["catalogue_fingerprint"] = legacy.hexdigest()
    metadata["eligibility"].pop("has_item_ids", None)
    metadata["eligibility"].pop("table_digest")
    path.write_text(json.dumps(metadata))
    assert read_eligibility(tmp_path / "recs" / "1").sizes() == {"s": 3}
    metadata["eligibility"]["catalogue_fingerprint"] = "0" * 64
    path.write_text(json.dumps(metadata))
    with pytest.raises(ValueError, match="does not match its metadata"):
        read_eligibility(tmp_path / "recs" / "1")
    # This version's metadata: the digest binds the table to the fingerprint,
    # so a wrong fingerprint or a wrong digest is refused without re-deriving it.
    for field in ("catalogue_fingerprint", "table_digest"):
        metadata["eligibility"] = {**current, field: "0" * 64}
        path.write_text(json.dumps(metadata))
        with pytest.raises(ValueError, match="does not match its metadata"):
            read_eligibility(tmp_path / "recs" / "1")
    metadata["eligibility"] = current
    path.write_text(json.dumps(metadata))
    read = read_eligibility(tmp_path / "recs" / "1")
    assert read.catalogue.fingerprint == current["catalogue_fingerprint"]
    assert read.catalogue.fingerprint == MemberCatalogue.from_index(index).fingerprint


def test_bad_inputs_are_refused_in_a_traced_graph_and_by_the_swap():
    """The same errors when the search is traced (tf.function, static shapes),
    and for a wrong `eligibility` object given to `replace_index`."""
    index, search = _eligible_search()
    context = tf.constant(histories(3))

    @tf.function
    def restricted(set_ids):
        return search(context, eligibility=Eligibility(set_ids))

    with pytest.raises(ValueError, match=r"`set_ids` must have one row per batch row: expected 3"):
        restricted(tf.constant([0, 1], tf.int32))
    with pytest.raises(TypeError, match=r"`set_ids` must hold integers.*float32"):
        restricted(tf.constant([0.0, 1.0, 0.0]))
    model = _model(index, EligibilitySets.build(index, {"a": [10]}))
    with pytest.raises(ValueError, match="must be an EligibilitySets"):
        replace_index(model, index, eligibility=[10, 11])
    with pytest.raises(ValueError, match="must have shape"):
        MemberCatalogue.from_sorted(np.arange(3), np.arange(2), 3)
    with pytest.raises(ValueError, match="sorted ascending"):
        MemberCatalogue.from_sorted(np.array([3, 1, 2]), np.arange(3), 3)


@pytest.mark.parametrize("block", [1, 3, 64, 1 << 14])
def test_search_of_ascending_queries_by_blocks_equals_numpy(block, monkeypatch):
    monkeypatch.setattr(member_catalogue, "_SEARCH_BLOCK", block)
    rng = np.random.default_rng(11)
    for size, queries in [(0, 5), (1, 9), (1000, 0), (1000, 1), (5000, 4099), (300, 2000)]:
        values = np.sort(rng.integers(-50, 50 + size // 4, size))  # repeats, and gaps
        asked = np.sort(rng.integers(-80, 80 + size // 4, queries))  # some outside both ends
        for side in ("left", "right"):
            got = member_catalogue.search_ascending(values, asked, side=side)
            assert np.array_equal(got, np.searchsorted(values, asked, side=side)), (size, side)
