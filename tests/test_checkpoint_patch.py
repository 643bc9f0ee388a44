"""`checkpoint_patch.replace_tensors`: a checkpoint with a few tensors
replaced, written as TensorFlow's own reader, `tf.train.Checkpoint` and TF
Serving's C++ `LoadSavedModel` read it; chained refreshes drop shards no
tensor reads; corruption and bad values are refused."""

from __future__ import annotations

import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import CONTEXT_VOCAB
from conftest import HISTORY
from conftest import histories
from conftest import make_index

from static_keras import CachedTransformerDecoder
from static_keras import ConstrainedBeamSearch
from static_keras import ConstrainedDecoding
from static_keras.export import ELIGIBLE_SIGNATURE
from static_keras.export import publish
from static_keras.export import read_eligibility
from static_keras.export import refresh_eligibility
from static_keras.export.checkpoint_patch import _entry_bytes
from static_keras.export.checkpoint_patch import _header_bytes
from static_keras.export.checkpoint_patch import _parse_entry
from static_keras.export.checkpoint_patch import _parse_header
from static_keras.export.checkpoint_patch import _read
from static_keras.export.checkpoint_patch import _read_table
from static_keras.export.checkpoint_patch import _table
from static_keras.export.checkpoint_patch import read_tensors
from static_keras.export.checkpoint_patch import replace_tensors
from static_keras.export.checkpoint_patch import tensor_specs
from static_keras.export.checkpoint_patch import verify_tensors
from static_keras.index.eligibility import EligibilitySets
from static_keras.index.member_catalogue import MemberCatalogue
from static_keras.serving.cc_loader import compiler

KEY = "{}/.ATTRIBUTES/VARIABLE_VALUE"


def _variables(count: int = 40) -> dict[str, tf.Variable]:
    variables = {
        "a": tf.Variable(np.arange(10, dtype=np.int32)),
        "b": tf.Variable(np.ones((3, 4), np.float32)),
    }
    for i in range(count):  # more entries than one restart interval of the table
        variables[f"v{i:02d}"] = tf.Variable(np.full(5, i, np.int64))
    return variables


def test_replaced_tensors_read_back_and_the_rest_is_untouched(tmp_path):
    variables = _variables()
    tf.train.Checkpoint(**variables).write(str(tmp_path / "x"))
    new_a = np.arange(10, dtype=np.int32)[::-1].copy()
    replace_tensors(str(tmp_path / "x"), str(tmp_path / "y"), {KEY.format("a"): new_a})
    reader = tf.train.load_checkpoint(str(tmp_path / "y"))
    np.testing.assert_array_equal(reader.get_tensor(KEY.format("a")), new_a)
    for i in range(40):
        np.testing.assert_array_equal(reader.get_tensor(KEY.format(f"v{i:02d}")), np.full(5, i))
    # The source's shard is linked, not copied; the new one holds only `a`.
    source = tmp_path / "x.data-00000-of-00001"
    assert os.path.samefile(source, tmp_path / "y.data-00000-of-00002")
    assert os.path.getsize(tmp_path / "y.data-00001-of-00002") == new_a.nbytes

    # A second refresh from the first: the first's new shard is read by no
    # tensor any more and is not carried.
    replace_tensors(
        str(tmp_path / "y"),
        str(tmp_path / "z"),
        {KEY.format("a"): np.full(10, 7, np.int32), KEY.format("v03"): np.zeros(5, np.int64)},
    )
    assert sorted(p.name for p in tmp_path.glob("z.*")) == [
        "z.data-00000-of-00002", "z.data-00001-of-00002", "z.index"
    ]  # fmt: skip
    restored = _variables()
    tf.train.Checkpoint(**restored).read(str(tmp_path / "z")).assert_consumed()
    np.testing.assert_array_equal(restored["a"].numpy(), np.full(10, 7))
    np.testing.assert_array_equal(restored["v03"].numpy(), np.zeros(5))
    np.testing.assert_array_equal(restored["v04"].numpy(), np.full(5, 4))
    np.testing.assert_array_equal(restored["b"].numpy(), np.ones((3, 4)))


def test_the_table_reads_and_writes_what_tensorflow_writes(tmp_path):
    tf.train.Checkpoint(**_variables()).write(str(tmp_path / "x"))
    entries = _read_table(_read(str(tmp_path / "x.index")))
    assert entries[0][0] == b"" and [k for k, _ in entries] == sorted(k for k, _ in entries)
    assert _read_table(_table(entries)) == entries
    # The protos round-trip byte for byte, the object graph's string entry included.
    assert _header_bytes(_parse_header(entries[0][1])) == entries[0][1]
    assert all(_entry_bytes(_parse_entry(value)) == value for _, value in entries[1:])
    # The tensors read back as TensorFlow reads them.
    reader = tf.train.load_checkpoint(str(tmp_path / "x"))
    keys = [KEY.format("a"), KEY.format("b"), KEY.format("v07")]
    for key, value in read_tensors(str(tmp_path / "x"), keys).items():
        expected = reader.get_tensor(key)
        assert value.dtype == expected.dtype and np.array_equal(value, expected)
    specs = tensor_specs(str(tmp_path / "x"))
    assert specs[KEY.format("b")] == (1, (3, 4))  # DT_FLOAT
    assert set(specs) == set(reader.get_variable_to_shape_map())


