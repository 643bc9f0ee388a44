"""`serve-dev` and `query`: the development server and a client of any
TF Serving server (REST or gRPC)."""

from __future__ import annotations

import contextlib
import sys
import time

from static_keras.cli.output import UserError


def command_serve_dev(args) -> None:
    import logging
    import signal
    import threading

    from static_keras.serving import ServedModel
    from static_keras.serving.dev_server import DevServer
    from static_keras.serving.dev_server import PortUnavailableError
    from static_keras.serving.limits import ServerLimits

    # Version loads, rejections, swaps and unloads are logged at INFO.
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.model_config_file:
        models = None  # read (and re-read on change) by the server
    elif args.model_base_path:
        models = [ServedModel(args.model_name, args.model_base_path)]
    else:
        raise UserError("pass --model_base_path (with --model_name) or --model_config_file")
    server = DevServer(
        models,
        grpc_port=args.port,
        rest_port=args.rest_api_port,
        poll_seconds=args.file_system_poll_wait_seconds,
        xla_enabled=args.xla_cpu_compilation_enabled,
        config_file=args.model_config_file,
        limits=ServerLimits(
            max_body_bytes=args.max_body_bytes,
            read_timeout_seconds=args.read_timeout_seconds,
            max_batch_rows=args.max_batch_rows,
        ),
    )
    try:
        server.start()  # binds both ports before it loads a model
    except PortUnavailableError as error:
        raise UserError(error.command_line_message) from None
    models = [manager.config for manager in server.managers.values()]
    print(
        f"development server (not for production): gRPC {server.grpc_address}, "
        f"REST {server.rest_url}",
        flush=True,
    )
    for model in models:
        for version, state, error in server.manager(model.name).status(None, None):
            print(f"  {model.name} version {version}: {state} {error}".rstrip(), flush=True)
        _warn_if_nothing_to_serve(model)
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    try:
        stopped.wait(args.run_seconds) if args.run_seconds else stopped.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


def _warn_if_nothing_to_serve(model) -> None:
    """One line on stderr when a model's base path is missing or holds no
    version: the server keeps polling it (a job may publish there soon),
    but a typo would otherwise only show as "Servable not found" later."""
    import os

    from static_keras.serving.versions import list_versions

    path = model.base_path
    if not os.path.isdir(path):
        problem = (
            f"{path} does not exist (a typo?); it serves nothing until a version is published there"
        )
    elif not list_versions(path):
        problem = f"{path} holds no version yet; it serves nothing until one is published there"
    else:
        return
    print(f"static-keras: warning: model {model.name!r}: {problem}", file=sys.stderr, flush=True)


def _parse_input(text: str):
    import numpy as np

    name, _, values = text.partition("=")
    if not name or not values:
        raise UserError(f"--input must look like NAME=1,2,3[;4,5,6], got {text!r}")
    try:
        rows = [[int(v) for v in row.split(",")] for row in values.split(";")]
        return name, np.asarray(rows, dtype=np.int32)
    except ValueError:
        raise UserError(
            f"--input {name}: rows of comma-separated integers, got {values!r}"
        ) from None


def _rest_url(text: str) -> str:
    """`--rest` as a base URL: `host:port` gets `http://` in front."""
    return text if "://" in text else "http://" + text


def command_query(args) -> None:
    import numpy as np

    from static_keras.serving import RestClient
    from static_keras.serving import ServingError

    inputs = dict(_parse_input(text) for text in args.input)
    if bool(args.grpc) == bool(args.rest):
        raise UserError("pass exactly one of --grpc HOST:PORT or --rest URL")
    if args.grpc and "://" in args.grpc:
        raise UserError(f"--grpc takes HOST:PORT, without a scheme; got {args.grpc!r}")
    deadline = time.monotonic() + args.wait
    with _tensorflow_protos_only() if args.grpc else contextlib.nullcontext():
        while True:
            try:
                if args.grpc:
                    outputs = _grpc_predict(args, inputs)
                else:
                    client = RestClient(_rest_url(args.rest), timeout=args.timeout)
                    outputs = client.predict(
                        args.model, inputs, version=args.version, label=args.label
                    )
                break
            except ServingError as error:
                # Not up yet (connection refused, or no version loaded): retry.
                if error.code not in ("UNAVAILABLE", "503") or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
    if "model_version" not in outputs:
        # TF Serving's REST answer does not say which version served it.
        outputs["model_version"] = args.version or "unknown (pin --version, or use --grpc)"
    for name in sorted(outputs):
        print(f"{name}: {np.asarray(outputs[name]).tolist()}")


