"""Clients for TF Serving: gRPC (`tensorflow-serving-api`) and REST.

Neither imports Keras or static-keras' layers: a client machine needs only
`tensorflow-serving-api` (gRPC) or nothing beyond NumPy (REST).
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.parse
import urllib.request

import numpy as np


class ServingError(RuntimeError):
    """A request the server refused or could not answer; says what failed."""

    def __init__(self, message: str, code: str | None = None):
        super().__init__(message)
        self.code = code


def _target(model: str, version: int | None, label: str | None) -> str:
    if version is not None and label is not None:
        raise ValueError("Pass a `version` or a `label`, not both")
    if version is not None:
        return f"model {model!r} version {version}"
    if label is not None:
        return f"model {model!r} label {label!r}"
    return f"model {model!r}"


class GrpcClient:
    """`PredictionService.Predict` and `ModelService.GetModelStatus` over gRPC.

    Args:
        address: `host:port` of the server's gRPC port (8500 by default).
        timeout: seconds per request. Defaults to 10.
    """

    def __init__(self, address: str, timeout: float = 10.0):
        import grpc
        from tensorflow_serving.apis import model_service_pb2_grpc
        from tensorflow_serving.apis import prediction_service_pb2_grpc

        self.address = address
        self.timeout = timeout
        self._channel = grpc.insecure_channel(address)
        self._predict = prediction_service_pb2_grpc.PredictionServiceStub(self._channel)
        self._models = model_service_pb2_grpc.ModelServiceStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _spec(self, spec, model, version, label, signature=None):
        spec.name = model
        if signature:
            spec.signature_name = signature
        if version is not None:
            spec.version.value = int(version)
        if label is not None:
            spec.version_label = label

    def predict_raw(
        self,
        model: str,
        inputs: dict[str, np.ndarray],
        *,
        version: int | None = None,
        label: str | None = None,
        signature: str = "serving_default",
    ):
        """The PredictResponse protobuf (its `model_spec` names the version)."""
        import grpc
        import tensorflow as tf
        from tensorflow.core.framework.tensor_pb2 import TensorProto
        from tensorflow_serving.apis import predict_pb2

        what = _target(model, version, label)
        request = predict_pb2.PredictRequest()
        self._spec(request.model_spec, model, version, label, signature)
        for name, value in inputs.items():
            if not isinstance(value, TensorProto):  # a prepared proto goes as is
                value = tf.make_tensor_proto(np.asarray(value))
            request.inputs[name].CopyFrom(value)
        try:
            return self._predict.Predict(request, timeout=self.timeout)
        except grpc.RpcError as error:
            raise ServingError(
                f"gRPC Predict to {self.address} for {what} failed: "
                f"{error.code().name}: {error.details()}",
                code=error.code().name,
            ) from None

    def predict(self, model: str, inputs: dict[str, np.ndarray], **kwargs) -> dict:
        """Outputs by name as NumPy arrays, plus `"model_version"` (int)."""
        import tensorflow as tf

        response = self.predict_raw(model, inputs, **kwargs)
        outputs = {name: tf.make_ndarray(proto) for name, proto in response.outputs.items()}
        outputs["model_version"] = int(response.model_spec.version.value)
        return outputs

    def model_status(
        self, model: str, *, version: int | None = None, label: str | None = None
    ) -> list[dict]:
        """`[{"version", "state", "error"}]` for the model's versions."""
        import grpc
        from tensorflow_serving.apis import get_model_status_pb2

        request = get_model_status_pb2.GetModelStatusRequest()
        self._spec(request.model_spec, model, version, label)
        try:
            response = self._models.GetModelStatus(request, timeout=self.timeout)
        except grpc.RpcError as error:
            raise ServingError(
                f"gRPC GetModelStatus to {self.address} for "
                f"{_target(model, version, label)} failed: {error.code().name}: "
                f"{error.details()}",
                code=error.code().name,
            ) from None
        states = get_model_status_pb2.ModelVersionStatus.State
        return [
            {
                "version": int(status.version),
                "state": states.Name(status.state),
                "error": status.status.error_message,
            }
            for status in response.model_version_status
        ]


