"""An index laid out with headroom answers exactly as the exact index.

The exact index is the oracle (its own tests check it against brute force):
host queries, a layer's candidates with eligibility and exclusions at every
reachable state and step, and beam search with per-row sets, at every dense
depth; plus the capacity checks and the layer config round trip.
"""

from __future__ import annotations

import numpy as np
import pytest
from decoding_oracles import prefix_logits
from decoding_oracles import random_table
from keras import ops

from static_keras import ConstrainedDecoding
from static_keras import Eligibility
from static_keras import StaticIndex
from static_keras import beam_search
from static_keras.index import headroom
from static_keras.index.eligibility import EligibilitySets
from static_keras.index.eligibility import MemberCatalogue

VOCAB, LENGTH = 5, 3


def pair(dense_levels: int, room: float, seed: int = 0, n: int = 40):
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, VOCAB, (n, LENGTH))
    items = 1000 + 3 * rng.permutation(n)
    build = dict(item_ids=items, dense_levels=dense_levels, on_duplicate_item="first")
    exact = StaticIndex.build(rows, VOCAB, **build)
    roomy = StaticIndex.build(rows, VOCAB, headroom=room, **build)
    return exact, roomy, items


def sets_of(index, items, seed):
    rng = np.random.default_rng(seed)
    return EligibilitySets.build(
        index, {"half": rng.choice(items, items.size // 2, replace=False), "none": []}
    )


@pytest.mark.parametrize("dense_levels", range(LENGTH + 1))
@pytest.mark.parametrize("room", [0.05, 1.0])
def test_host_queries_are_the_exact_indexs(dense_levels, room):
    exact, roomy, items = pair(dense_levels, room)
    assert roomy.layout.has_headroom and roomy.num_sequences == exact.num_sequences
    assert roomy.num_members >= exact.num_members
    np.testing.assert_array_equal(roomy.sequences(), exact.sequences())
    sequences = exact.sequences()
    np.testing.assert_array_equal(
        roomy.lookup_item_ids(sequences), exact.lookup_item_ids(sequences)
    )
    for t in range(LENGTH + 1):
        prefixes = np.unique(sequences[:, :t], axis=0)
        a, b = exact.walk(prefixes), roomy.walk(prefixes)
        for x, y in zip(exact.member_ranges(a), roomy.member_ranges(b)):
            np.testing.assert_array_equal(x, y)
        if t < LENGTH:
            np.testing.assert_array_equal(exact.allowed_tokens(a), roomy.allowed_tokens(b))
    # Every tail step may branch: its row pointers exist.
    assert all(w >= 2 for w in roomy.step_widths[dense_levels:])


@pytest.mark.parametrize("dense_levels", range(LENGTH + 1))
def test_layer_candidates_and_beam_search_are_the_exact_indexs(dense_levels):
    exact, roomy, items = pair(dense_levels, 0.3, seed=dense_levels)
    layers = []
    for index in (exact, roomy):
        layers.append(ConstrainedDecoding(index, eligibility=sets_of(index, items, 7)))
    set_ids = np.array([0, 0, 1, -1, 0], np.int32)
    excluded_ids = np.full((5, 3), -1, np.int64)
    excluded_ids[1, :2] = items[:2]
    excluded_ids[3, 0] = items[5]
    excluded = [
        MemberCatalogue.from_index(index).exclusion_members(excluded_ids)
        for index in (exact, roomy)
    ]
    rng = np.random.default_rng(3)
    sequences = exact.sequences()
    for step in range(LENGTH):
        prefixes = np.unique(sequences[:, :step], axis=0)
        pick = rng.integers(0, len(prefixes), set_ids.size)
        logits = rng.normal(size=(set_ids.size, VOCAB)).astype("float32")
        outs = []
        for index, layer, exclude in zip((exact, roomy), layers, excluded):
            states = index.walk(prefixes)[pick].astype(np.int32)
            for any_step in (step, None):
                scores, tokens, nxt = layer.candidates(
                    logits, states, any_step, eligibility=Eligibility(set_ids, exclude)
                )
                tokens, scores = np.asarray(tokens), np.asarray(scores)
                # Next states differ in number; their sequences do not.
                outs.append([sorted(zip(t[t >= 0].tolist(), s[t >= 0].tolist()))
                             for t, s in zip(tokens, scores)])  # fmt: skip
        assert outs[:2] == outs[2:], step
    table = random_table(VOCAB, seed=dense_levels)
    logits_of = prefix_logits(ops.convert_to_tensor(table))
    results = []
    for layer, exclude in zip(layers, excluded):
        out = beam_search(
            layer, lambda p, s: (logits_of(p), s), set_ids.size, 6,
            eligibility=Eligibility(set_ids, exclude),
        )  # fmt: skip
        results.append({k: np.asarray(v) for k, v in out.items()})
    assert results[0].keys() == results[1].keys()
    for key in results[0]:
        np.testing.assert_array_equal(results[0][key], results[1][key], err_msg=key)


def test_the_layer_config_round_trips_the_used_sizes():
    _, roomy, _ = pair(1, 0.2)
    layer = ConstrainedDecoding(roomy)
    config = layer.get_config()
    assert config["used_level_sizes"] == list(roomy.layout.used_level_sizes)
    again = ConstrainedDecoding.from_config(config)
    assert again.layout == roomy.layout


def test_a_catalogue_beyond_the_capacities_is_refused_naming_them():
    exact, roomy, items = pair(2, 0.1)
    bigger = StaticIndex.build(np.indices((VOCAB,) * LENGTH).reshape(LENGTH, -1).T, VOCAB,
                               item_ids=np.arange(VOCAB**LENGTH), dense_levels=2)  # fmt: skip
    with pytest.raises(headroom.CapacityError, match=r"members \(capacity .*more headroom"):
        headroom.fit(roomy.layout, bigger.layout, bigger.arrays)
    layout, arrays = headroom.fit(roomy.layout, exact.layout, exact.arrays)
    assert layout == roomy.layout
    for name in arrays:
        np.testing.assert_array_equal(arrays[name], roomy.arrays[name])


@pytest.mark.parametrize("bad", [-0.1, "0.1", True, float("nan"), 11])
def test_bad_headroom_is_refused_naming_it(bad):
    with pytest.raises(ValueError, match="headroom"):
        StaticIndex.build([[0, 1]], 2, headroom=bad)


def test_an_index_with_headroom_saves_and_loads(tmp_path):
    _, roomy, _ = pair(2, 0.4)
    roomy.save(tmp_path / "roomy.npz")
    again = StaticIndex.load(tmp_path / "roomy.npz")
    assert again.layout == roomy.layout and again.num_sequences == roomy.num_sequences
    for name, array in roomy.arrays.items():
        np.testing.assert_array_equal(again.arrays[name], array)


@pytest.mark.parametrize(
    "used", [[1, 5, 30], [1, 5, 24, 99], [2, 5, 24, 30], [1, -1, 24, 30]]
)  # fmt: skip
def test_a_layout_with_impossible_used_sizes_is_refused(used):
    from static_keras.index.layout import IndexLayout

    _, roomy, _ = pair(1, 0.2)
    config = {**roomy.layout.to_config(), "used_level_sizes": used}
    with pytest.raises(ValueError, match="used_level_sizes"):
        IndexLayout.from_config(config)
    with pytest.raises(ValueError, match="used_level_sizes"):
        ConstrainedDecoding(vocab_size=VOCAB, length=LENGTH, dense_levels=1,
                            level_sizes=list(roomy.layout.level_sizes),
                            step_widths=list(roomy.layout.step_widths), has_item_ids=True,
                            used_level_sizes=used)  # fmt: skip


def test_an_index_of_another_layout_is_refused_by_the_layer():
    _, roomy, _ = pair(1, 0.2)
    layer = ConstrainedDecoding(roomy)
    other = StaticIndex.build([[0, 1, 2]], VOCAB, item_ids=[5], dense_levels=1, headroom=0.2)
    with pytest.raises(ValueError, match="does not match this layer"):
        layer.set_index(other)


def test_a_new_catalogue_within_the_capacities_loads_into_the_same_layer():
    from static_keras.index.catalogue_delta import apply_delta

    _, roomy, items = pair(1, 0.5)
    layer = ConstrainedDecoding(roomy)
    taken = {tuple(r) for r in roomy.sequences().tolist()}
    new = next(r for r in np.ndindex(*(VOCAB,) * LENGTH) if r not in taken)
    changed = apply_delta(roomy, add_sequences=[new], add_item_ids=[7], remove_item_ids=items[:1])
    layer.set_index(changed)  # the same graph shape: new values
    assert layer.layout == changed.layout
    state = np.asarray(changed.walk([list(new)]), "int32")
    np.testing.assert_array_equal(np.asarray(layer.item_ids(state)), [7])