def _grpc_predict(args, inputs: dict) -> dict:
    """One Predict over gRPC, with the protos alone (no TensorFlow: see
    `_tensorflow_protos_only`)."""
    from static_keras.serving import GrpcClient

    with GrpcClient(args.grpc, timeout=args.timeout) as client:
        requests = {name: _tensor_proto(value) for name, value in inputs.items()}
        response = client.predict_raw(args.model, requests, version=args.version, label=args.label)
    outputs = {name: _ndarray(proto) for name, proto in response.outputs.items()}
    outputs["model_version"] = int(response.model_spec.version.value)
    return outputs


@contextlib.contextmanager
def _tensorflow_protos_only():
    """While active, `tensorflow` is a bare package over its folder.

    tensorflow-serving-api's protos import `tensorflow.core.framework.*_pb2`,
    plain generated modules inside the tensorflow package, and importing any
    of them runs `tensorflow/__init__.py`: all of TensorFlow, 3.3 s of a gRPC
    query's 3.5 s. With the bare package only the `_pb2` modules load, and
    `GrpcClient.predict_raw` sends prepared TensorProtos as they are. On exit
    the bare package and the modules loaded under it leave `sys.modules`, so
    a later `import tensorflow` loads the real one. Does nothing when
    TensorFlow is loaded already.
    """
    import importlib.util
    import types

    spec = None if "tensorflow" in sys.modules else importlib.util.find_spec("tensorflow")
    if spec is None or not spec.submodule_search_locations:
        yield  # loaded already, or absent (then the protos' ImportError says so)
        return
    before = set(sys.modules)
    stub = types.ModuleType("tensorflow")
    stub.__path__ = list(spec.submodule_search_locations)
    sys.modules["tensorflow"] = stub
    try:
        yield
    finally:
        for name in set(sys.modules) - before:
            if name == "tensorflow" or name.startswith("tensorflow."):
                del sys.modules[name]


# TensorFlow dtype name -> (NumPy dtype, the TensorProto field of its values).
_TENSOR_TYPES = {
    "DT_FLOAT": ("float32", "float_val"),
    "DT_DOUBLE": ("float64", "double_val"),
    "DT_HALF": ("float16", "half_val"),
    "DT_INT8": ("int8", "int_val"),
    "DT_INT16": ("int16", "int_val"),
    "DT_INT32": ("int32", "int_val"),
    "DT_INT64": ("int64", "int64_val"),
    "DT_UINT8": ("uint8", "int_val"),
    "DT_UINT16": ("uint16", "int_val"),
    "DT_UINT32": ("uint32", "uint32_val"),
    "DT_UINT64": ("uint64", "uint64_val"),
    "DT_BOOL": ("bool", "bool_val"),
    "DT_STRING": ("object", "string_val"),
}


def _tensor_proto(value):
    """A numeric NumPy array as a `TensorProto` (what `tf.make_tensor_proto` writes)."""
    import numpy as np
    from tensorflow.core.framework import tensor_pb2
    from tensorflow.core.framework import types_pb2

    array = np.asarray(value)
    names = {np.dtype(dtype): name for name, (dtype, _) in _TENSOR_TYPES.items()}
    if array.dtype not in names or array.dtype == object:
        raise UserError(f"cannot send an array of dtype {array.dtype} over gRPC")
    proto = tensor_pb2.TensorProto(dtype=types_pb2.DataType.Value(names[array.dtype]))
    for size in array.shape:
        proto.tensor_shape.dim.add(size=size)
    proto.tensor_content = np.ascontiguousarray(array, array.dtype.newbyteorder("<")).tobytes()
    return proto


def _ndarray(proto):
    """A `TensorProto` as a NumPy array (what `tf.make_ndarray` returns)."""
    import numpy as np
    from tensorflow.core.framework import types_pb2

    name = types_pb2.DataType.Name(proto.dtype)
    if name not in _TENSOR_TYPES:
        raise UserError(f"the answer holds a tensor of dtype {name}, which query cannot print")
    dtype, field = _TENSOR_TYPES[name]
    shape = [dim.size for dim in proto.tensor_shape.dim]
    if proto.tensor_content:
        return np.frombuffer(proto.tensor_content, np.dtype(dtype).newbyteorder("<")).reshape(shape)
    values = list(getattr(proto, field))
    if name == "DT_HALF":  # half_val holds the float16 bit patterns
        array = np.asarray(values, np.uint16).view(np.float16)
    else:
        array = np.asarray(values, dtype)
    size = int(np.prod(shape))
    if array.size < size:  # repeated trailing values are left out: repeat the last
        last = array[-1:] if array.size else np.zeros(1, array.dtype)
        array = np.concatenate([array, np.repeat(last, size - array.size)])
    return array.reshape(shape)
