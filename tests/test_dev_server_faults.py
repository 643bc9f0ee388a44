"""Fault and abuse suite for the development server.

Each malformed or abusive request must get an answer with the status code
`tensorflow_model_server` uses (gRPC code, or its HTTP mapping), and a good
request must still be answered right after it.
"""

import http.client
import json
import logging
import re
import socket

import numpy as np
import pytest
from conftest import CONTEXT_VOCAB
from conftest import histories

from static_keras.export import publish
from static_keras.serving import GrpcClient
from static_keras.serving import RestClient
from static_keras.serving import ServedModel
from static_keras.serving import ServingError
from static_keras.serving.dev_server import DevServer
from static_keras.serving.dev_server import ServerLimits

LIMITS = ServerLimits(max_body_bytes=1_000_000, read_timeout_seconds=1.0, max_batch_rows=8)


@pytest.fixture(scope="module")
def server(small_model, tmp_path_factory):
    _, model = small_model
    base = tmp_path_factory.mktemp("faults") / "recs"
    publish(model, base, warmup_batch_sizes=(1,))
    with DevServer([ServedModel("recs", str(base))], limits=LIMITS) as running:
        yield running


@pytest.fixture(scope="module")
def expected(small_model):
    _, model = small_model
    return model.predict(histories(2, seed=3), verbose=0)


def still_answers(server, expected):
    """A good request over gRPC and REST, right after a bad one."""
    batch = histories(2, seed=3)
    with GrpcClient(server.grpc_address) as client:
        answers = [client.predict("recs", {"history": batch})]
    answers.append(RestClient(server.rest_url).predict("recs", {"history": batch}))
    for answer in answers:
        assert answer["model_version"] == 1
        np.testing.assert_array_equal(answer["item_ids"], expected["item_ids"])


def raw_http(server, head: bytes, body: bytes = b"") -> tuple[int, dict]:
    """Sends exactly these bytes; returns the HTTP status and the JSON body."""
    host, port = server.rest_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head + body)
        response = http.client.HTTPResponse(sock)
        response.begin()
        return response.status, json.loads(response.read())


def post(path: str, body: bytes, length: str | None = "auto") -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    if length == "auto":
        length = str(len(body))
    if length is not None:
        head += f"Content-Length: {length}\r\n"
    return (head + "\r\n").encode()


PREDICT = "/v1/models/recs:predict"
ROW = [1, 2, 3, 4, 5]

# (name, request head, body, HTTP status, message)
REST_CASES = [
    ("instance not an object", json.dumps({"instances": [{"history": ROW}, 5]}), 400,
     "instance 1 is a int but instance 0 is a dict"),
    ("body not an object", "[1, 2]", 400, "must be a JSON object; got list"),
    ("deep JSON", "[" * 100_000 + "]" * 100_000, 400, "nested too deeply"),
    ("not JSON", "{'instances': 1}", 400, "Malformed JSON"),
    ("bad UTF-8", b'{"instances": "\xff"}', 400, "Malformed JSON"),
    ("zero rows, columnar", json.dumps({"inputs": {"history": []}}), 400,
     "'history' is an empty list"),
    ("zero rows, instances", json.dumps({"instances": []}), 400, "'instances' is an empty list"),
    ("floats for int32", json.dumps({"inputs": {"history": [[1.5] * 5]}}), 400,
     "must hold integers"),
    ("past int32", json.dumps({"inputs": {"history": [[2**40] * 5]}}), 400, "range of int32"),
    ("ragged", json.dumps({"inputs": {"history": [[1, 2], [3]]}}), 400, "ragged"),
    ("too many rows", json.dumps({"inputs": {"history": [ROW] * 9}}), 400, "max_batch_rows=8"),
    ("id past the embedding", json.dumps({"inputs": {"history": [[10**6] * 5]}}), 400,
     f"outside \\[0, {CONTEXT_VOCAB}\\)"),
    ("negative id", json.dumps({"inputs": {"history": [[-1] * 5]}}), 400,
     f"outside \\[0, {CONTEXT_VOCAB}\\)"),
]  # fmt: skip


@pytest.mark.parametrize("name,body,status,message", REST_CASES, ids=[c[0] for c in REST_CASES])
def test_malformed_rest_bodies(server, expected, name, body, status, message):
    data = body if isinstance(body, bytes) else body.encode()
    got, answer = raw_http(server, post(PREDICT, data), data)
    assert got == status
    assert re.search(message, answer["error"]), answer
    still_answers(server, expected)


@pytest.mark.parametrize(
    "name,head,status,message",
    [
        ("Content-Length abc", post(PREDICT, b"", "abc"), 400, "non-negative integer; got 'abc'"),
        ("Content-Length -1", post(PREDICT, b"", "-1"), 400, "non-negative integer; got '-1'"),
        ("no Content-Length", post(PREDICT, b"", None), 411, "needs a Content-Length"),
        ("not the REST API", post("/v2/x", b"{}") + b"{}", 404, "No handler"),
        (
            "malformed path",
            post("/v1/models/recs/versions/x:predict", b"{}") + b"{}",
            400,
            "Malformed request",
        ),
        ("body over the limit", post(PREDICT, b"", str(10**9)), 413, "max_body_bytes=1000000"),
        ("body never sent", post(PREDICT, b"", "1000"), 408, "read_timeout_seconds=1.0"),
        ("body cut short", post(PREDICT, b"", "1000") + b'{"inputs"', 408, "9 received"),
    ],
)
def test_transport_abuse_gets_an_answer(server, expected, name, head, status, message):
    got, answer = raw_http(server, head)
    assert got == status and message in answer["error"], answer
    still_answers(server, expected)


