"""The `static-keras` command line.

User mistakes (a missing file, a wrong shape, a bad vocab size) end in one
line on stderr and exit code 2, never a traceback.

Commands print only their own lines: TensorFlow's start-up lines that are
known to be harmless (its INFO lines, the oneDNN and CPU-feature notices, a
failed CUDA probe on a machine without an NVIDIA driver) are hidden, and
errors served by a model lose TensorFlow's wrapping (graph node, op name).
`--verbose` shows all of it. Every other line, errors included, still prints.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import textwrap
import time


class UserError(Exception):
    """A mistake in the command's input: reported in one line."""


# Commands that load TensorFlow: it is imported before they run, with its
# start-up lines filtered (`_quiet_tensorflow`).
# (refresh-eligibility is not one: a rules job runs NumPy only, and loads
# TensorFlow only where a version on disk has never been checked.)
_TENSORFLOW_COMMANDS = ("demo", "export", "publish", "serve-dev", "bench")

# Lines TensorFlow writes while it loads that tell a user of this command line
# nothing: the oneDNN and CPU-feature notices, the CUDA stub's "no driver" note
# and absl's banner before them.
_HARMLESS_LOG_LINES = (
    "All log messages before absl::InitializeLog() is called are written to STDERR",
    "oneDNN custom operations are on",
    "Could not find cuda drivers on your machine",
    "This TensorFlow binary is optimized to use available CPU instructions",
    "To enable the following instructions:",
)


def _harmless_log_line(line: str) -> bool:
    import glob
    import re

    if re.match(r"I\d{4} ", line):  # absl INFO ("I0000 00:00:..."), below TF_CPP_MIN_LOG_LEVEL
        return True
    if any(text in line for text in _HARMLESS_LOG_LINES):
        return True
    # The CUDA probe fails on every machine without an NVIDIA driver; where a
    # GPU device exists the same line is a real error and stays.
    return "failed call to cuInit" in line and not glob.glob("/dev/nvidia[0-9]*")


def _no_retracing_warning(record) -> bool:
    """False for TensorFlow's "triggered tf.function retracing" warning: a hint to
    whoever writes the code (Keras traces a predict function per model, and the
    demo builds several), nothing a user of a command can act on."""
    return "triggered tf.function retracing" not in record.getMessage()


def _quiet_tensorflow(import_now: bool) -> None:
    """Hides TensorFlow's start-up lines that are known to be harmless.

    `TF_CPP_MIN_LOG_LEVEL=1` (unless already set) hides its C++ INFO lines once
    its logging is up (a `TFRecordDataset` note in the middle of the demo's
    table, for one). Lines written while its libraries load come before
    that and ignore the level, so with `import_now` TensorFlow is imported
    here with stderr captured at the file descriptor, its devices are listed
    (the CUDA probe logs then), and every captured line but the harmless
    ones is written back. Its Python warnings about tf.function retracing
    are dropped.
    """
    import logging

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    logger = logging.getLogger("tensorflow")
    if _no_retracing_warning not in logger.filters:
        logger.addFilter(_no_retracing_warning)
    if not import_now or "tensorflow" in sys.modules:
        return
    import tempfile

    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no stderr to capture
        return
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            import tensorflow as tf

            tf.config.list_physical_devices()
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            lines = captured.read().decode(errors="replace").splitlines(keepends=True)
            sys.stderr.write("".join(line for line in lines if not _harmless_log_line(line)))
            sys.stderr.flush()


def _served_error_message(text: str) -> str:
    """An error answered by a served model, without TensorFlow's wrapping.

    An error raised inside the graph (a failed assertion, an out-of-range
    gather) reaches the client as `Graph execution error: Detected at node
    Assert/Assert ... <stack traces unavailable> MESSAGE [[{{node
    Assert/Assert}}]] [Op:__inference_signature_wrapper_1990]`, and a failed
    assertion's MESSAGE as `assertion failed: [words] [value] [value]`.
    Returns what precedes the wrapping (who failed, the status code) and
    MESSAGE alone, as `words value, value`, on one line.
    """
    import re

    wrapper = "Graph execution error:"
    head, _, body = text.partition(wrapper) if wrapper in text else ("", "", text)
    assertion = re.search(r"assertion failed: \[(.*?)\]((?: \[[^\[\]\n]*\])*) *$", body, re.M)
    if assertion:
        if not head:
            head = text[: text.index("assertion failed: ")]
        values = re.findall(r"\[([^\[\]\n]*)\]", assertion.group(2))
        message = " ".join([assertion.group(1), ", ".join(values)]).strip()
        message = message.replace("\\'", "'").replace('\\"', '"')
    elif head:
        # Drop the graph node and op names, keep the last line of the message.
        body = re.sub(r"\[\[\{\{.*?\}\}\]\]|\[Op:[^\]\n]*\]", "", body)
        lines = [line.strip() for line in body.splitlines() if line.strip()]
        message = lines[-1] if lines else ""
    else:
        return text
    return " ".join((head.rstrip() + " " + message).split())


