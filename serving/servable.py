"""One loaded version: load it as the server would, and run Predict on it.

`load_servable` is the development server's load path, and what `publish`
uses to decide whether a version on disk is good: check for XLA-only
functions (when XLA is off), `tf.saved_model.load` with tag `serve`, then
replay the warmup records. A version that fails any step is one the server
rejects.

`Servable.run` follows `tensorflow_model_server`'s Predict
(tensorflow_serving/servables/tensorflow/predict_util.cc, `RunPredict` and
`PreProcessPrediction`): an unknown signature is FAILED_PRECONDITION; the
request must name exactly the signature's inputs (INVALID_ARGUMENT
otherwise); tensors are fed as they are, with no cast and no shape check:
`Session::Run` rejects a dtype other than the signature's (INVALID_ARGUMENT,
"Expects arg[i] to be int32 but int64 is provided") and runs any shape the
graph accepts (the C++ loader feeds a `[1, 5]` history to a `[None, 20]`
signature, and so does this; an exported signature checks the shape
itself). Errors raised inside the graph keep their TensorFlow status code.

`release_memory` is what follows an unload (or a rejected load): a restored
SavedModel's functions hold reference cycles that keep its variables (the
index) alive until Python's cycle collector runs, and glibc keeps freed
pages until asked to return them.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import gc
import os
import sys

import numpy as np

from static_keras.serving.status import ServingFailure
from static_keras.serving.status import failure_from_tf_error

DEFAULT_SIGNATURE = "serving_default"


@dataclasses.dataclass
class Servable:
    """A loaded SavedModel version and its signatures."""

    version: int
    path: str
    loaded: object  # keeps the SavedModel's resources alive
    signatures: dict

    def input_specs(self, signature: str) -> dict:
        """`{name: tf.TensorSpec}` of a signature's inputs."""
        return self._function(signature).structured_input_signature[1]

    def _function(self, signature: str):
        name = signature or DEFAULT_SIGNATURE
        function = self.signatures.get(name)
        if function is None:
            raise ServingFailure(
                "FAILED_PRECONDITION",
                f'Serving signature key "{name}" not found (signatures: {sorted(self.signatures)})',
            )
        return function

    def run(
        self,
        signature: str,
        inputs: dict[str, np.ndarray],
        *,
        max_batch_rows: int | None = None,
    ) -> dict[str, np.ndarray]:
        """Outputs by name for `inputs` (arrays by input name)."""
        import tensorflow as tf

        function = self._function(signature)
        specs = function.structured_input_signature[1]
        if set(inputs) != set(specs):
            raise ServingFailure(
                "INVALID_ARGUMENT",
                f"input size does not match signature: {len(inputs)}!={len(specs)} "
                f"len({{{','.join(sorted(inputs))}}}) != len({{{','.join(sorted(specs))}}}). "
                f"Sent extra: {{{','.join(sorted(set(inputs) - set(specs)))}}}. "
                f"Missing but required: {{{','.join(sorted(set(specs) - set(inputs)))}}}.",
            )
        feeds = {}
        for position, (name, spec) in enumerate(sorted(specs.items())):
            value = np.asarray(inputs[name])
            if value.dtype != spec.dtype.as_numpy_dtype:
                raise ServingFailure(
                    "INVALID_ARGUMENT",
                    f"Input {name!r}: expects arg[{position}] to be {spec.dtype.name} but "
                    f"{tf.as_dtype(value.dtype).name} is provided",
                )
            rows = value.shape[0] if value.ndim else 1
            if max_batch_rows and rows > max_batch_rows:
                # TF Serving's batching refuses such a task the same way
                # ("Task size ... is larger than maximum input batch size").
                raise ServingFailure(
                    "INVALID_ARGUMENT",
                    f"Input {name!r} has {rows} rows, more than the server's "
                    f"max_batch_rows={max_batch_rows}: split the request",
                )
            feeds[name] = tf.constant(value)
        try:
            outputs = function(**feeds)
        except tf.errors.OpError as error:
            raise failure_from_tf_error(error) from None
        except (TypeError, ValueError) as error:  # refused by the Python call itself
            raise ServingFailure("INVALID_ARGUMENT", str(error)) from None
        return {name: tensor.numpy() for name, tensor in outputs.items()}


def load_servable(path: str | os.PathLike, version: int, *, xla_enabled: bool = False) -> Servable:
    """Loads `path` and replays its warmup records; raises if the server would reject it."""
    import tensorflow as tf

    from static_keras.serving.saved_model_check import SavedModelCheckError
    from static_keras.serving.saved_model_check import check_runs_without_xla
    from static_keras.serving.warmup import WARMUP_FILENAME
    from static_keras.serving.warmup import read_warmup_requests

    path = os.fspath(path)
    if not xla_enabled:
        try:
            check_runs_without_xla(path)
        except SavedModelCheckError as error:
            raise RuntimeError(
                f"{error} (XLA compilation disabled: start with --xla_cpu_compilation_enabled)"
            ) from None
    loaded = tf.saved_model.load(path, tags=["serve"])
    servable = Servable(version, path, loaded, dict(loaded.signatures))
    warmup = os.path.join(path, "assets.extra", WARMUP_FILENAME)
    if os.path.exists(warmup):
        for request in read_warmup_requests(warmup):
            inputs = {k: tf.make_ndarray(v) for k, v in request.inputs.items()}
            servable.run(request.model_spec.signature_name, inputs)
    return servable


def release_memory() -> None:
    """Collects what unloaded versions left in reference cycles, then returns
    freed heap pages to the system (glibc's `malloc_trim`, where libc has it)."""
    # Finalizers of restored functions free further cycles: collect again
    # until a pass finds nothing (a few passes).
    for _ in range(4):
        if not gc.collect():
            break
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim():
    if not sys.platform.startswith("linux"):
        return None
    try:
        trim = ctypes.CDLL(None).malloc_trim  # glibc; musl has none
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim
