"""A development stand-in for `tensorflow_model_server`, for local use and tests.

Production runs the real server (`tensorflow/serving` container image; see
docs/serving.md). This one exists because `tensorflow_model_server` cannot
be installed from PyPI or Debian, and the kit's REST/gRPC wire format and
version swaps still need testing. It is built on the official gRPC servicer
classes and protobufs of `tensorflow-serving-api`, and it mirrors the real
server where the kit depends on it:

- gRPC (`PredictionService.Predict`, `ModelService.GetModelStatus`) and REST
  (`/v1/models/NAME[/versions/N|/labels/L][:predict]`, `instances` and
  `inputs` forms) on loopback; the same command-line flag names;
- polls each model's base path; loads a new version, replays its warmup
  records, and only then unloads the old one; a version that fails to load or
  to warm up is rejected while the old one keeps serving;
- `models.config` with specific versions and labels;
- XLA disabled unless `xla_enabled`: a version whose functions need XLA is
  rejected, as the real server's warmup would fail on it.

It does not batch requests, and it runs SavedModels through Python's
`tf.saved_model.load`, not `tensorflow::LoadSavedModel` (the C++ load path is
tested separately with `static_keras.serving.cc_loader`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import threading
import time
from concurrent import futures
from http.server import BaseHTTPRequestHandler
from http.server import ThreadingHTTPServer

import numpy as np

from static_keras.export.check import SavedModelCheckError
from static_keras.export.check import check_saved_model
from static_keras.export.publish import list_versions
from static_keras.export.warmup import WARMUP_FILENAME
from static_keras.export.warmup import read_warmup_requests
from static_keras.serving.config import ServedModel

logger = logging.getLogger("static_keras.serving.dev_server")

_HTTP_STATUS = {
    "INVALID_ARGUMENT": 400,
    "FAILED_PRECONDITION": 400,
    "NOT_FOUND": 404,
    "UNAVAILABLE": 503,
    "INTERNAL": 500,
}


class ServingFailure(Exception):
    """An error answered to the client, with a gRPC status code name."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


@dataclasses.dataclass
class _Version:
    version: int
    path: str
    loaded: object  # keeps the SavedModel's resources alive
    signatures: dict


