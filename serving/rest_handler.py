"""The development server's REST endpoint: `/v1/models/NAME[/versions/N|/labels/L][:predict]`.

Every request gets an HTTP answer, with the status the real server maps its
gRPC code to (`status.HTTP_STATUS`) and a body `{"error": "..."}`. Before a
body is parsed, the transport is checked against the server's limits
(`ServerLimits`): a missing or malformed `Content-Length` (411/400), a body
larger than `max_body_bytes` (413, never read), a body that does not arrive
within `read_timeout_seconds` (408). JSON nested too deeply for the parser
is a 400. These transport answers close the connection.

Predict answers carry the version that served them in an `X-Model-Version`
header (TF Serving's REST body has no version; its gRPC response does).
"""

from __future__ import annotations

import json
import logging
import re
import time
from http.server import BaseHTTPRequestHandler

from static_keras.serving.rest_json import parse_predict_body
from static_keras.serving.rest_json import predict_answer
from static_keras.serving.status import ServingFailure

logger = logging.getLogger("static_keras.serving")

VERSION_HEADER = "X-Model-Version"

_PATH = re.compile(
    r"^/v1/models/(?P<model>[^/:]+)(?:/versions/(?P<version>\d+)|/labels/(?P<label>[^/:]+))?"
    r"(?P<verb>:predict)?$"
)


class _TransportError(Exception):
    """An HTTP-level refusal (length, size, timeout); the connection is closed after it."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def make_handler(server):
    """A `BaseHTTPRequestHandler` class answering for `server` (a `DevServer`)."""
    limits = server.limits

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = limits.read_timeout_seconds  # request line and headers, per read

        def log_message(self, *args):  # requests are not logged to stderr
            pass

        def _reply(self, status: int, body: dict, headers: dict | None = None) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)

        def _answer(self, call) -> None:
            try:
                status, body, headers = call()
            except ServingFailure as failure:
                status, body, headers = failure.http_status, {"error": str(failure)}, None
            except _TransportError as error:
                self.close_connection = True  # the rest of the body is never read
                status, body, headers = error.status, {"error": str(error)}, None
            except Exception as error:  # a bug must still get an answer
                logger.exception("REST handler failed")
                self.close_connection = True
                status, body = 500, {"error": f"{type(error).__name__}: {error}"}
                headers = None
            self._reply(status, body, headers)

        def _route(self):
            if not self.path.lower().startswith("/v1/"):  # not the REST API: as the real server
                raise ServingFailure("NOT_FOUND", f"No handler for {self.command} {self.path}")
            match = _PATH.match(self.path)
            if match is None:
                raise ServingFailure(
                    "INVALID_ARGUMENT", f"Malformed request: {self.command} {self.path}"
                )
            version = match["version"]
            return match["model"], int(version) if version else None, match["label"], match["verb"]

        def _read_body(self) -> bytes:
            text = self.headers.get("Content-Length")
            if text is None:
                raise _TransportError(411, "A POST needs a Content-Length header")
            if not text.strip().isdigit():
                raise _TransportError(
                    400, f"Content-Length must be a non-negative integer; got {text!r}"
                )
            length = int(text)
            if length > limits.max_body_bytes:
                raise _TransportError(
                    413,
                    f"Request body of {length} bytes is larger than the server's "
                    f"max_body_bytes={limits.max_body_bytes}",
                )
            # One deadline for the whole body: a client that trickles bytes
            # cannot hold the connection past it either.
            deadline = time.monotonic() + limits.read_timeout_seconds
            chunks, remaining = [], length
            try:
                while remaining:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError
                    self.connection.settimeout(left)
                    chunk = self.rfile.read1(min(remaining, 1 << 16))
                    if not chunk:
                        raise _TransportError(400, "The connection closed before the body ended")
                    chunks.append(chunk)
                    remaining -= len(chunk)
            except TimeoutError:
                raise _TransportError(
                    408,
                    f"The request body ({length} bytes announced, {length - remaining} received) "
                    f"did not arrive within read_timeout_seconds={limits.read_timeout_seconds}",
                ) from None
            finally:
                self.connection.settimeout(limits.read_timeout_seconds)
            return b"".join(chunks)

        def do_GET(self):  # noqa: N802
            self._answer(self._status)

        def _status(self):
            model, version, label, verb = self._route()
            if verb:
                raise ServingFailure("INVALID_ARGUMENT", f"Use POST for {self.path}")
            rows = server.manager(model).status(version, label)
            statuses = [
                {
                    "version": str(v),
                    "state": state,
                    "status": {
                        "error_code": "OK" if not error else "UNKNOWN",
                        "error_message": error,
                    },
                }
                for v, state, error in rows
            ]
            return 200, {"model_version_status": statuses}, None

        def do_POST(self):  # noqa: N802
            self._answer(self._predict)

        def _predict(self):
            data = self._read_body()
            model, version, label, verb = self._route()
            if not verb:
                raise ServingFailure("INVALID_ARGUMENT", f"Malformed request: POST {self.path}")
            try:
                body = json.loads(data or b"null")
            except RecursionError:
                raise ServingFailure(
                    "INVALID_ARGUMENT", "Malformed JSON: nested too deeply"
                ) from None
            except ValueError as error:  # also bad UTF-8
                raise ServingFailure("INVALID_ARGUMENT", f"Malformed JSON: {error}") from None
            signature = "serving_default"
            if isinstance(body, dict):
                signature = body.get("signature_name") or signature
                if not isinstance(signature, str):
                    raise ServingFailure("INVALID_ARGUMENT", "'signature_name' must be a string")
            with server.manager(model).serving(version, label) as servable:
                specs = servable.input_specs(signature)
                dtypes = {name: spec.dtype.as_numpy_dtype for name, spec in specs.items()}
                inputs, row_form = parse_predict_body(body, dtypes)
                outputs = servable.run(signature, inputs, max_batch_rows=limits.max_batch_rows)
                headers = {VERSION_HEADER: str(servable.version)}
            return 200, predict_answer(outputs, row_form), headers

    return Handler
