"""SavedModel export: round trip, variables stored once, metadata, lint."""

import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import histories
from conftest import make_index
from conftest import make_model

from static_keras.constraint import dense_edge_rows
from static_keras.export import SavedModelCheckError
from static_keras.export import check_saved_model
from static_keras.export import export_saved_model
from static_keras.export import read_metadata
from static_keras.serving.warmup import read_warmup_requests

_FRESH_PROCESS = textwrap.dedent(
    """
    import sys, numpy as np, tensorflow as tf
    path, inputs, out = sys.argv[1:4]
    serve = tf.saved_model.load(path).signatures["serving_default"]
    data = np.load(inputs)
    results = {}
    for batch in ("b1", "b4"):
        outputs = serve(history=tf.constant(data[batch]))
        for name, value in outputs.items():
            results[f"{batch}_{name}"] = value.numpy()
    assert not any(m.startswith("static_keras") for m in sys.modules), "imported"
    np.savez(out, **results)
    """
)


@pytest.mark.slow  # a fresh process, 27 s: in-process round trips run by default
def test_round_trip_in_a_fresh_process(small_model, tmp_path):
    index, model = small_model
    info = export_saved_model(model, tmp_path / "model", warmup_batch_sizes=(1, 4))
    assert info.input_names == ("history",)
    assert info.output_names == ("item_ids", "scores", "tokens")
    batches = {"b1": histories(1, seed=3), "b4": histories(4, seed=4)}
    np.savez(tmp_path / "inputs.npz", **batches)
    result = subprocess.run(
        [sys.executable, "-c", _FRESH_PROCESS, str(tmp_path / "model"),
         str(tmp_path / "inputs.npz"), str(tmp_path / "out.npz")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    served = np.load(tmp_path / "out.npz")
    for batch, inputs in batches.items():
        expected = model.predict(inputs, verbose=0)
        for name in ("tokens", "item_ids"):
            np.testing.assert_array_equal(served[f"{batch}_{name}"], expected[name])
        # `predict` may compile with XLA, the served graph does not: the
        # log-softmax's sum of exponentials is added in another order.
        np.testing.assert_allclose(served[f"{batch}_scores"], expected["scores"], rtol=1e-6)
        assert index.contains(expected["tokens"].reshape(-1, index.length)).all()


def test_each_variable_is_stored_once(small_model, tmp_path):
    _, model = small_model
    info = export_saved_model(model, tmp_path / "model")
    keys = [
        key
        for key, _ in tf.train.list_variables(str(tmp_path / "model" / "variables" / "variables"))
        if key.endswith("VARIABLE_VALUE")
    ]
    expected_bytes = sum(
        int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in model.variables
    )
    assert len(keys) == len(model.variables) == info.num_variables
    assert info.variable_bytes == expected_bytes
    report = check_saved_model(tmp_path / "model")
    assert report.num_variables == len(model.variables)
    assert report.variable_bytes == expected_bytes
    assert report.signatures == ("serving_default",)
    assert report.xla_functions == ()


def test_lint_catches_keras_export_storing_variables_twice(tmp_path, monkeypatch):
    # A dense state map of 600**2 int32 (1.4 MB) makes duplicates count; Keras
    # stores twice the variables its traced function reads, so the layer must
    # read the map (no edge rows at the last dense step).
    monkeypatch.setattr(dense_edge_rows, "WIDTH_FRACTION", 0.0)
    index = make_index(2, n=2000, vocab=600, length=3, dense_levels=2)
    model = make_model(index)
    model.export(str(tmp_path / "keras_export"), verbose=False)
    with pytest.raises(SavedModelCheckError, match="stored twice"):
        check_saved_model(tmp_path / "keras_export")
    export_saved_model(model, tmp_path / "ours")
    check_saved_model(tmp_path / "ours")


def test_xla_export_needs_xla_enabled(small_model, tmp_path):
    _, model = small_model
    export_saved_model(model, tmp_path / "xla", xla=True)
    with pytest.raises(SavedModelCheckError, match="--xla_cpu_compilation_enabled"):
        check_saved_model(tmp_path / "xla")
    report = check_saved_model(tmp_path / "xla", xla_enabled=True)
    assert report.xla_functions


def test_lint_catches_large_constants_and_missing_signature(tmp_path):
    table = np.arange(300_000, dtype=np.int64)

    class Constant(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
        def lookup(self, ids):
            return {"out": tf.gather(tf.constant(table), ids)}

    module = Constant()
    tf.saved_model.save(module, str(tmp_path / "const"), signatures={"other": module.lookup})
    with pytest.raises(SavedModelCheckError) as error:
        check_saved_model(tmp_path / "const", max_constant_bytes=1_000_000)
    assert "no 'serving_default' signature" in str(error.value)
    assert "2,400,000 bytes" in str(error.value)
    with pytest.raises(SavedModelCheckError, match="not a SavedModel"):
        check_saved_model(tmp_path)


def test_metadata_names_the_index(small_model, tmp_path):
    index, model = small_model
    export_saved_model(model, tmp_path / "model", extra_metadata={"freshness_days": 7})
    metadata = read_metadata(tmp_path / "model")
    (entry,) = metadata["indexes"]
    assert entry["checksum"] == index.checksum
    assert entry["num_sequences"] == index.num_sequences
    assert entry["layout"] == index.layout.to_config()
    assert entry["format_version"] == 2 and entry["kind"] == "semantic_ids"
    assert metadata["freshness_days"] == 7
    assert metadata["xla"] is False and metadata["created"].endswith("Z")


def test_warmup_records(small_model, tmp_path):
    _, model = small_model
    export_saved_model(model, tmp_path / "model", warmup_batch_sizes=(1, 3, 32), model_name="recs")
    warmup = tmp_path / "model" / "assets.extra" / "tf_serving_warmup_requests"
    requests = read_warmup_requests(str(warmup))
    assert [r.inputs["history"].tensor_shape.dim[0].size for r in requests] == [1, 3, 32]
    assert {r.model_spec.name for r in requests} == {"recs"}
    assert {r.model_spec.signature_name for r in requests} == {"serving_default"}


def test_bad_exports(small_model, tmp_path):
    _, model = small_model
    os.makedirs(tmp_path / "exists")
    with pytest.raises(ValueError, match="already exists"):
        export_saved_model(model, tmp_path / "exists")
    inputs = keras.Input((3,), name="x")
    with pytest.raises(ValueError, match="dict of named outputs"):
        export_saved_model(keras.Model(inputs, keras.layers.Dense(2)(inputs)), tmp_path / "m")
    assert sorted(os.listdir(tmp_path)) == ["exists"]  # nothing half-written
    with pytest.raises(ValueError, match="1 to 1000"):
        export_saved_model(model, tmp_path / "w", warmup_batch_sizes=())


def test_signature_checks_embedded_ids(small_model, tmp_path):
    """Ids outside the embedding (Keras would wrap -1 silently) fail with InvalidArgument."""
    from conftest import CONTEXT_VOCAB

    from static_keras.export.saved_model import context_id_ranges

    _, model = small_model
    assert context_id_ranges(model) == {"history": (0, CONTEXT_VOCAB)}
    export_saved_model(model, tmp_path / "checked", warmup_batch_sizes=(1,))
    assert read_metadata(tmp_path / "checked")["input_ranges"] == {"history": [0, CONTEXT_VOCAB]}
    checked = tf.saved_model.load(str(tmp_path / "checked")).signatures["serving_default"]
    good = histories(2)
    np.testing.assert_array_equal(
        checked(history=tf.constant(good))["item_ids"], model.predict(good, verbose=0)["item_ids"]
    )
    for bad in (-1, CONTEXT_VOCAB, 10**6):
        value = tf.constant(np.full((1, 5), bad, "int32"))
        with pytest.raises(tf.errors.InvalidArgumentError, match="outside \\[0, 50\\)"):
            checked(history=value)
    with pytest.raises(ValueError, match="`input_ranges` names inputs \\['query'\\]"):
        export_saved_model(model, tmp_path / "x", input_ranges={"query": (0, 5)})
    with pytest.raises(ValueError, match="must be integers low < high"):
        export_saved_model(model, tmp_path / "y", input_ranges={"history": (5, 5)})


def test_warmup_reader_refuses_a_damaged_file(tmp_path):
    # Read without tf.data (which logs a note per read): framing and CRCs checked.
    import tensorflow as tf

    from static_keras.serving.warmup import read_warmup_requests

    path = str(tmp_path / "warmup")
    with tf.io.TFRecordWriter(path) as writer:
        writer.write(b"\x0a\x00")  # an empty PredictionLog with an empty predict_log
    assert len(read_warmup_requests(path)) == 1
    warmup = tmp_path / "warmup"
    data = warmup.read_bytes()
    warmup.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(ValueError, match="warmup: TFRecord data checksum mismatch"):
        read_warmup_requests(path)
    warmup.write_bytes(data[:-3])
    with pytest.raises(ValueError, match="warmup: the TFRecord file is truncated"):
        read_warmup_requests(path)
