"""Status codes of the development server, as `tensorflow_model_server` uses them.

Every failure answered to a client is a `ServingFailure` carrying a gRPC
status code name. REST answers map it to the HTTP status the real server
uses (tensorflow_serving/model_servers/http_server.cc, `ToHTTPStatusCode`),
and errors raised by the graph keep their TensorFlow code: a failed
`tf.debugging` check or an out-of-range gather is INVALID_ARGUMENT (HTTP 400),
as the real server reports the `Session::Run` status it gets.
"""

from __future__ import annotations

# tensorflow_serving/model_servers/http_server.cc, ToHTTPStatusCode.
HTTP_STATUS = {
    "CANCELLED": 499,
    "UNKNOWN": 500,
    "INVALID_ARGUMENT": 400,
    "DEADLINE_EXCEEDED": 504,
    "NOT_FOUND": 404,
    "ALREADY_EXISTS": 409,
    "PERMISSION_DENIED": 403,
    "RESOURCE_EXHAUSTED": 429,
    "FAILED_PRECONDITION": 400,
    "ABORTED": 409,
    "OUT_OF_RANGE": 400,
    "UNIMPLEMENTED": 501,
    "INTERNAL": 500,
    "UNAVAILABLE": 503,
    "DATA_LOSS": 500,
    "UNAUTHENTICATED": 401,
}


class ServingFailure(Exception):
    """An error answered to the client, with a gRPC status code name."""

    def __init__(self, code: str, message: str):
        if code not in HTTP_STATUS:
            raise ValueError(f"Unknown status code {code!r}")
        super().__init__(message)
        self.code = code

    @property
    def http_status(self) -> int:
        return HTTP_STATUS[self.code]


def failure_from_tf_error(error) -> ServingFailure:
    """A `tf.errors.OpError` as the status the real server would answer."""
    import grpc

    code = next((c.name for c in grpc.StatusCode if c.value[0] == error.error_code), "UNKNOWN")
    if code not in HTTP_STATUS:
        code = "UNKNOWN"
    return ServingFailure(code, error.message)
