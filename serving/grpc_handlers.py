"""The development server's gRPC handlers: `Predict` and `GetModelStatus`.

Built on the official servicer classes of `tensorflow-serving-api`. Every
failure is answered with the status code the real server uses; nothing
escapes as gRPC's UNKNOWN ("Exception calling application").
"""

from __future__ import annotations

import logging

import numpy as np
from tensorflow_serving.apis import model_service_pb2_grpc
from tensorflow_serving.apis import prediction_service_pb2_grpc

from static_keras.serving.status import ServingFailure

logger = logging.getLogger("static_keras.serving")


def tensor_to_array(name: str, proto) -> np.ndarray:
    """A request TensorProto as an array; INVALID_ARGUMENT when it cannot be one."""
    import tensorflow as tf

    try:
        dtype = tf.dtypes.as_dtype(proto.dtype)
    except TypeError:
        dtype = None
    # DT_VARIANT and DT_RESOURCE tensors have no value a client can send.
    if dtype is None or not dtype.is_numpy_compatible or dtype in (tf.variant, tf.resource):
        raise ServingFailure(
            "INVALID_ARGUMENT",
            f"tensor parsing error: {name}: dtype {dtype.name if dtype else proto.dtype} "
            "cannot be sent in a request",
        )
    try:
        return tf.make_ndarray(proto)
    except (TypeError, ValueError) as error:
        raise ServingFailure("INVALID_ARGUMENT", f"tensor parsing error: {name}: {error}") from None


def _answer(context, call):
    """Runs `call()`; aborts the RPC with the failure's status code."""
    import grpc

    try:
        return call()
    except ServingFailure as error:
        failure = error
    except Exception as error:  # a bug must still get an answer, not UNKNOWN
        logger.exception("gRPC handler failed")
        failure = ServingFailure("INTERNAL", f"{type(error).__name__}: {error}")
    context.abort(getattr(grpc.StatusCode, failure.code), str(failure))


def _version_of(spec) -> tuple[int | None, str | None]:
    """The `(version, label)` a ModelSpec asks for; None where it names none."""
    return (spec.version.value if spec.HasField("version") else None), spec.version_label or None


class PredictionServicer(prediction_service_pb2_grpc.PredictionServiceServicer):
    def __init__(self, server):
        self.server = server

    def Predict(self, request, context):  # noqa: N802 (gRPC method name)
        return _answer(context, lambda: self._predict(request))

    def _predict(self, request):
        import tensorflow as tf
        from tensorflow_serving.apis import predict_pb2

        spec = request.model_spec
        inputs = {name: tensor_to_array(name, proto) for name, proto in request.inputs.items()}
        with self.server.manager(spec.name).serving(*_version_of(spec)) as servable:
            outputs = servable.run(
                spec.signature_name, inputs, max_batch_rows=self.server.limits.max_batch_rows
            )
            version = servable.version
        response = predict_pb2.PredictResponse()
        response.model_spec.name = spec.name
        response.model_spec.version.value = version
        response.model_spec.signature_name = spec.signature_name or "serving_default"
        for name, value in outputs.items():
            response.outputs[name].CopyFrom(tf.make_tensor_proto(value))
        return response


class ModelServicer(model_service_pb2_grpc.ModelServiceServicer):
    def __init__(self, server):
        self.server = server

    def GetModelStatus(self, request, context):  # noqa: N802 (gRPC method name)
        return _answer(context, lambda: self._status(request))

    def _status(self, request):
        from tensorflow_serving.apis import get_model_status_pb2

        rows = self.server.manager(request.model_spec.name).status(*_version_of(request.model_spec))
        response = get_model_status_pb2.GetModelStatusResponse()
        states = get_model_status_pb2.ModelVersionStatus.State
        for served, state, error in rows:
            status = response.model_version_status.add()
            status.version = served
            status.state = states.Value(state)
            status.status.error_message = error
        return response