class RestClient:
    """TF Serving's REST API: `POST /v1/models/NAME[...]:predict`, `GET /v1/models/NAME`.

    Args:
        base_url: e.g. `http://127.0.0.1:8501`.
        timeout: seconds per request. Defaults to 10.
    """

    def __init__(self, base_url: str, timeout: float = 10.0):
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout

    def _url(self, model: str, version: int | None, label: str | None) -> str:
        url = f"{self.base_url}/v1/models/{model}"
        if version is not None:
            url += f"/versions/{int(version)}"
        elif label is not None:
            url += f"/labels/{label}"
        return url

    def _request(self, url: str, body: dict | None, what: str) -> dict:
        return self._exchange(url, body, what)[0]

    def _exchange(self, url: str, body: dict | None, what: str) -> tuple[dict, dict]:
        """`(decoded JSON answer, response headers)`."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            url, data=data, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read()), dict(response.headers)
        except urllib.error.HTTPError as error:
            detail = error.read().decode(errors="replace")
            try:
                detail = json.loads(detail).get("error", detail)
            except ValueError:
                pass
            raise ServingError(
                f"REST {what} failed: HTTP {error.code}: {detail}", code=str(error.code)
            ) from None
        except (urllib.error.URLError, TimeoutError, ConnectionError) as error:
            reason = getattr(error, "reason", error)
            if isinstance(reason, ConnectionRefusedError):
                raise ServingError(
                    f"REST {what} failed: nothing listens at {self._address()} (connection "
                    "refused): start a server there (static-keras serve-dev, or "
                    "tensorflow_model_server --rest_api_port), or wait for it (query --wait "
                    "SECONDS)",
                    code="UNAVAILABLE",
                ) from None
            raise ServingError(f"REST {what} failed: {error}", code="UNAVAILABLE") from None
        except http.client.HTTPException as error:  # an answer that is not HTTP at all
            raise ServingError(
                f"REST {what} failed: {self._address()} does not answer HTTP "
                f"({type(error).__name__}); is it a gRPC port? TF Serving's REST port is "
                "--rest_api_port (8501 by default) and its gRPC port --port (8500): query a "
                "gRPC port with --grpc HOST:PORT",
                code="FAILED_PRECONDITION",  # not worth a retry: it will not start speaking HTTP
            ) from None

    def _address(self) -> str:
        return urllib.parse.urlsplit(self.base_url).netloc or self.base_url

    def predict(
        self,
        model: str,
        inputs: dict[str, np.ndarray],
        *,
        version: int | None = None,
        label: str | None = None,
        form: str = "inputs",
        signature: str = "serving_default",
    ) -> dict:
        """Outputs by name as NumPy arrays, plus `"model_version"` when known.

        `form="inputs"` sends the columnar form (`{"inputs": {name: list}}`,
        answered with `{"outputs": ...}`); `form="instances"` sends one
        object per row (`{"instances": [{name: row}, ...]}`, answered with
        `{"predictions": [...]}`). TF Serving's REST answer does not name
        the version that served it; the development server sends it in an
        `X-Model-Version` header, returned here as `"model_version"` (int).
        Against `tensorflow_model_server`, pin `version=` or use gRPC.
        """
        url = self._url(model, version, label) + ":predict"
        what = f"predict to {url}"
        columns = {name: np.asarray(value).tolist() for name, value in inputs.items()}
        if form == "inputs":
            body = {"signature_name": signature, "inputs": columns}
            result, headers = self._exchange(url, body, what)
            outputs = result["outputs"]
            if not isinstance(outputs, dict):
                outputs = {"output": outputs}
        elif form == "instances":
            rows = len(next(iter(columns.values())))
            instances = [{name: columns[name][i] for name in columns} for i in range(rows)]
            body = {"signature_name": signature, "instances": instances}
            result, headers = self._exchange(url, body, what)
            predictions = result["predictions"]
            if predictions and isinstance(predictions[0], dict):
                outputs = {k: [row[k] for row in predictions] for k in predictions[0]}
            else:
                outputs = {"output": predictions}
        else:
            raise ValueError(f"`form` must be 'inputs' or 'instances'. Received: {form!r}")
        answer = {name: np.asarray(value) for name, value in outputs.items()}
        served = {k.lower(): v for k, v in headers.items()}.get("x-model-version")
        if served is not None and served.isdigit():
            answer["model_version"] = int(served)
        return answer

    def model_status(
        self, model: str, *, version: int | None = None, label: str | None = None
    ) -> list[dict]:
        url = self._url(model, version, label)
        result = self._request(url, None, f"status of {url}")
        return [
            {
                "version": int(status["version"]),
                "state": status["state"],
                "error": status.get("status", {}).get("error_message", ""),
            }
            for status in result["model_version_status"]
        ]