def test_grpc_abuse_gets_status_codes(server, expected):
    import tensorflow as tf
    from tensorflow.core.framework import tensor_pb2
    from tensorflow.core.framework import types_pb2

    with GrpcClient(server.grpc_address) as client:
        for dtype in (types_pb2.DT_VARIANT, types_pb2.DT_RESOURCE):
            proto = tensor_pb2.TensorProto(dtype=dtype)
            proto.tensor_shape.dim.add(size=1)
            with pytest.raises(ServingError, match="INVALID_ARGUMENT: tensor parsing error"):
                client.predict("recs", {"history": proto})
            still_answers(server, expected)
        outside = f"(?s)INVALID_ARGUMENT.*outside \\[0, {CONTEXT_VOCAB}\\)"
        cases = [
            (np.full((1, 5), 10**6, "int32"), outside),
            (np.full((1, 5), -1, "int32"), outside),
            (histories(9), "INVALID_ARGUMENT.*9 rows.*max_batch_rows=8"),
            (tf.constant(["a"] * 5, shape=(1, 5)).numpy(), "INVALID_ARGUMENT.*int32 but string"),
        ]
        for value, message in cases:
            with pytest.raises(ServingError, match=message):
                client.predict("recs", {"history": value})
            still_answers(server, expected)


def test_version_is_logged_and_returned(small_model, tmp_path, caplog):
    _, model = small_model
    base = tmp_path / "recs"
    publish(model, base, warmup_batch_sizes=(1,))
    with caplog.at_level(logging.INFO, logger="static_keras.serving"):
        with DevServer([ServedModel("recs", str(base))]) as server:
            answer = RestClient(server.rest_url).predict("recs", {"history": histories(1)})
    assert answer["model_version"] == 1
    assert any("version 1 loaded and warmed up" in r.getMessage() for r in caplog.records)


def test_limits_are_checked():
    with pytest.raises(ValueError, match="`max_body_bytes` must be positive"):
        ServerLimits(max_body_bytes=0)
    with pytest.raises(ValueError, match="`max_batch_rows` must be >= 0"):
        ServerLimits(max_batch_rows=-1)


@pytest.fixture(scope="module")
def published(small_model, tmp_path_factory):
    _, model = small_model
    base = tmp_path_factory.mktemp("ports") / "recs"
    publish(model, base, warmup_batch_sizes=(1,))
    return base


def busy_grpc_port():
    """A gRPC server with gRPC's default options (SO_REUSEPORT on), as a second
    static-keras or any other gRPC server holds its port."""
    from concurrent import futures

    import grpc

    holder = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    port = holder.add_insecure_port("127.0.0.1:0")
    holder.start()
    return holder, port


def test_busy_ports_are_refused_before_any_model_loads(published):
    from static_keras.serving.dev_server import PortUnavailableError

    holder, grpc_port = busy_grpc_port()
    rest_holder = socket.create_server(("127.0.0.1", 0))
    rest_port = rest_holder.getsockname()[1]
    try:
        for kwargs, message in (
            ({"grpc_port": grpc_port}, rf"gRPC port {grpc_port} .* DevServer\(grpc_port=\.\.\.\)"),
            ({"rest_port": rest_port}, rf"REST port {rest_port} .* DevServer\(rest_port=\.\.\.\)"),
        ):
            server = DevServer([ServedModel("recs", str(published))], **kwargs)
            with pytest.raises(PortUnavailableError, match=message) as raised:
                server.start()
            assert isinstance(raised.value, OSError) and "\n" not in str(raised.value)
            assert server.manager("recs").status(None, None) == []  # nothing loaded
            server.stop()
        # Both ports are free again once refused: nothing was left bound.
        with DevServer([ServedModel("recs", str(published))]) as running:
            assert running.manager("recs").resolve(None, None).version == 1
    finally:
        holder.stop(None)
        rest_holder.close()


@pytest.mark.parametrize("busy", ["--port", "--rest_api_port"])
def test_serve_dev_refuses_a_busy_port_in_one_line(published, busy):
    import subprocess
    import sys

    holder, grpc_port = busy_grpc_port()
    rest_holder = socket.create_server(("127.0.0.1", 0))
    ports = {"--port": grpc_port, "--rest_api_port": rest_holder.getsockname()[1]}
    free = {"--port": "0", "--rest_api_port": "0", busy: str(ports[busy])}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "static_keras.cli", "serve-dev", "--model_name", "recs",
             "--model_base_path", str(published), "--run-seconds", "5",
             *(item for flag, port in free.items() for item in (flag, port))],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    finally:
        holder.stop(None)
        rest_holder.close()
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "loaded and warmed up" not in done.stderr
    # Refused before gRPC tries the port (it would log its own "Failed to add port").
    assert "add_port" not in done.stderr and "Failed to add port" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("static-keras: error: ") and f"port {ports[busy]}" in last
    assert last.endswith(f"choose another with {busy}"), last