def test_bad_values_and_corruption_are_refused(tmp_path):
    tf.train.Checkpoint(**_variables()).write(str(tmp_path / "x"))
    prefix, target = str(tmp_path / "x"), str(tmp_path / "y")
    with pytest.raises(ValueError, match=r"holds int32 \(10,\); the new value is int64"):
        replace_tensors(prefix, target, {KEY.format("a"): np.arange(10)})
    with pytest.raises(ValueError, match=r"int32 \(10,\); the new value is int32 \(9,\)"):
        replace_tensors(prefix, target, {KEY.format("a"): np.arange(9, dtype=np.int32)})
    with pytest.raises(ValueError, match="has no tensors"):
        replace_tensors(prefix, target, {KEY.format("nope"): np.arange(9, dtype=np.int32)})
    with pytest.raises(ValueError, match="only whole numeric"):
        replace_tensors(prefix, target, {"_CHECKPOINTABLE_OBJECT_GRAPH": np.array(b"x")})
    with pytest.raises(ValueError, match="has no tensor"):
        read_tensors(prefix, ["nope"])
    index = bytearray(_read(prefix + ".index"))
    index[10] ^= 0xFF
    (tmp_path / "bad.index").write_bytes(bytes(index))
    with pytest.raises(ValueError, match="checksum mismatch"):
        replace_tensors(str(tmp_path / "bad"), target, {})
    (tmp_path / "short.index").write_bytes(bytes(index[:30]))
    with pytest.raises(ValueError, match="truncated or corrupt"):
        replace_tensors(str(tmp_path / "short"), target, {})
    # Flipped bytes in a written shard: TensorFlow's reader checks the CRC
    # the patch wrote.
    replace_tensors(prefix, target, {KEY.format("a"): np.zeros(10, np.int32)})
    with open(target + ".data-00001-of-00002", "r+b") as file:
        file.write(b"\x01")
    with pytest.raises(tf.errors.OpError, match="Checksum does not match"):
        tf.train.load_checkpoint(target).get_tensor(KEY.format("a"))
    with pytest.raises(ValueError, match="does not match its checksum"):
        read_tensors(target, [KEY.format("a")])
    with pytest.raises(ValueError, match="does not match its checksum"):
        verify_tensors(target, [KEY.format("a")])


def test_values_are_cast_and_written_a_chunk_at_a_time(tmp_path, monkeypatch):
    """A narrower dtype that casts without loss (uint16 tokens into an int32
    tensor) is written in the tensor's dtype, chunk by chunk, with one CRC
    that TensorFlow's reader and `verify_tensors` accept."""
    from static_keras.export import checkpoint_patch

    monkeypatch.setattr(checkpoint_patch, "_CHUNK", 3)  # 10 values: 4 chunks
    tf.train.Checkpoint(**_variables()).write(str(tmp_path / "x"))
    prefix, target = str(tmp_path / "x"), str(tmp_path / "y")
    value = np.arange(10, 20, dtype=np.uint16)
    replace_tensors(prefix, target, {KEY.format("a"): value})
    verify_tensors(target, [KEY.format("a")])
    got = tf.train.load_checkpoint(target).get_tensor(KEY.format("a"))
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, value)
    with pytest.raises(ValueError, match="the new value is float64"):
        replace_tensors(prefix, target + "z", {KEY.format("a"): value.astype(float)})


@pytest.mark.skipif(compiler() is None, reason="needs a C++ compiler (g++)")
def test_refreshed_versions_load_in_tf_servings_load_path(tmp_path):
    """Two refreshes in a row, then TF Serving's C++ `LoadSavedModel` (XLA
    off) answers the eligible signature with the new sets."""
    from static_keras.serving.cc_loader import build_runner
    from static_keras.serving.cc_loader import run_saved_model

    index = make_index(1)
    ids = MemberCatalogue.from_index(index).item_ids
    keras.utils.set_random_seed(0)
    decoder = CachedTransformerDecoder(
        index.vocab_size, index.length, context_vocab_size=CONTEXT_VOCAB, hidden_dim=16
    )
    sets = EligibilitySets.build(index, {"in_stock": ids[::2]})
    layer = ConstrainedDecoding(index, eligibility=sets, name="constraint")
    search = ConstrainedBeamSearch(constraint=layer, decoder=decoder, beam_size=4)
    history = keras.Input((HISTORY,), dtype="int32", name="history")
    model = keras.Model(history, search(history))
    base = tmp_path / "recs"
    publish(model, base, warmup_batch_sizes=(1,))
    refresh_eligibility(base, {"in_stock": ids[1::2]})
    third = refresh_eligibility(base, {"in_stock": ids[:5]})
    assert len(list((base / "3" / "variables").glob("variables.data-*"))) == 2
    np.testing.assert_array_equal(
        read_eligibility(third.path).words, EligibilitySets.build(index, {"s": ids[:5]}).words
    )
    runner = build_runner(str(tmp_path / "cc"))
    inputs = {
        "history": histories(3),
        "set_id": np.zeros(3, np.int32),
        "excluded_item_ids": np.full((3, 1), -1, np.int64),
    }
    result = run_saved_model(third.path, inputs, signature=ELIGIBLE_SIGNATURE, binary=runner)
    found = result.outputs["item_ids"]
    assert (found >= 0).any() and np.isin(found[found >= 0], ids[:5]).all()