def _load_array(path: str, column: str | None = None):
    """An int array from .npy, .csv (no header) or .parquet (integer columns)."""
    import numpy as np

    if not os.path.isfile(path):
        raise UserError(f"no such file: {path}")
    if path.endswith(".npy"):
        return np.load(path, allow_pickle=False)
    if path.endswith(".csv"):
        return np.loadtxt(path, delimiter=",", dtype=np.int64, ndmin=2)
    if path.endswith(".parquet"):
        try:
            import pyarrow.parquet as parquet
        except ImportError:
            raise UserError(
                "reading .parquet needs pyarrow: pip install 'static-keras[data]'"
            ) from None
        table = parquet.read_table(path)
        names = [column] if column else [n for n in table.column_names if n != "item_id"]
        missing = [n for n in names if n not in table.column_names]
        if missing:
            raise UserError(f"{path}: no column {missing[0]!r} (columns: {table.column_names})")
        return np.stack([table.column(n).to_numpy() for n in names], axis=1)
    raise UserError(f"unsupported input format (expected .npy, .csv or .parquet): {path}")


class _ProgressBar:
    """A one-line progress bar on stderr, for builds of large inputs."""

    def __init__(self, enabled: bool):
        self.enabled = enabled

    def __call__(self, stage: str, fraction: float) -> None:
        if not self.enabled:
            return
        filled = int(30 * fraction)
        end = "\n" if fraction >= 1 else ""
        sys.stderr.write(
            f"\r[{'#' * filled}{'.' * (30 - filled)}] {fraction:4.0%} {stage:<12}{end}"
        )
        sys.stderr.flush()


def _dense_levels(text: str):
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an int or 'auto', got {text!r}") from None


def _cmd_build_index(args) -> None:
    if args.runner == "beam":
        _build_index_beam(args)
        return
    from static_keras.index.static_index import StaticIndex

    beam_only = [
        flag
        for flag, value in (
            ("--beam-option", args.beam_option),
            ("--input-format", args.input_format != "auto"),
            ("--sequence-field", args.sequence_field),
            ("--item-id-field", args.item_id_field),
            ("--partition-levels", args.partition_levels != "auto"),
            ("--temp-location", args.temp_location),
        )
        if value
    ]
    if beam_only:
        raise UserError(f"{beam_only[0]} needs --runner beam")
    if len(args.sequences) != 1:
        raise UserError(
            "the in-process runner reads one file; globs and many files need --runner beam"
        )
    sequences = _load_array(args.sequences[0])
    item_ids = None
    if args.item_ids:
        item_ids = _load_array(args.item_ids, column="item_id")
        if item_ids.ndim == 2 and item_ids.shape[1] == 1:
            item_ids = item_ids[:, 0]
    large = sequences.size >= 10**7 and sys.stderr.isatty()
    progress = _ProgressBar(args.progress or large)
    start = time.perf_counter()
    index = StaticIndex.build(
        sequences,
        args.vocab_size,
        item_ids=item_ids,
        dense_levels=args.dense_levels,
        on_duplicate_item=args.on_duplicate_item,
        progress=progress,
    )
    seconds = time.perf_counter() - start
    index.save(args.out)
    progress("saved", 1.0)
    print(f"built in {seconds:.2f} s, wrote {args.out}")
    _print_stats(index)


def _build_index_beam(args) -> None:
    """`build-index --runner beam`: shards (globs) through an Apache Beam pipeline."""
    if args.item_ids:
        raise UserError(
            "with --runner beam, item ids come from the shards: pass --item-id-field "
            "(a Parquet column, a TFRecord feature, or the last CSV column)"
        )
    try:
        from static_keras.index.beam_build import PipelineFailed
        from static_keras.index.beam_build import build_index_beam
    except ImportError as error:
        raise UserError(
            f"--runner beam needs Apache Beam ({error}): pip install 'static-keras[beam]'"
        ) from None
    start = time.perf_counter()
    try:
        index = build_index_beam(
            args.sequences,
            args.vocab_size,
            args.out,
            input_format=args.input_format,
            sequence_field=args.sequence_field,
            item_id_field=args.item_id_field,
            dense_levels=args.dense_levels,
            on_duplicate_item=args.on_duplicate_item,
            partition_levels=args.partition_levels,
            pipeline_options=args.beam_option or [],
            temp_location=args.temp_location,
            progress=_ProgressBar(args.progress or sys.stderr.isatty()),
        )
    except PipelineFailed as error:
        raise UserError(str(error)) from None
    seconds = time.perf_counter() - start
    print(f"built with Apache Beam in {seconds:.2f} s, wrote {args.out}")
    _print_stats(index)