class _ModelManager:
    """The versions of one model: what is served, and why others are not."""

    def __init__(self, config: ServedModel, xla_enabled: bool):
        self.config = config
        self.xla_enabled = xla_enabled
        self._lock = threading.Lock()
        self._served: dict[int, _Version] = {}
        self._status: dict[int, tuple[str, str]] = {}  # version -> (state, error)
        self._failed: dict[int, float] = {}  # version -> mtime of the failed dir

    # Loading -----------------------------------------------------------------

    def _wanted(self, present: list[int]) -> list[int]:
        if self.config.versions is None:
            return present[-1:]
        return [v for v in self.config.versions if v in present]

    def poll(self) -> None:
        present = list_versions(self.config.base_path)
        wanted = self._wanted(present)
        for version in wanted:
            path = os.path.join(self.config.base_path, str(version))
            if version in self._served:
                continue
            mtime = os.path.getmtime(path)
            if self._failed.get(version) == mtime:
                continue  # already rejected; retried only if the dir changes
            self._set_status(version, "LOADING", "")
            try:
                loaded = self._load(version, path)
            except Exception as error:  # any load failure rejects the version
                self._failed[version] = mtime
                message = f"{type(error).__name__}: {error}".strip()
                self._set_status(version, "END", message)
                logger.warning(
                    "model %s version %d rejected: %s", self.config.name, version, message
                )
                continue
            with self._lock:
                self._served[version] = loaded
            self._set_status(version, "AVAILABLE", "")
            logger.info("model %s version %d available", self.config.name, version)
        # Unload only after the wanted versions are up: a swap never leaves a
        # gap, and a rejected new version leaves the old one serving.
        if any(v in self._served for v in wanted):
            for version in sorted(self._served):
                if version not in wanted:
                    self._set_status(version, "UNLOADING", "")
                    with self._lock:
                        del self._served[version]
                    self._set_status(version, "END", "")

    def _load(self, version: int, path: str) -> _Version:
        import tensorflow as tf

        if not self.xla_enabled:
            try:
                check_saved_model(path, max_constant_bytes=2**62, duplicate_min_bytes=2**62)
            except SavedModelCheckError as error:
                raise RuntimeError(
                    f"{error} (XLA compilation disabled: start with --xla_cpu_compilation_enabled)"
                ) from None
        loaded = tf.saved_model.load(path, tags=["serve"])
        entry = _Version(version, path, loaded, dict(loaded.signatures))
        warmup = os.path.join(path, "assets.extra", WARMUP_FILENAME)
        if os.path.exists(warmup):
            for request in read_warmup_requests(warmup):
                inputs = {k: tf.make_ndarray(v) for k, v in request.inputs.items()}
                self.run(entry, request.model_spec.signature_name or "serving_default", inputs)
        return entry

    def _set_status(self, version: int, state: str, error: str) -> None:
        with self._lock:
            self._status[version] = (state, error)

    # Serving -----------------------------------------------------------------

    def resolve(self, version: int | None, label: str | None) -> _Version:
        with self._lock:
            served = dict(self._served)
        if label is not None:
            if label not in self.config.labels:
                raise ServingFailure(
                    "NOT_FOUND",
                    f"Unrecognized servable version label: {label} (model {self.config.name!r})",
                )
            version = self.config.labels[label]
        if version is not None:
            if version not in served:
                raise ServingFailure(
                    "NOT_FOUND",
                    f"Servable not found for request: Specific({self.config.name}, {version})",
                )
            return served[version]
        if not served:
            raise ServingFailure(
                "UNAVAILABLE", f"Servable not found for request: Latest({self.config.name})"
            )
        return served[max(served)]

    def status(self, version: int | None, label: str | None) -> list[tuple[int, str, str]]:
        with self._lock:
            status = dict(self._status)
        if label is not None:
            if label not in self.config.labels:
                raise ServingFailure("NOT_FOUND", f"Unrecognized version label: {label}")
            version = self.config.labels[label]
        if version is not None:
            if version not in status:
                raise ServingFailure(
                    "NOT_FOUND", f"Could not find version {version} of model {self.config.name}"
                )
            return [(version, *status[version])]
        return [(v, *status[v]) for v in sorted(status)]

    @staticmethod
    def run(entry: _Version, signature: str, inputs: dict[str, np.ndarray]) -> dict:
        import tensorflow as tf

        function = entry.signatures.get(signature or "serving_default")
        if function is None:
            raise ServingFailure(
                "INVALID_ARGUMENT",
                f"Serving signature name: {signature!r} not found in signature def "
                f"(available: {sorted(entry.signatures)})",
            )
        specs = function.structured_input_signature[1]
        missing = sorted(set(specs) - set(inputs))
        extra = sorted(set(inputs) - set(specs))
        if missing or extra:
            raise ServingFailure(
                "INVALID_ARGUMENT",
                f"Request inputs {sorted(inputs)} do not match the signature's inputs "
                f"{sorted(specs)} (missing {missing}, unexpected {extra})",
            )
        feeds = {}
        for name, spec in specs.items():
            value = np.asarray(inputs[name])
            expected = spec.dtype.as_numpy_dtype
            if value.dtype != expected:
                same_kind = np.issubdtype(value.dtype, np.integer) and np.issubdtype(
                    expected, np.integer
                )
                if not (same_kind and np.array_equal(value.astype(expected), value)):
                    raise ServingFailure(
                        "INVALID_ARGUMENT",
                        f"Input {name!r} expects dtype {spec.dtype.name} but {value.dtype} "
                        "was provided",
                    )
                value = value.astype(expected)
            if not spec.shape.is_compatible_with(value.shape):
                raise ServingFailure(
                    "INVALID_ARGUMENT",
                    f"Input {name!r} expects shape {spec.shape} but got {list(value.shape)}",
                )
            feeds[name] = tf.constant(value)
        try:
            outputs = function(**feeds)
        except tf.errors.OpError as error:
            raise ServingFailure("INTERNAL", error.message) from None
        return {name: tensor.numpy() for name, tensor in outputs.items()}


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
        self.managers = {m.name: _ModelManager(m, xla_enabled) for m in models}
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
        import grpc
        from tensorflow_serving.apis import model_service_pb2_grpc
        from tensorflow_serving.apis import prediction_service_pb2_grpc

        self.poll()
        self._grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(
            _PredictionServicer(self), self._grpc
        )
        model_service_pb2_grpc.add_ModelServiceServicer_to_server(_ModelServicer(self), self._grpc)
        self._grpc_port = self._grpc.add_insecure_port(f"{self.host}:{self._grpc_port}")
        self._grpc.start()
        self._http = ThreadingHTTPServer((self.host, self._rest_port), _rest_handler(self))
        self._http.daemon_threads = True
        self._rest_port = self._http.server_address[1]
        threading.Thread(target=self._http.serve_forever, daemon=True).start()
        self._poller = threading.Thread(target=self._poll_forever, daemon=True)
        self._poller.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
        if self._grpc is not None:
            self._grpc.stop(grace=1).wait()
        if self._poller is not None:
            self._poller.join(timeout=10)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def poll(self) -> None:
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
                self.managers[model.name] = _ModelManager(model, self.xla_enabled)
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

    def manager(self, model: str) -> _ModelManager:
        if model not in self.managers:
            raise ServingFailure("NOT_FOUND", f"Servable not found for request: model {model!r}")
        return self.managers[model]

    def predict(self, model, version, label, signature, inputs) -> tuple[int, dict]:
        manager = self.manager(model)
        entry = manager.resolve(version, label)  # one version for the whole request
        return entry.version, manager.run(entry, signature, inputs)


