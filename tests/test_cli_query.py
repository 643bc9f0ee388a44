"""The command line's own output: a gRPC query that loads no TensorFlow, and
commands that print only their own lines."""

import os
import subprocess
import sys
from concurrent import futures

import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2
from tensorflow_serving.apis import prediction_service_pb2_grpc

from static_keras.cli.serving_commands import _ndarray
from static_keras.cli.serving_commands import _tensor_proto


def _cli(*argv, code: str = "", timeout: float = 120) -> subprocess.CompletedProcess:
    """`static-keras ARGV` in a fresh process; `code` runs after main returns."""
    program = (
        "import sys\nfrom static_keras.cli import main\n"
        f"status = main({list(argv)!r})\n{code}\nsys.exit(status)\n"
    )
    env = dict(os.environ)
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # the default a user has
    return subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=timeout, env=env
    )


@pytest.mark.parametrize(
    "array",
    [
        np.arange(12, dtype="int32").reshape(3, 4) - 5,
        np.arange(6, dtype="int64").reshape(1, 2, 3) * 10**10,
        np.linspace(-1, 1, 5, dtype="float32"),
        np.array([0.5, -2.0], "float64"),
        np.array([[True, False]]),
        np.array([1.5, 2.25], "float16"),
        np.array(7, "uint8"),
        np.zeros((0, 3), "int32"),
    ],
    ids=lambda a: f"{a.dtype}{list(a.shape)}",
)
def test_tensor_protos_as_tensorflow_writes_and_reads_them(array):
    proto = _tensor_proto(array)
    expected = tf.make_tensor_proto(array)
    assert proto.dtype == expected.dtype and proto.tensor_shape == expected.tensor_shape
    np.testing.assert_array_equal(tf.make_ndarray(proto), array)
    np.testing.assert_array_equal(_ndarray(expected), array)
    assert _ndarray(expected).dtype == array.dtype


def test_tensor_protos_with_value_fields():
    """A server may answer with the typed value fields, the last value left implicit."""
    from tensorflow.core.framework import tensor_pb2
    from tensorflow.core.framework import types_pb2

    cases = [
        (types_pb2.DT_INT32, "int_val", [3, 4, 4, 4], [3, 4]),
        (types_pb2.DT_FLOAT, "float_val", [0.5, 0.5, 0.5, 0.5], [0.5]),
        (types_pb2.DT_INT64, "int64_val", [0, 0, 0, 0], []),
        (types_pb2.DT_STRING, "string_val", [b"a", b"b", b"c", b"d"], [b"a", b"b", b"c", b"d"]),
    ]
    for dtype, field, values, sent in cases:
        proto = tensor_pb2.TensorProto(dtype=dtype)
        proto.tensor_shape.dim.add(size=2)
        proto.tensor_shape.dim.add(size=2)
        getattr(proto, field).extend(sent)
        expected = np.array(values, dtype=object if dtype == types_pb2.DT_STRING else None)
        np.testing.assert_array_equal(_ndarray(proto), expected.reshape(2, 2))
        np.testing.assert_array_equal(tf.make_ndarray(proto), expected.reshape(2, 2))


class _EchoServicer(prediction_service_pb2_grpc.PredictionServiceServicer):
    """PredictionService.Predict answering each input as an output, as version 3."""

    def Predict(self, request, context):
        response = predict_pb2.PredictResponse()
        response.model_spec.name = request.model_spec.name
        response.model_spec.version.value = 3
        for name, proto in request.inputs.items():
            response.outputs[name + "_echo"].CopyFrom(proto)
        answer = tf.make_tensor_proto(np.array([[0.25, -1.5]], "float32"))
        response.outputs["scores"].CopyFrom(answer)
        return response


def test_a_grpc_query_loads_no_tensorflow():
    import grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(_EchoServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        after = (
            "loaded = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('tensorflow', 'keras'))\nprint('loaded', loaded)\n"
            # A later import gets the real TensorFlow, whole.
            "import tensorflow as tf\nprint('after', tf.make_ndarray(tf.make_tensor_proto([2])))"
        )
        result = _cli("query", "--grpc", f"127.0.0.1:{port}", "--model", "recs",
                      "--input", "history=3,14;15,92", code=after)  # fmt: skip
    finally:
        server.stop(None)
    assert result.returncode == 0, result.stderr
    assert result.stdout == (
        "history_echo: [[3, 14], [15, 92]]\nmodel_version: 3\nscores: [[0.25, -1.5]]\n"
        "loaded []\nafter [2]\n"
    )


def test_commands_print_only_their_own_lines(tmp_path):
    """No TensorFlow start-up lines (absl banner, oneDNN, CUDA probe) unless --verbose."""
    from static_keras import StaticIndex

    StaticIndex.build(np.array([[0, 1], [1, 0]]), vocab_size=2).save(tmp_path / "index.npz")
    result = _cli("inspect", str(tmp_path / "index.npz"))
    assert result.returncode == 0 and "kind          semantic_ids" in result.stdout
    assert result.stderr == ""
    # serve-dev loads TensorFlow before it reads its input.
    argv = ("serve-dev", "--model_config_file", str(tmp_path / "missing.config"))
    quiet = _cli(*argv, code="assert 'tensorflow.python' in sys.modules")
    assert quiet.returncode == 2
    assert quiet.stderr.startswith("static-keras: error:") and "missing.config" in quiet.stderr
    assert len(quiet.stderr.splitlines()) == 1 and quiet.stdout == ""
    # refresh-eligibility (a rules job) loads neither TensorFlow nor Keras.
    argv = ("refresh-eligibility", "--model-base-path", str(tmp_path / "models"),
            "--set", f"in_stock={tmp_path / 'missing.npy'}")  # fmt: skip
    quiet = _cli(*argv, code="assert 'tensorflow' not in sys.modules")
    assert quiet.returncode == 2
    assert quiet.stderr == f"static-keras: error: no such file: {tmp_path / 'missing.npy'}\n"


def test_retracing_hints_are_dropped_and_other_warnings_kept():
    import logging

    from static_keras.cli.output import _no_retracing_warning

    def record(message):
        return logging.LogRecord("tensorflow", logging.WARNING, "", 0, message, None, None)

    assert not _no_retracing_warning(
        record("5 out of the last 11 calls to <function f> triggered tf.function retracing.")
    )
    assert _no_retracing_warning(record("Skipping variable loading for optimizer 'adam'"))