def _load_index(path: str):
    """An index file of any kind (semantic IDs or a string set)."""
    from static_keras.index import archive

    if os.path.isfile(path):
        _check_is_archive(path)
    try:
        return archive.load(path)
    except (FileNotFoundError, ValueError) as error:
        raise UserError(str(error)) from None


_BUILD_HINT = "build an index from it with `static-keras build-index`"


def _check_is_archive(path: str) -> None:
    """UserError naming what `path` is when it is not an .npz archive (an
    index is one): a plain array, a Parquet or text file, a Keras model."""
    import zipfile

    import numpy as np

    with open(path, "rb") as file:
        start = file.read(4096)
    what = None
    if start.startswith(b"\x93NUMPY"):
        try:
            array = np.load(path, mmap_mode="r", allow_pickle=False)
        except ValueError as error:
            what = f"it is a .npy file NumPy cannot read ({error})"
        else:
            kind = "int" if array.dtype.kind in "iu" else str(array.dtype)
            axes = {1: "[N]", 2: "[N, L]"}.get(array.ndim, str(list(array.shape)))
            what = f"it holds one {kind} array {axes} (shape {array.shape})"
            if array.ndim == 2 and kind == "int":
                what += f"; {_BUILD_HINT}"
            elif array.ndim == 1 and kind == "int":
                what += (
                    " (item ids?); an index is built from semantic IDs [N, L] with "
                    "`static-keras build-index` (item ids go to its --item-ids)"
                )
    elif start.startswith(b"PAR1"):
        what = f"it is a Parquet file; {_BUILD_HINT}"
    elif start.startswith(b"PK\x03\x04"):
        with zipfile.ZipFile(path) as archive:
            names = set(archive.namelist())
        if {"config.json", "metadata.json"} <= names:
            what = "it is a Keras model (.keras), not an index file"
    elif not start:
        what = "the file is empty"
    elif b"\0" not in start:
        what = f"it is a text file (CSV?); {_BUILD_HINT}"
    else:
        what = "it is not an .npz archive (index files are written by build-index or .save)"
    if what:
        raise UserError(f"{path}: not a static-keras index: {what}")


def _cmd_inspect(args) -> None:
    _print_stats(_load_index(args.index))


def _print_stats(index) -> None:
    print(f"kind          {index.kind}")
    if index.kind == "semantic_ids":
        print(f"sequences     {index.num_members:,}")
    else:
        print(f"members       {index.num_members:,}")
        print(f"eos_token_id  {index.eos_token_id}")
    print(f"states        {index.num_states:,}")
    print(f"vocab_size    {index.vocab_size}")
    print(f"length        {index.length}")
    print(f"dense_levels  {index.dense_levels}")
    print(f"step_widths   {list(index.step_widths)}")
    print(f"item_ids      {'yes' if index.has_item_ids else 'no'}")
    print(f"bytes         {index.nbytes:,}")
    for name, array in index.arrays.items():
        print(f"  {name:<14}{str(array.dtype):>8} {str(array.shape):>18} {array.nbytes:>14,}")
    print(f"checksum      {index.checksum}")


def _cmd_demo(args) -> None:
    if args.strings:
        import importlib.util

        missing = [m for m in ("botocore", "tokenizers") if importlib.util.find_spec(m) is None]
        if missing:
            raise UserError(
                f"demo --strings needs {' and '.join(missing)}: "
                "pip install 'static-keras[strings-demo]'"
            )
        from static_keras.demo.string_answers import run_strings_demo

        run_strings_demo(args.out or "static_keras_strings_demo", quick=args.quick, seed=args.seed)
        return
    from static_keras.demo import run_demo

    run_demo(args.out or "static_keras_demo", quick=args.quick, seed=args.seed,
             serve=not args.no_serve)  # fmt: skip


def _load_model(path: str):
    from static_keras import saving

    if not os.path.isfile(path):
        raise UserError(f"no such model file: {path}")
    return saving.load_model(path)