def _grpc_servicers():
    from tensorflow_serving.apis import model_service_pb2_grpc
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    return prediction_service_pb2_grpc, model_service_pb2_grpc


class _PredictionServicer(_grpc_servicers()[0].PredictionServiceServicer):
    def __init__(self, server: DevServer):
        self.server = server

    def Predict(self, request, context):  # noqa: N802 (gRPC method name)
        import grpc
        import tensorflow as tf
        from tensorflow_serving.apis import predict_pb2

        spec = request.model_spec
        version = spec.version.value if spec.HasField("version") else None
        label = spec.version_label or None
        try:
            inputs = {name: tf.make_ndarray(proto) for name, proto in request.inputs.items()}
            served, outputs = self.server.predict(
                spec.name, version, label, spec.signature_name, inputs
            )
        except ServingFailure as failure:
            context.abort(getattr(grpc.StatusCode, failure.code), str(failure))
        except (TypeError, ValueError) as error:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"Bad request tensor: {error}")
        response = predict_pb2.PredictResponse()
        response.model_spec.name = spec.name
        response.model_spec.version.value = served
        response.model_spec.signature_name = spec.signature_name or "serving_default"
        for name, value in outputs.items():
            response.outputs[name].CopyFrom(tf.make_tensor_proto(value))
        return response


class _ModelServicer(_grpc_servicers()[1].ModelServiceServicer):
    def __init__(self, server: DevServer):
        self.server = server

    def GetModelStatus(self, request, context):  # noqa: N802 (gRPC method name)
        import grpc
        from tensorflow_serving.apis import get_model_status_pb2

        spec = request.model_spec
        version = spec.version.value if spec.HasField("version") else None
        try:
            rows = self.server.manager(spec.name).status(version, spec.version_label or None)
        except ServingFailure as failure:
            context.abort(getattr(grpc.StatusCode, failure.code), str(failure))
        response = get_model_status_pb2.GetModelStatusResponse()
        states = get_model_status_pb2.ModelVersionStatus.State
        for served, state, error in rows:
            status = response.model_version_status.add()
            status.version = served
            status.state = states.Value(state)
            status.status.error_message = error
        return response


_REST_PATH = re.compile(
    r"^/v1/models/(?P<model>[^/:]+)(?:/versions/(?P<version>\d+)|/labels/(?P<label>[^/:]+))?"
    r"(?P<verb>:predict)?$"
)


