"""A development stand-in for `tensorflow_model_server`, for local use and tests.

Production runs the real server (`tensorflow/serving` container image; see
docs/serving.md). This one exists because `tensorflow_model_server` cannot
be installed from PyPI or Debian, and the kit's REST/gRPC wire format and
version swaps still need testing. It is built on the official gRPC servicer
classes and protobufs of `tensorflow-serving-api`, and it mirrors the real
server where the kit depends on it:

- gRPC (`PredictionService.Predict`, `ModelService.GetModelStatus`,
  `grpc_handlers.py`) and REST (`/v1/models/NAME[/versions/N|/labels/L]
  [:predict]`, `instances` and `inputs` forms, `rest_handler.py`) on
  loopback; the same command-line flag names; the same status codes
  (`status.py`) and Predict rules (`servable.py`);
- polls each model's base path; loads a new version, replays its warmup
  records, and only then unloads the old one; a version that fails to load
  or to warm up is rejected while the old one keeps serving
  (`version_manager.py`);
- `models.config` with specific versions and labels, re-read on change;
- XLA disabled unless `xla_enabled`: a version whose functions need XLA is
  rejected, as the real server's warmup would fail on it.

This module holds the lifecycle: start, stop, and the polling of base paths
and of the config file. It does not batch requests, and it runs each version
in a `Session` of its own through Python's v1 SavedModel loader, not
`tensorflow::LoadSavedModel` (the C++ load path is tested separately with
`static_keras.serving.cc_loader`).
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import threading
import time
from concurrent import futures
from http.server import ThreadingHTTPServer

from static_keras.serving.config import ServedModel
from static_keras.serving.limits import ServerLimits
from static_keras.serving.status import ServingFailure
from static_keras.serving.version_manager import VersionManager

__all__ = ["DevServer", "PortUnavailableError", "ServerLimits"]

logger = logging.getLogger("static_keras.serving")


class PortUnavailableError(OSError):
    """A port the development server should listen on is taken (or cannot be
    bound); its message is one line naming the port and the argument to
    change (`command_line_message`: the same with the command-line flag)."""

    def __init__(self, kind, host, port, flag, argument, error: OSError | None = None):
        if error is None or error.errno == errno.EADDRINUSE:
            reason = "is already in use (another server?)"
        else:
            reason = f"cannot be bound ({error.strerror or error})"
        self._what = f"{kind} port {port} on {host} {reason}: choose another with"
        super().__init__(f"{self._what} DevServer({argument}=...)")
        self.errno = errno.EADDRINUSE if error is None else error.errno
        self.port, self.flag = port, flag

    @property
    def command_line_message(self) -> str:
        return f"{self._what} {self.flag}"


def _bind_error(server) -> OSError | None:
    """Why gRPC could not bind its port: a plain bind of the same address says."""
    try:
        probe = socket.create_server((server.host, server._grpc_port))
    except OSError as error:
        return error
    probe.close()
    return None


class DevServer:
    """REST and gRPC TF Serving stand-in on loopback (see the module doc).

    Args:
        models: the models to serve (`ServedModel`s, e.g. from
            `read_models_config`).
        grpc_port: int. 0 picks a free port. Defaults to 0.
        rest_port: int. 0 picks a free port. Defaults to 0.
        host: str. Defaults to "127.0.0.1".
        poll_seconds: float. How often base paths are polled. Defaults to 1.
        xla_enabled: bool. Accept versions that need XLA. Defaults to False.
        config_file: optional `models.config` path, re-read whenever it
            changes (like `--model_config_file_poll_wait_seconds`): moving a
            label there is how a rollback reaches a running server.
        limits: `ServerLimits`. Defaults to `ServerLimits()`.

    Example: `with DevServer([ServedModel("recs", "/models/recs")]) as server:
    GrpcClient(server.grpc_address).predict("recs", {...})`.
    """

    def __init__(
        self,
        models: list[ServedModel] | None = None,
        *,
        grpc_port: int = 0,
        rest_port: int = 0,
        host: str = "127.0.0.1",
        poll_seconds: float = 1.0,
        xla_enabled: bool = False,
        config_file: str | None = None,
        limits: ServerLimits | None = None,
    ):
        from static_keras.serving.config import read_models_config

        self.config_file = config_file
        self._config_mtime = None
        if config_file is not None:
            self._config_mtime = os.path.getmtime(config_file)
            models = read_models_config(config_file)
        if not models:
            raise ValueError("DevServer needs at least one model")
        names = [m.name for m in models]
        if len(set(names)) != len(names):
            raise ValueError(f"Model names must be unique: {names}")
        for model in models:
            model.check()
        self.xla_enabled = xla_enabled
        self.limits = limits or ServerLimits()
        self.managers = {m.name: VersionManager(m, xla_enabled) for m in models}
        self.host = host
        self.poll_seconds = poll_seconds
        self._grpc_port, self._rest_port = grpc_port, rest_port
        self._stop = threading.Event()
        self._poller = None
        self._grpc = None
        self._http = None

    @property
    def grpc_address(self) -> str:
        return f"{self.host}:{self._grpc_port}"

    @property
    def rest_url(self) -> str:
        return f"http://{self.host}:{self._rest_port}"

    def start(self) -> "DevServer":
        """Binds both ports, loads the models, then serves.

        Raises `PortUnavailableError` (an `OSError`) before any model loads
        when a port is taken: gRPC's default `SO_REUSEPORT` would otherwise
        let two servers share one port and split its traffic.
        """
        self._bind()
        try:
            self.poll()
        except BaseException:
            self.stop()
            raise
        self._grpc.start()
        threading.Thread(target=self._http.serve_forever, daemon=True).start()
        self._poller = threading.Thread(target=self._poll_forever, daemon=True)
        self._poller.start()
        logger.info("serving gRPC on %s, REST on %s", self.grpc_address, self.rest_url)
        return self

    def _bind(self) -> None:
        import grpc
        from tensorflow_serving.apis import model_service_pb2_grpc
        from tensorflow_serving.apis import prediction_service_pb2_grpc

        from static_keras.serving.grpc_handlers import ModelServicer
        from static_keras.serving.grpc_handlers import PredictionServicer
        from static_keras.serving.rest_handler import make_handler

        self._grpc = grpc.server(
            futures.ThreadPoolExecutor(max_workers=8),
            options=[
                ("grpc.max_receive_message_length", self.limits.max_grpc_message_bytes),
                ("grpc.so_reuseport", 0),  # a port in use is an error, not shared
            ],
        )
        prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(
            PredictionServicer(self), self._grpc
        )
        model_service_pb2_grpc.add_ModelServiceServicer_to_server(ModelServicer(self), self._grpc)
        taken = _bind_error(self) if self._grpc_port else None
        if taken is not None:  # found before gRPC logs its own "Failed to add port" line
            self.stop()
            raise PortUnavailableError(
                "gRPC", self.host, self._grpc_port, "--port", "grpc_port", taken
            )
        try:  # older grpc versions return 0 on failure, newer ones raise
            port = self._grpc.add_insecure_port(f"{self.host}:{self._grpc_port}")
        except RuntimeError:
            port = 0
        if not port:
            self.stop()
            raise PortUnavailableError(
                "gRPC", self.host, self._grpc_port, "--port", "grpc_port", _bind_error(self)
            )
        self._grpc_port = port
        try:
            self._http = ThreadingHTTPServer((self.host, self._rest_port), make_handler(self))
        except OSError as error:
            self.stop()
            raise PortUnavailableError(
                "REST", self.host, self._rest_port, "--rest_api_port", "rest_port", error
            ) from None
        self._http.daemon_threads = True
        self._rest_port = self._http.server_address[1]

    def stop(self) -> None:
        self._stop.set()
        if self._http is not None:
            if self._poller is not None:  # serve_forever runs
                self._http.shutdown()
            self._http.server_close()
            self._http = None
        if self._grpc is not None:
            self._grpc.stop(grace=1).wait()
            self._grpc = None
        if self._poller is not None:
            self._poller.join(timeout=10)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def poll(self) -> None:
        """Re-reads the config file if it changed, then polls every base path."""
        self._reload_config()
        for manager in list(self.managers.values()):
            manager.poll()

    def _reload_config(self) -> None:
        from static_keras.serving.config import read_models_config

        if self.config_file is None:
            return
        mtime = os.path.getmtime(self.config_file)
        if mtime == self._config_mtime:
            return
        self._config_mtime = mtime
        for model in read_models_config(self.config_file):
            model.check()
            if model.name in self.managers:
                self.managers[model.name].config = model  # labels and versions
            else:
                self.managers[model.name] = VersionManager(model, self.xla_enabled)
        logger.info("reloaded %s", self.config_file)

    def _poll_forever(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            try:
                self.poll()
            except Exception:  # keep polling: a bad directory must not stop serving
                logger.exception("polling failed")

    def wait_for_version(self, model: str, version: int, timeout: float = 60.0) -> None:
        """Blocks until `version` of `model` is served (or raises TimeoutError)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.manager(model).resolve(version, None)
                return
            except ServingFailure:
                time.sleep(0.05)
        raise TimeoutError(f"model {model!r} version {version} not served after {timeout} s")

    def manager(self, model: str) -> VersionManager:
        if model not in self.managers:
            raise ServingFailure("NOT_FOUND", f"Servable not found for request: model {model!r}")
        return self.managers[model]

    def predict(self, model, version, label, signature, inputs) -> tuple[int, dict]:
        """`(served version, outputs)`: one version answers the whole request."""
        with self.manager(model).serving(version, label) as servable:
            outputs = servable.run(signature, inputs, max_batch_rows=self.limits.max_batch_rows)
            return servable.version, outputs