def _model_with_index(args, model_base_path=None):
    """The model, over `--index` when given. Its eligibility sets come with
    it: those of the newest good version under `model_base_path` (the rules
    live in the served version; refreshes never touch the .keras file), or
    else the model's own, carried over to the new index by item id."""
    from static_keras.export import replace_index
    from static_keras.export.model_layers import beam_searches

    # The index first: a wrong --index fails in a moment, not after the model loads.
    index = _load_index(args.index) if args.index else None
    model = _load_model(args.model)
    if index is None:
        return model
    searches = beam_searches(model)
    constraint = searches[0].constraint if len(searches) == 1 else None
    sets, source = None, "the model"
    if constraint is not None and constraint.num_eligibility_sets:
        served = _served_sets(model_base_path)
        if served is not None:
            source, sets = f"version {served[0]}", served[1]
        else:
            sets = constraint.eligibility_sets()
    try:
        carried = None if sets is None else sets.carried_over(index)
        model = replace_index(model, index, eligibility=carried)
    except ValueError as error:
        raise UserError(str(error)) from None
    if carried is not None:
        before, after = sets.sizes(), carried.sizes()
        counts = ", ".join(f"{name} {before[name]:,} -> {after[name]:,}" for name in carried.names)
        print(f"eligibility sets of {source} carried over to the new index by item id: {counts}")
    return model


def _served_sets(model_base_path):
    """`(version, EligibilitySets)` of the newest good version under
    `model_base_path` that holds sets, or None."""
    if not model_base_path or not os.path.isdir(model_base_path):
        return None
    from static_keras.export import read_eligibility
    from static_keras.export import read_metadata
    from static_keras.export.publish import newest_good_version

    version = newest_good_version(model_base_path)
    if version is None:
        return None
    path = os.path.join(model_base_path, str(version))
    if not read_metadata(path).get("eligibility"):
        return None
    return version, read_eligibility(path)


def _cmd_export(args) -> None:
    from static_keras.export import export_saved_model

    info = export_saved_model(
        _model_with_index(args),
        args.out,
        xla=args.xla,
        warmup_batch_sizes=tuple(args.warmup_batch_sizes),
        model_name=args.model_name,
    )
    print(
        f"exported {info.path} in {info.seconds:.1f} s: inputs {list(info.input_names)}, "
        f"outputs {list(info.output_names)}, {info.num_variables} variables, "
        f"{info.variable_bytes:,} bytes"
    )


def _cmd_publish(args) -> None:
    from static_keras.export import publish

    info = publish(
        _model_with_index(args, args.model_base_path),
        args.model_base_path,
        version=args.version,
        keep=args.keep,
        xla=args.xla,
        warmup_batch_sizes=tuple(args.warmup_batch_sizes),
        model_name=args.model_name,
    )
    removed = f", removed {list(info.removed_versions)}" if info.removed_versions else ""
    for version, path in zip(info.quarantined_versions, info.quarantined_paths):
        removed += f"; version {version} does not load: moved to {path}"
    stuck = sorted(set(info.rejected_versions) - set(info.quarantined_versions))
    if stuck:
        removed += f"; versions {stuck} do not load and could not be moved out"
    if info.removed_leftovers:
        removed += f"; removed leftovers {list(info.removed_leftovers)}"
    print(f"published version {info.version} at {info.path} in {info.seconds:.1f} s{removed}")


def _cmd_refresh_eligibility(args) -> None:
    from static_keras.export import refresh_eligibility

    sets = {}
    for spec in args.set:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise UserError(f"--set must be NAME=FILE (item ids, .npy/.csv/.parquet); got {spec!r}")
        sets[name] = _load_array(path, args.column).reshape(-1)
    info = refresh_eligibility(
        args.model_base_path,
        sets,
        source_version=args.source_version,
        version=args.version,
        keep=args.keep,
    )
    removed = f", removed {list(info.removed_versions)}" if info.removed_versions else ""
    for version, path in zip(info.quarantined_versions, info.quarantined_paths):
        removed += f"; version {version} does not load: moved to {path}"
    sizes = ", ".join(f"{name} {size:,}" for name, size in info.sizes.items())
    print(
        f"published version {info.version} (sets of version {info.source_version} replaced: "
        f"{sizes} members) at {info.path} in {info.seconds:.2f} s{removed}"
    )


def _cmd_serve_dev(args) -> None:
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
        raise UserError(str(error)) from None
    models = [manager.config for manager in server.managers.values()]
    print(
        f"development server (not for production): gRPC {server.grpc_address}, "
        f"REST {server.rest_url}",
        flush=True,
    )
    for model in models:
        for version, state, error in server.manager(model.name).status(None, None):
            print(f"  {model.name} version {version}: {state} {error}".rstrip(), flush=True)
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    try:
        stopped.wait(args.run_seconds) if args.run_seconds else stopped.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


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


def _cmd_query(args) -> None:
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


def _source_checkout() -> str | None:
    """The repository root when static_keras runs from a source checkout, else None.

    An installed package's parent is site-packages, where a folder named
    `benchmarks` may belong to anything: only a root whose pyproject.toml
    names this project counts.
    """
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        with open(os.path.join(root, "pyproject.toml")) as file:
            project = file.read()
    except OSError:
        return None
    return root if 'name = "static-keras"' in project else None


