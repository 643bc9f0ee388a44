"""`ServerLimits`: what one request may cost the development server.

A plain dataclass with no TensorFlow import, so the command line can show
the defaults in `serve-dev --help` without loading anything heavy.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ServerLimits:
    """What one request may cost the development server.

    Attributes:
        max_body_bytes: largest REST body read; a larger one is answered 413
            without being read. Defaults to 16 MiB.
        read_timeout_seconds: time a REST client has to send its headers and
            its whole body; past it the answer is 408 and the connection
            closes. Defaults to 30.
        max_batch_rows: most rows in one request (gRPC or REST); more is
            INVALID_ARGUMENT, so one huge batch cannot hold the server while
            small requests wait (the real server's batching refuses a task
            above `max_batch_size` the same way). 0 disables the limit.
            Defaults to 256.
        max_grpc_message_bytes: largest gRPC request. Defaults to 4 MiB
            (gRPC's own default).
    """

    max_body_bytes: int = 16 * 2**20
    read_timeout_seconds: float = 30.0
    max_batch_rows: int = 256
    max_grpc_message_bytes: int = 4 * 2**20

    def __post_init__(self):
        for name in ("max_body_bytes", "read_timeout_seconds", "max_grpc_message_bytes"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"`{name}` must be positive. Received: {name}={value}")
        if self.max_batch_rows < 0:
            raise ValueError(
                f"`max_batch_rows` must be >= 0 (0: no limit). Received: {self.max_batch_rows}"
            )
