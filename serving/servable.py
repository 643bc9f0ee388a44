"""One loaded version: load it as the server would, and run Predict on it.

`load_servable` is the development server's load path, and what `publish`
uses to decide whether a version on disk is good: check for XLA-only
functions (when XLA is off), load the `serve` MetaGraph into a graph and a
session of its own, then replay the warmup records. A version that fails
any step is one the server rejects.

Each version runs in its own `tf.compat.v1.Session`, as
`tensorflow_model_server` runs it (`LoadSavedModel` gives every version a
`Session`, and Predict is `Session::Run` of the signature's tensors). Not
`tf.saved_model.load`: the eager context outlives the versions it loads, and
its kernel cache keeps every unloaded version's instantiated functions (a few
MB per swap, without end; docs/benchmarks.md "What grows per swap").
Closing a version's session frees all of it.

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

`release_memory` is what follows an unload (or a rejected load): Python's
cycle collector, then glibc is asked to return the freed pages.
"""

from __future__ import annotations

import contextlib
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
class Signature:
    """One signature's tensors in its version's graph, and the session call
    that feeds its inputs (sorted by name) and fetches its outputs."""

    input_specs: dict  # {name: tf.TensorSpec}
    output_names: tuple[str, ...]
    call: object  # Session::MakeCallable: inputs in sorted order -> outputs


@dataclasses.dataclass
class Servable:
    """A loaded SavedModel version: its session and signatures."""

    version: int
    path: str
    session: object  # tf.compat.v1.Session holding the version's graph and variables
    signatures: dict[str, Signature]

    def input_specs(self, signature: str) -> dict:
        """`{name: tf.TensorSpec}` of a signature's inputs."""
        return self._signature(signature).input_specs

    def close(self) -> None:
        """Frees the version (its variables, the graph, the functions its
        session instantiated). Only once no request runs on it."""
        self.session.close()

    def _signature(self, signature: str) -> Signature:
        name = signature or DEFAULT_SIGNATURE
        found = self.signatures.get(name)
        if found is None:
            raise ServingFailure(
                "FAILED_PRECONDITION",
                f'Serving signature key "{name}" not found (signatures: {sorted(self.signatures)})',
            )
        return found

    def run(
        self,
        signature: str,
        inputs: dict[str, np.ndarray],
        *,
        max_batch_rows: int | None = None,
    ) -> dict[str, np.ndarray]:
        """Outputs by name for `inputs` (arrays by input name)."""
        import tensorflow as tf

        found = self._signature(signature)
        specs = found.input_specs
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
            feeds[name] = value
        try:
            values = found.call(*(feeds[name] for name in sorted(feeds)))
        except tf.errors.OpError as error:
            raise failure_from_tf_error(error) from None
        except (TypeError, ValueError) as error:  # refused by the Python call itself
            raise ServingFailure("INVALID_ARGUMENT", str(error)) from None
        return dict(zip(found.output_names, values))


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
    graph = tf.Graph()
    session = tf.compat.v1.Session(graph=graph)
    try:
        with graph.as_default(), _quiet_tensorflow_logger():
            meta_graph = tf.compat.v1.saved_model.loader.load(session, ["serve"], path)
            signatures = {
                name: _signature(session, definition)
                for name, definition in meta_graph.signature_def.items()
                if not name.startswith("__")  # __saved_model_init_op: not servable
            }
        graph.finalize()  # as the C++ server's: requests add nothing to it
        servable = Servable(version, path, session, signatures)
        warmup = os.path.join(path, "assets.extra", WARMUP_FILENAME)
        if os.path.exists(warmup):
            for request in read_warmup_requests(warmup):
                inputs = {k: tf.make_ndarray(v) for k, v in request.inputs.items()}
                servable.run(request.model_spec.signature_name, inputs)
    except BaseException:
        session.close()  # a rejected version keeps nothing
        raise
    return servable


def _signature(session, definition) -> Signature:
    import tensorflow as tf
    from tensorflow.core.protobuf import config_pb2

    input_specs = {}
    for name, info in definition.inputs.items():
        shape = None
        if not info.tensor_shape.unknown_rank:
            shape = [dim.size if dim.size >= 0 else None for dim in info.tensor_shape.dim]
        input_specs[name] = tf.TensorSpec(shape, tf.as_dtype(info.dtype), name=name)
    output_names = tuple(sorted(definition.outputs))
    # `Session::MakeCallable`, as Keras' TF1 backend uses it, not
    # `Session.run` (nor `make_callable` with feeds, which is `Session.run`):
    # the C++ server checks no fed shape against the placeholder's, and
    # `Session.run` does in Python; one executor per signature, made here.
    options = config_pb2.CallableOptions(
        feed=[definition.inputs[name].name for name in sorted(definition.inputs)],
        fetch=[definition.outputs[name].name for name in output_names],
    )
    call = session._make_callable_from_options(options)  # noqa: SLF001
    return Signature(input_specs, output_names, call)


@contextlib.contextmanager
def _quiet_tensorflow_logger():
    """Hides the v1 loader's deprecation warning: graph-mode loading is the
    point here (the C++ server's own path), not an oversight."""
    import tensorflow as tf

    logger = tf.get_logger()
    level = logger.level
    logger.setLevel("ERROR")
    try:
        yield
    finally:
        logger.setLevel(level)


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
