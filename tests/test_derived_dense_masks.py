"""Dense-step eligibility rows derived at decode time, against NumPy oracles.

- the bit permutations (`compress`/PEXT, `expand`/PDEP) and `segment_any`
  against bit-by-bit references, eagerly, in a TF graph and under XLA;
- `derived_words` against the stored rows of `dense_eligibility_masks`
  (the host oracle) for every code of every derived depth, every set, with
  a code whose members span several words;
- the choice of stored and derived depths, the layer config round trip, and
  a layer with stored and derived depths side by side against the host
  enterable rule at every dense step, static and tensor steps.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
from decoding_oracles import compiled_modes
from keras import ops

from static_keras import ConstrainedDecoding
from static_keras import Eligibility
from static_keras import StaticIndex
from static_keras.index import dense_eligibility
from static_keras.index.eligibility import EligibilitySets
from static_keras.kernels import bit_fields
from static_keras.kernels import derived_dense_masks

tf_only = pytest.mark.skipif(keras.config.backend() != "tensorflow", reason="TF modes")


def _words(rng, shape, p):
    bits = rng.random(shape + (32,)) < p
    words = np.packbits(bits, axis=-1, bitorder="little").view("<u4").reshape(shape)
    return words.view(np.int32), bits


def _unpack(words):
    words = np.ascontiguousarray(np.asarray(words, np.int32))
    as_bytes = words.view(np.uint8).reshape(words.shape + (4,))
    return np.unpackbits(as_bytes, axis=-1, bitorder="little").reshape(words.shape + (32,)) == 1


def test_shifts_and_low_masks_at_every_amount():
    x = np.array([-1, -(2**31), 0x12345678, 1], np.int32)[:, None]
    as_u = x.view(np.uint32).astype(np.uint64)
    k = np.broadcast_to(np.arange(33, dtype=np.int32), (4, 33))  # every amount at once
    right = ((as_u >> k.astype(np.uint64)) & 0xFFFFFFFF).astype(np.uint32)
    left = ((as_u << k.astype(np.uint64)) & 0xFFFFFFFF).astype(np.uint32)
    ks = np.arange(-3, 37, dtype=np.int32)
    for mode, wrap in compiled_modes(jax_jit=False):
        got = np.asarray(wrap(bit_fields.shift_right_by)(x, k[:, :32])).view(np.uint32)
        np.testing.assert_array_equal(got, right[:, :32], err_msg=mode)
        got = np.asarray(wrap(bit_fields.shift_right_by_up_to_32)(x, k[:, 1:])).view(np.uint32)
        np.testing.assert_array_equal(got, right[:, 1:], err_msg=mode)
        got = np.asarray(wrap(bit_fields.shift_left_by_up_to_32)(x, k[:, 1:])).view(np.uint32)
        np.testing.assert_array_equal(got, left[:, 1:], err_msg=mode)
        got = _unpack(wrap(bit_fields.bits_from)(ks))
        want = np.arange(32)[None, :] >= np.clip(ks, 0, 32)[:, None]
        np.testing.assert_array_equal(got, want, err_msg=mode)


@pytest.mark.parametrize("density", [0.03, 0.5, 0.97])
def test_compress_and_expand_are_pext_and_pdep(density):
    rng = np.random.default_rng(int(density * 100))
    x, x_bits = _words(rng, (300,), 0.5)
    m, m_bits = _words(rng, (300,), density)
    m[:3] = [0, -1, np.int32(-(2**31))]  # no bit, every bit, the sign bit alone
    m_bits[:3] = _unpack(m[:3])
    want_compress = np.zeros((300, 32), bool)
    want_expand = np.zeros((300, 32), bool)
    for i in range(300):
        chosen = np.flatnonzero(m_bits[i])
        want_compress[i, : chosen.size] = x_bits[i, chosen]
        want_expand[i, chosen] = x_bits[i, : chosen.size]
    host_moves = bit_fields.host_compress_moves(m)
    for mode, wrap in compiled_modes(jax_jit=False):
        for moves in (None, host_moves):  # computed in the graph, or precomputed
            compress = np.asarray(wrap(lambda x, m: bit_fields.compress(x, m, moves))(x, m))
            expand = np.asarray(wrap(lambda x, m: bit_fields.expand(x, m, moves))(x, m))
            np.testing.assert_array_equal(_unpack(compress), want_compress, err_msg=mode)
            np.testing.assert_array_equal(_unpack(expand), want_expand, err_msg=mode)


@pytest.mark.parametrize("width", [1, 2, 3, 7])
@pytest.mark.parametrize("start_density", [0.0, 0.02, 0.3, 1.0])
def test_segment_any_marks_each_segment_with_a_set_bit(width, start_density):
    rng = np.random.default_rng(width * 10 + int(start_density * 10))
    bits, bit_flags = _words(rng, (50, width), 0.04)
    starts, start_flags = _words(rng, (50, width), start_density)
    bit_flags = bit_flags.reshape(50, -1)
    start_flags = start_flags.reshape(50, -1)
    want = np.zeros_like(start_flags)
    for r in range(50):
        opened = np.flatnonzero(start_flags[r])
        for a, b in zip(opened, list(opened[1:]) + [width * 32]):
            want[r, a] = bit_flags[r, a:b].any()
    masks = bit_fields.segment_masks(starts)
    for mode, wrap in compiled_modes(jax_jit=False):
        got = _unpack(wrap(bit_fields.segment_any)(bits, starts, masks)).reshape(50, -1)
        np.testing.assert_array_equal(got, want, err_msg=mode)


def _index(vocab, n, length, dense_levels, seed, heavy=False):
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, vocab, (n, length))
    if heavy:  # one first token holds a third of the members: a wide window
        rows[: n // 3, 0] = 1
    rows = np.unique(rows, axis=0)
    return StaticIndex.build(rows, vocab, dense_levels=dense_levels)


def _sets(index, seed):
    rng = np.random.default_rng(seed)
    n = index.num_members
    return EligibilitySets.build(
        index,
        {
            "third": rng.choice(n, n // 3, replace=False),
            "few": rng.choice(n, 4, replace=False),
            "empty": [],
            "all": np.arange(n),
        },
    )


@pytest.mark.parametrize(
    "vocab, n, length, dense_levels, heavy",
    [
        (16, 600, 4, 2, True),
        # Two derived depths at a larger scale: 8 s, the slow step's.
        pytest.param(40, 3000, 5, 3, False, marks=pytest.mark.slow),
        (5, 80, 4, 3, False),
        (300, 2000, 3, 2, True),
    ],
)
def test_derived_rows_equal_the_stored_rows(vocab, n, length, dense_levels, heavy):
    index = _index(vocab, n, length, dense_levels, seed=vocab, heavy=heavy)
    layout = index.layout
    table = dense_eligibility.dense_boundary_table(layout, index.arrays)
    offsets = dense_eligibility.dense_boundary_offsets(layout)
    members = layout.num_members
    sets = _sets(index, vocab)
    # Derive every depth after the first, whatever the size rule would choose.
    windows = (0,) + tuple(
        derived_dense_masks.widest_range(table[offsets[t] : offsets[t] + vocab**t + 1])
        for t in range(1, dense_levels)
    )
    if heavy:
        assert windows[1] > 2  # a code's members span several words
    stored = dense_eligibility.dense_eligibility_masks(vocab, dense_levels, table, sets)
    words = sets.device_arrays()["eligibility_words"]
    index_masks = index.arrays["dense_masks"].astype(np.int32)
    for t in range(1, dense_levels):
        first = sum(vocab**u for u in range(t))
        rows = slice(first, first + vocab**t)
        fields = derived_dense_masks.code_fields(vocab, members, table, offsets, t, windows[t])
        masks = derived_dense_masks.mask_fields(index_masks[rows])
        first_word = (table[offsets[t] : offsets[t] + vocab**t] >> 5).astype(np.int32)
        for s in range(sets.num_sets):
            for mode, wrap in compiled_modes(jax_jit=False):

                def derive(set_rows):
                    return derived_dense_masks.derived_words(
                        words, list(np.moveaxis(fields, 1, 0)), list(np.moveaxis(masks, 1, 0)),
                        first_word, set_rows, index_masks[rows],
                    )  # fmt: skip

                got = wrap(derive)(np.full(vocab**t, s, np.int32))
                np.testing.assert_array_equal(
                    np.asarray(got), stored[s, rows], err_msg=f"depth {t} set {s} {mode}"
                )
    if keras.config.backend() == "tensorflow":
        # Rows unknown until run time (a served signature), under XLA too.
        import tensorflow as tf

        t = dense_levels - 1
        first = sum(vocab**u for u in range(t))
        rows = slice(first, first + vocab**t)
        fields = derived_dense_masks.code_fields(vocab, members, table, offsets, t, windows[t])
        masks = derived_dense_masks.mask_fields(index_masks[rows])
        first_word = (table[offsets[t] : offsets[t] + vocab**t] >> 5).astype(np.int32)

        @tf.function(jit_compile=True, input_signature=[tf.TensorSpec([None], tf.int32)])
        def served(set_rows):
            return derived_dense_masks.derived_words(
                words, list(np.moveaxis(fields, 1, 0)), list(np.moveaxis(masks, 1, 0)),
                first_word, set_rows, index_masks[rows],
            )  # fmt: skip

        got = served(np.zeros(vocab**t, np.int32))
        np.testing.assert_array_equal(np.asarray(got), stored[0, rows])


def test_mask_rows_read_or_recompute_the_stored_planes():
    """`mask_rows` gathers the 6 planes op by op and recomputes the 5 moves
    when compiled: the same planes in every mode, for any rows (repeats too)."""
    rng = np.random.default_rng(3)
    index_masks = rng.integers(-(2**31), 2**31, (40, 3), dtype=np.int64).astype(np.int32)
    index_masks[0] = 0  # a code with no child
    index_masks[1] = -1  # every child
    fields = derived_dense_masks.mask_fields(index_masks)
    table = derived_dense_masks.planes_first(fields)
    rows = np.r_[rng.integers(0, 40, 25), [0, 1, 39, 0]].astype(np.int32)
    for mode, wrap in compiled_modes(jax_jit=False):
        got = wrap(lambda r, w: derived_dense_masks.mask_rows(table, r, w))(rows, index_masks[rows])
        assert len(got) == derived_dense_masks.MASK_FIELDS
        for plane, value in enumerate(got):
            np.testing.assert_array_equal(
                np.asarray(value), fields[rows, plane], err_msg=f"{mode} plane {plane}"
            )


def test_windows_store_cheap_depths_and_derive_the_rest():
    # N = 1e5-like density at a small scale: V = 64, d = 2, 2000 members.
    index = _index(64, 2000, 4, 2, seed=1)
    layer = ConstrainedDecoding(index, eligibility=_sets(index, 1))
    assert layer.eligibility_windows[0] == 0 and layer.eligibility_windows[1] > 0
    # Stored rows: depth 0 only; one start bit per existing code of depth 2.
    assert tuple(layer.eligibility_weights["eligibility_dense"].shape) == (4, 1, 2)
    fields = np.asarray(layer.member_range_weights["dense_code_fields_1"])
    fields = fields.reshape(derived_dense_masks.CODE_FIELDS, 64, -1)  # planes first
    codes = np.unique(index.sequences()[:, :2], axis=0)
    assert int(np.bitwise_count(fields[1].view(np.uint32)).sum()) == len(codes)
    # Many members per code of depth 1: V * 32 bits per set are cheap, stored.
    dense = _index(4, 400, 6, 3, seed=2)
    windows = ConstrainedDecoding(dense, eligibility=_sets(dense, 2)).eligibility_windows
    assert windows[:2] == (0, 0) and windows[2] > 0
    # Config round trip: the windows come back, and the index loads into it.
    config = layer.get_config()
    assert config["eligibility_windows"] == list(layer.eligibility_windows)
    rebuilt = ConstrainedDecoding.from_config(config)
    rebuilt.set_index(index)
    assert rebuilt.eligibility_windows == layer.eligibility_windows
    with pytest.raises(ValueError, match="eligibility_windows"):
        ConstrainedDecoding(index, eligibility=_sets(index, 1), eligibility_windows=[0, 1])
    with pytest.raises((ValueError, TypeError), match="the first 0"):  # Keras wraps it
        ConstrainedDecoding.from_config({**config, "eligibility_windows": [3, 0]})
    # An index whose codes need a wider window than the layer reads does
    # not load into it (same layout, narrower window in the config).
    narrow = {**config, "eligibility_windows": [0, layer.eligibility_windows[1] - 1]}
    with pytest.raises(ValueError, match="needs .* words"):
        ConstrainedDecoding.from_config(narrow).set_index(index)


def test_a_config_without_windows_stores_every_depth():
    # Layers saved before derived rows existed keep their stored masks.
    index = _index(64, 2000, 4, 2, seed=1)
    config = ConstrainedDecoding(index, eligibility=_sets(index, 1)).get_config()
    del config["eligibility_windows"]
    old = ConstrainedDecoding.from_config(config)
    assert old.eligibility_windows == (0, 0)
    assert tuple(old.eligibility_weights["eligibility_dense"].shape) == (4, 65, 2)
    old.set_index(index)
    old.set_eligibility(_sets(index, 1))
    new = ConstrainedDecoding(index, eligibility=_sets(index, 1))
    states = index.walk(np.unique(index.sequences()[:, :1], axis=0)).astype(np.int32)
    set_ids = np.arange(states.size, dtype=np.int32) % 4
    for step in (1, None):
        np.testing.assert_array_equal(
            np.asarray(old.allowed_mask(states, step, eligibility=Eligibility(set_ids, None))),
            np.asarray(new.allowed_mask(states, step, eligibility=Eligibility(set_ids, None))),
        )


def test_stored_and_derived_depths_side_by_side_keep_the_enterable_tokens():
    index = _index(4, 400, 6, 3, seed=3)
    sets = _sets(index, 3)
    layer = ConstrainedDecoding(index, eligibility=sets)
    assert layer.eligibility_windows[1] == 0 and layer.eligibility_windows[2] > 0
    sequences = index.sequences()
    rng = np.random.default_rng(4)
    for step in range(3):
        prefixes = np.unique(sequences[:, :step], axis=0)
        states = index.walk(prefixes)[rng.integers(0, len(prefixes), 40)].astype(np.int32)
        set_ids = rng.integers(-1, sets.num_sets, states.size).astype(np.int32)
        allowed = index.allowed_tokens(states)
        for any_step in (step, None, ops.convert_to_tensor(step)):
            got = np.asarray(
                layer.allowed_mask(states, any_step, eligibility=Eligibility(set_ids, None))
            )
            for r in range(states.size):
                tokens = np.flatnonzero(allowed[r])
                nxt = index.next_states(np.full(tokens.size, states[r]), tokens)
                lo, hi = index.member_ranges(nxt)
                keep = hi > lo if set_ids[r] < 0 else sets.count(set_ids[r], lo, hi) > 0
                assert np.flatnonzero(got[r]).tolist() == tokens[keep].tolist(), (step, r)