def _cmd_bench(args) -> None:
    import importlib.util

    root = _source_checkout()
    script = os.path.join(root, "benchmarks", "run_all.py") if root else None
    if script is None or not os.path.isfile(script):
        raise UserError(
            "the benchmark suite runs from a source checkout only (benchmarks/run_all.py "
            "beside static_keras/): git clone the repository, `pip install -e .` there, and "
            "run `static-keras bench` again"
        )
    spec = importlib.util.spec_from_file_location("static_keras_benchmarks", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(args.args)


def _command(commands, name: str, help: str, description: str, example: str):
    """A subcommand whose --help shows a paragraph and an example, as written."""
    return commands.add_parser(
        name,
        help=help,
        description=textwrap.dedent(description).strip(),
        epilog="example:\n" + textwrap.indent(textwrap.dedent(example).strip(), "  "),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def build_parser() -> argparse.ArgumentParser:
    from static_keras.serving.limits import ServerLimits

    parser = argparse.ArgumentParser(
        prog="static-keras",
        description="STATIC constrained decoding for Keras 3 and TensorFlow Serving: compile a "
        "catalogue's valid set into an index, decode only its members inside a Keras model, "
        "serve it with index refreshes that need no retraining.",
        epilog="Start with `static-keras demo`; docs/quickstart.md goes from your own semantic "
        "IDs to a served model. `static-keras COMMAND --help` explains each command.",
    )
    verbose_help = "also print TensorFlow's log lines and served errors in full"
    parser.add_argument("--verbose", action="store_true", help=verbose_help)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = _command(
        commands,
        "demo",
        help="generative retrieval end to end: semantic IDs, a trained decoder, "
        "constrained vs unconstrained beam search, cold start, a hot swap",
        description="""
            Generative retrieval end to end, on synthetic data: a catalogue of 50,000 items
            and its users, semantic IDs by residual k-means, a small Keras transformer
            decoder trained on the users' histories, then beam search without the
            constraint, constrained to the catalogue and constrained to fresh items
            (validity, eligibility, Recall@10, time per step), a cold-start run, three
            regions served from one index, and an export and hot swap of two index
            versions on the development server. Prints a table and writes OUT/report.md
            with three plots. A few minutes on a laptop's CPU; --quick is smaller.
            With --strings, the second demo instead: a small transformer trained here for at
            most 3 minutes answers which AWS operation (botocore's 15,000 names) a sentence
            describes, by beam search over its BPE vocabulary and constrained to the names;
            prints validity, accuracy and time per answer and writes OUT/report.md with a plot.
        """,
        example="""
            static-keras demo --quick --out /tmp/demo   # then read /tmp/demo/report.md
            static-keras demo --strings                 # a weak LLM-style model, constrained
        """,
    )
    demo.add_argument(
        "--strings",
        action="store_true",
        help="the second demo: a small model trained here answers which AWS operation a "
        "sentence describes, unconstrained and constrained to the 15,000 names (validity, "
        "accuracy, time per answer); needs botocore and tokenizers (static-keras[strings-demo])",
    )
    demo.add_argument(
        "--quick",
        action="store_true",
        help="20,000 items and fewer users and epochs (for CI); with --strings: 2,000 training "
        "questions",
    )
    demo.add_argument(
        "--out",
        help="report folder (default static_keras_demo, with --strings static_keras_strings_demo)",
    )
    demo.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    demo.add_argument("--no-serve", action="store_true", help="skip the export/serving part")
    demo.set_defaults(run=_cmd_demo)

    build = _command(
        commands,
        "build-index",
        help="compile sequences into an index file",
        description="""
            Compile semantic IDs (an int array [N, L], one row per item) into an index
            file: in this process from one .npy, .csv or .parquet file, or with --runner
            beam from many shards (globs, any Beam filesystem) through an Apache Beam
            pipeline (docs/beam.md). Prints the index's statistics, as inspect does.
        """,
        example="""
            static-keras build-index semantic_ids.npy --vocab-size 256 \\
                --item-ids item_ids.npy --out catalogue.npz
            static-keras build-index 'shards/*.parquet' --runner beam --vocab-size 256 \\
                --item-id-field item_id --out catalogue.npz
        """,
    )
    build.add_argument(
        "sequences",
        nargs="+",
        help="int array [N, L] of semantic IDs: .npy, .csv (no header) or .parquet (one "
        "integer column per level; a column 'item_id' is skipped); with --runner beam, "
        "paths or globs of .parquet, .tfrecord or .csv shards",
    )
    build.add_argument("--vocab-size", type=int, required=True, help="token ids per level, V")
    build.add_argument("--out", required=True, help="index file to write (.npz)")
    build.add_argument(
        "--item-ids", help="int array [N] of catalogue ids (.npy, .csv, or .parquet column item_id)"
    )
    build.add_argument("--progress", action="store_true", help="always draw the progress bar")
    build.add_argument(
        "--dense-levels",
        default="auto",
        type=_dense_levels,
        help="steps served by dense masks (int or 'auto', the default)",
    )
    build.add_argument(
        "--on-duplicate-item",
        default="error",
        choices=["error", "first", "last"],
        help="one semantic ID with two item ids: fail, or keep the first/last",
    )
    build.add_argument(
        "--runner",
        default="in-process",
        choices=["in-process", "beam"],
        help="in-process (default): StaticIndex.build in this process; beam: an Apache Beam "
        "pipeline, the local runner unless --beam-option says otherwise",
    )
    build.add_argument(
        "--beam-option",
        action="append",
        metavar="FLAG",
        help="a Beam pipeline option, passed on; repeat it, and write it with '=': "
        "--beam-option=--runner=DataflowRunner --beam-option=--direct_num_workers=2",
    )
    build.add_argument(
        "--input-format",
        default="auto",
        choices=["auto", "parquet", "tfrecord", "csv"],
        help="(beam) shard format; auto: from each file's suffix",
    )
    build.add_argument(
        "--sequence-field",
        help="(beam) Parquet list column or TFRecord int64 feature of the IDs (default: every "
        "Parquet column but the item ids; TFRecord feature 'semantic_id')",
    )
    build.add_argument(
        "--item-id-field",
        help="(beam) Parquet column or TFRecord feature of the item ids; for CSV, any name "
        "reads the last column",
    )
    build.add_argument(
        "--partition-levels",
        default="auto",
        type=_dense_levels,
        help="(beam) first tokens of a partition key (int or 'auto': at least 256 keys)",
    )
    build.add_argument(
        "--temp-location",
        help="(beam) folder for staged partitions, on a filesystem the workers can write "
        "(default: the pipeline's --temp_location, else beside --out)",
    )
    build.set_defaults(run=_cmd_build_index)

    inspect = _command(
        commands,
        "inspect",
        help="print an index file's statistics (semantic IDs or a string set)",
        description="""
            Print an index file's statistics: its kind, members, automaton states, vocab
            size, length, dense levels, step widths, bytes per array and checksum. Takes a
            semantic-ID index (build-index, StaticIndex.save) or a string set
            (StringIndex.save), and says what a file is when it is not an index.
        """,
        example="""
            static-keras inspect catalogue.npz
        """,
    )
    inspect.add_argument(
        "index", help="index file written by build-index, StaticIndex.save or StringIndex.save"
    )
    inspect.set_defaults(run=_cmd_inspect)

    def model_arguments(command):
        command.add_argument("model", help=".keras model holding a ConstrainedBeamSearch")
        command.add_argument(
            "--index",
            help="index file to decode over instead (an index-only refresh: same decoder "
            "weights, another valid set)",
        )
        command.add_argument(
            "--xla", action="store_true",
            help="save jit-compiled functions (the server needs XLA enabled: docs/serving.md)",
        )  # fmt: skip
        command.add_argument(
            "--warmup-batch-sizes", type=int, nargs="+", default=[1, 8],
            help="batch sizes of the warmup requests (default 1 8)",
        )  # fmt: skip
        command.add_argument(
            "--model-name", default="static_keras",
            help="model name in the warmup requests (default static_keras)",
        )  # fmt: skip

    export = _command(
        commands,
        "export",
        help="write a SavedModel for TF Serving",
        description="""
            Write a SavedModel for TensorFlow Serving from a .keras model that holds a
            ConstrainedBeamSearch: the decoder weights and the index tensors as variables,
            a serving_default signature with named outputs (tokens, scores, item_ids), and
            warmup requests; it is reloaded and checked before the command returns. With
            --index the same decoder decodes over another index file. For the versioned
            folders that a server polls, use publish.
        """,
        example="""
            static-keras export recommender.keras --out exported/recs
        """,
    )
    model_arguments(export)
    export.add_argument("--out", required=True, help="directory to create")
    export.set_defaults(run=_cmd_export)

    publish = _command(
        commands,
        "publish",
        help="export atomically as a new version under a model base path",
        description="""
            Export the model as a new integer version under --model-base-path, atomically:
            the version is written beside the others, loaded and warmed up, then renamed
            into place, so a polling tensorflow_model_server (or serve-dev) only ever sees
            complete versions and swaps to it without failing a request. Keeps the newest
            --keep versions that load. With --index it publishes the same decoder over
            another index file (tomorrow's catalogue, in-stock items): no retraining.
        """,
        example="""
            static-keras publish recommender.keras --model-base-path models/recs
            static-keras publish recommender.keras --model-base-path models/recs \\
                --index in_stock.npz
        """,
    )
    model_arguments(publish)
    publish.add_argument("--model-base-path", required=True, help="directory TF Serving polls")
    publish.add_argument("--version", type=int, help="version number (default: newest + 1)")
    publish.add_argument(
        "--keep", type=int, default=3,
        help="versions that load and warm up to keep; rejected ones never count (default 3)",
    )  # fmt: skip
    publish.set_defaults(run=_cmd_publish)

    refresh = _command(
        commands,
        "refresh-eligibility",
        help="publish a version whose only change is some eligibility sets (no rebuild)",
        description="""
            Publish a new version whose only change is the members of some eligibility sets
            (regions, in stock, ...) of a served model: the newest version (or
            --source-version) is copied, each --set named is replaced by the item ids in
            its file, and the copy is published as publish does. The model and its index
            are neither loaded nor rebuilt. The model must have been exported with those
            sets (EligibilitySets, docs/concepts.md); the other sets keep their members.
        """,
        example="""
            static-keras refresh-eligibility --model-base-path models/recs \\
                --set in_stock=in_stock_ids.npy --set region_eu=eu_ids.parquet --column item_id
        """,
    )
    refresh.add_argument("--model-base-path", required=True, help="directory TF Serving polls")
    refresh.add_argument(
        "--set", action="append", required=True, metavar="NAME=FILE",
        help="a set to replace and its eligible item ids (.npy, .csv or .parquet); repeatable",
    )  # fmt: skip
    refresh.add_argument("--column", help="the item id column of a .parquet file")
    refresh.add_argument("--source-version", type=int, help="version to copy (default: newest)")
    refresh.add_argument("--version", type=int, help="version number (default: newest + 1)")
    refresh.add_argument("--keep", type=int, default=3, help="good versions to keep (default 3)")
    refresh.set_defaults(run=_cmd_refresh_eligibility)

    serve = _command(
        commands,
        "serve-dev",
        help="development TF Serving stand-in (production: tensorflow_model_server)",
        description="""
            A development server for local use and tests, with the flag names of
            tensorflow_model_server: serves the versions under --model_base_path (or the
            models of --model_config_file) over gRPC and REST, loads and warms up new
            versions as they appear and swaps to them without failing a request. Version
            loads, rejections and swaps are logged on stderr. Production runs
            tensorflow_model_server (docs/serving.md).
        """,
        example="""
            static-keras serve-dev --model_name recs --model_base_path models/recs &
            static-keras query --grpc 127.0.0.1:8500 --model recs --input history=3,14,15 --wait 60
        """,
    )
    serve.add_argument("--port", type=int, default=8500, help="gRPC port (default 8500)")
    serve.add_argument("--rest_api_port", type=int, default=8501, help="REST port (default 8501)")
    serve.add_argument("--model_name", default="default", help="model name (default 'default')")
    serve.add_argument("--model_base_path", help="directory of integer version directories")
    serve.add_argument("--model_config_file", help="models.config (labels, specific versions)")
    serve.add_argument(
        "--file_system_poll_wait_seconds", type=float, default=1.0,
        help="seconds between looks for new or removed versions (default 1)",
    )  # fmt: skip
    serve.add_argument(
        "--xla_cpu_compilation_enabled", action="store_true",
        help="serve versions exported with --xla (jit-compiled); without it they are "
        "rejected, as tensorflow_model_server does",
    )  # fmt: skip
    defaults = ServerLimits()
    serve.add_argument(
        "--max_body_bytes", type=int, default=defaults.max_body_bytes,
        help=f"largest REST body; larger ones get HTTP 413 (default {defaults.max_body_bytes})",
    )  # fmt: skip
    serve.add_argument(
        "--read_timeout_seconds", type=float, default=defaults.read_timeout_seconds,
        help="time a REST client has to send a request; then HTTP 408 "
        f"(default {defaults.read_timeout_seconds:g})",
    )  # fmt: skip
    serve.add_argument(
        "--max_batch_rows", type=int, default=defaults.max_batch_rows,
        help=f"most rows in one request, 0 = no limit (default {defaults.max_batch_rows})",
    )  # fmt: skip
    serve.add_argument("--run-seconds", type=float, help="stop after this long (default: never)")
    serve.set_defaults(run=_cmd_serve_dev)

    query = _command(
        commands,
        "query",
        help="send one Predict request to a server",
        description="""
            Send one Predict request (signature serving_default) to tensorflow_model_server
            or serve-dev and print each output. Inputs are int32 rows: --input
            history=1,2,3 is one row, 'history=1,2,3;4,5,6' two. A gRPC answer says which
            version served it; a REST answer from tensorflow_model_server does not (pin
            --version). Neither path loads TensorFlow, so a query against a running server
            takes a fraction of a second. Errors raised by the model (an id out of range)
            print as their message alone; --verbose prints them as served.
        """,
        example="""
            static-keras query --grpc 127.0.0.1:8500 --model recs --input history=3,14,15,92
            static-keras query --rest 127.0.0.1:8501 --model recs --input 'history=3,14;15,92'
        """,
    )
    query.add_argument("--model", required=True, help="model name")
    query.add_argument("--grpc", help="gRPC address HOST:PORT, e.g. 127.0.0.1:8500")
    query.add_argument(
        "--rest", help="REST address: a base URL or HOST:PORT, e.g. 127.0.0.1:8501 (http)"
    )
    query.add_argument(
        "--input", action="append", required=True, metavar="NAME=ROWS",
        help="an input and its int32 rows, NAME=1,2,3;4,5,6 (rows split by ';'); repeatable",
    )  # fmt: skip
    query.add_argument("--version", type=int, help="model version (default: the newest)")
    query.add_argument("--label", help="version label (from a models.config)")
    query.add_argument("--timeout", type=float, default=10.0, help="seconds (default 10)")
    query.add_argument(
        "--wait", type=float, default=0.0,
        help="seconds to keep retrying while the server is not up yet (default 0)",
    )  # fmt: skip
    query.set_defaults(run=_cmd_query)

    bench = _command(
        commands,
        "bench",
        help="run the benchmark suite (benchmarks/ in a source checkout)",
        description="""
            Run the decoding benchmark suite of a source checkout (benchmarks/run_all.py):
            index build time and bytes against N, the constraint's cost per decoding step
            against the baselines over N, vocabulary and rows, and the step kernel; it
            prints tables and writes CSVs and plots. The full run takes about 30 minutes;
            --quick about a minute. Every argument after `bench` goes to run_all.py:
            --quick, --device cpu|gpu, --results-dir DIR, --img-dir DIR, --only PART...,
            --skip PART..., --sizes N...; `static-keras bench -- --help` lists them.
        """,
        example="""
            static-keras bench --quick
            static-keras bench --only build n --sizes 1e5 1e6 --results-dir /tmp/bench
        """,
    )
    bench.add_argument(
        "args", nargs=argparse.REMAINDER, metavar="ARGS",
        help="arguments of benchmarks/run_all.py (see above), passed on as given",
    )  # fmt: skip
    bench.set_defaults(run=_cmd_bench)

    for command in commands.choices.values():
        # Also after the command (`static-keras demo --verbose`); SUPPRESS keeps
        # an earlier `static-keras --verbose demo` from being reset.
        command.add_argument(
            "--verbose", action="store_true", default=argparse.SUPPRESS, help=verbose_help
        )
    return parser


def main(argv=None) -> int:
    argv, passed_on = _split_bench_arguments(sys.argv[1:] if argv is None else list(argv))
    args = build_parser().parse_args(argv)
    if passed_on is not None:
        args.args = passed_on
    try:
        _check_input_files(args)
        if not args.verbose:
            _quiet_tensorflow(import_now=args.command in _TENSORFLOW_COMMANDS)
        args.run(args)
    except Exception as error:
        from static_keras.serving.client import ServingError

        if not isinstance(error, (UserError, ValueError, FileNotFoundError, ServingError)):
            raise
        message = str(error)
        if isinstance(error, ServingError) and not args.verbose:
            message = _served_error_message(message)
        print(f"static-keras: error: {message}", file=sys.stderr)
        return 2
    return 0


def _split_bench_arguments(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """`(argv for the parser, bench's arguments or None)`.

    Everything after `bench` goes to benchmarks/run_all.py as given (a
    leading `--` dropped), but for `--verbose` and a lone `-h`/`--help`:
    argparse's REMAINDER would take `--quick` for an option of its own.
    """
    command = next((i for i, arg in enumerate(argv) if not arg.startswith("-")), None)
    if command is None or argv[command] != "bench":
        return argv, None
    rest = argv[command + 1 :]
    if rest in (["-h"], ["--help"]):
        return argv, None
    own = ["--verbose"] if "--verbose" in rest else []
    rest = [arg for arg in rest if arg != "--verbose"]
    return argv[: command + 1] + own, rest[1:] if rest[:1] == ["--"] else rest


def _check_input_files(args) -> None:
    """A missing model or index file fails before TensorFlow loads (seconds)."""
    if args.command not in ("export", "publish"):
        return
    if not os.path.isfile(args.model):
        raise UserError(f"no such model file: {args.model}")
    if args.index:
        if not os.path.isfile(args.index):
            raise UserError(f"no such index file: {args.index}")
        _check_is_archive(args.index)


if __name__ == "__main__":
    sys.exit(main())