def _rest_handler(server: DevServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # requests are not logged to stderr
            pass

        def _reply(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _route(self):
            match = _REST_PATH.match(self.path)
            if match is None:
                raise ServingFailure("NOT_FOUND", f"Malformed request: {self.command} {self.path}")
            version = match["version"]
            return match["model"], int(version) if version else None, match["label"], match["verb"]

        def do_GET(self):  # noqa: N802
            try:
                model, version, label, verb = self._route()
                if verb:
                    raise ServingFailure("NOT_FOUND", "Use POST for :predict")
                rows = server.manager(model).status(version, label)
            except ServingFailure as failure:
                return self._reply(_HTTP_STATUS[failure.code], {"error": str(failure)})
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
            self._reply(200, {"model_version_status": statuses})

        def do_POST(self):  # noqa: N802
            try:
                model, version, label, verb = self._route()
                if not verb:
                    raise ServingFailure("NOT_FOUND", f"Unknown verb in {self.path}")
                length = int(self.headers.get("Content-Length", 0))
                try:
                    body = json.loads(self.rfile.read(length) or b"null")
                except ValueError as error:
                    raise ServingFailure("INVALID_ARGUMENT", f"Malformed JSON: {error}") from None
                if not isinstance(body, dict):
                    raise ServingFailure("INVALID_ARGUMENT", "Request body must be a JSON object")
                signature = body.get("signature_name", "serving_default")
                entry = server.manager(model).resolve(version, label)
                names = (
                    sorted(entry.signatures.get(signature).structured_input_signature[1])
                    if (signature in entry.signatures)
                    else []
                )
                row_form = "instances" in body
                inputs = _parse_rest_inputs(body, names)
                outputs = server.manager(model).run(entry, signature, inputs)
            except ServingFailure as failure:
                return self._reply(_HTTP_STATUS[failure.code], {"error": str(failure)})
            outputs = {k: v.tolist() for k, v in outputs.items()}
            if row_form:
                rows = len(next(iter(outputs.values())))
                if len(outputs) == 1:
                    predictions = next(iter(outputs.values()))
                else:
                    predictions = [{k: v[i] for k, v in outputs.items()} for i in range(rows)]
                self._reply(200, {"predictions": predictions})
            else:
                self._reply(
                    200, {"outputs": next(iter(outputs.values())) if len(outputs) == 1 else outputs}
                )

    return Handler


def _parse_rest_inputs(body: dict, names: list[str]) -> dict[str, np.ndarray]:
    """TF Serving's two JSON forms -> arrays by input name."""
    if ("instances" in body) == ("inputs" in body):
        raise ServingFailure(
            "INVALID_ARGUMENT", "The request must have exactly one of 'instances' or 'inputs'"
        )
    try:
        if "instances" in body:
            instances = body["instances"]
            if not isinstance(instances, list) or not instances:
                raise ServingFailure("INVALID_ARGUMENT", "'instances' must be a non-empty list")
            if isinstance(instances[0], dict):
                keys = set(instances[0])
                if any(set(row) != keys for row in instances):
                    raise ServingFailure(
                        "INVALID_ARGUMENT", "Every instance must name the same inputs"
                    )
                return {k: np.asarray([row[k] for row in instances]) for k in keys}
            if len(names) != 1:
                raise ServingFailure(
                    "INVALID_ARGUMENT",
                    f"Instances without input names need a single-input signature; inputs: {names}",
                )
            return {names[0]: np.asarray(instances)}
        inputs = body["inputs"]
        if isinstance(inputs, dict):
            return {k: np.asarray(v) for k, v in inputs.items()}
        if len(names) != 1:
            raise ServingFailure(
                "INVALID_ARGUMENT",
                f"Unnamed 'inputs' need a single-input signature; inputs: {names}",
            )
        return {names[0]: np.asarray(inputs)}
    except ValueError as error:  # ragged lists
        raise ServingFailure("INVALID_ARGUMENT", f"Malformed input tensor: {error}") from None
