"""The `static-keras` command line.

User mistakes (a missing file, a wrong shape, a bad vocab size) end in one
line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


class UserError(Exception):
    """A mistake in the command's input: reported in one line."""


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

    try:
        return archive.load(path)
    except (FileNotFoundError, ValueError) as error:
        raise UserError(str(error)) from None


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
    from static_keras.demo import run_demo

    run_demo(args.out, quick=args.quick, seed=args.seed, serve=not args.no_serve)


def _load_model(path: str):
    from static_keras import saving

    if not os.path.isfile(path):
        raise UserError(f"no such model file: {path}")
    return saving.load_model(path)


def _model_with_index(args):
    from static_keras.export import replace_index

    model = _load_model(args.model)
    if args.index:
        try:
            model = replace_index(model, _load_index(args.index))
        except ValueError as error:
            raise UserError(str(error)) from None
    return model


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
        _model_with_index(args),
        args.model_base_path,
        version=args.version,
        keep=args.keep,
        xla=args.xla,
        warmup_batch_sizes=tuple(args.warmup_batch_sizes),
        model_name=args.model_name,
    )
    removed = f", removed {list(info.removed_versions)}" if info.removed_versions else ""
    if info.rejected_versions:
        removed += f"; versions {list(info.rejected_versions)} do not load (kept, not counted)"
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
    ).start()
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


def _cmd_query(args) -> None:
    import numpy as np

    from static_keras.serving import GrpcClient
    from static_keras.serving import RestClient

    inputs = dict(_parse_input(text) for text in args.input)
    if bool(args.grpc) == bool(args.rest):
        raise UserError("pass exactly one of --grpc HOST:PORT or --rest URL")
    from static_keras.serving import ServingError

    deadline = time.monotonic() + args.wait
    while True:
        try:
            if args.grpc:
                with GrpcClient(args.grpc, timeout=args.timeout) as client:
                    outputs = client.predict(
                        args.model, inputs, version=args.version, label=args.label
                    )
            else:
                client = RestClient(args.rest, timeout=args.timeout)
                outputs = client.predict(args.model, inputs, version=args.version, label=args.label)
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


def build_parser() -> argparse.ArgumentParser:
    from static_keras.serving.limits import ServerLimits

    parser = argparse.ArgumentParser(
        prog="static-keras",
        description="STATIC constrained decoding for Keras 3 and TensorFlow Serving.",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser(
        "demo",
        help="generative retrieval end to end: semantic IDs, a trained decoder, "
        "constrained vs unconstrained beam search, cold start, a hot swap",
    )
    demo.add_argument("--quick", action="store_true", help="small and fast (for CI)")
    demo.add_argument("--out", default="static_keras_demo", help="report folder")
    demo.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    demo.add_argument("--no-serve", action="store_true", help="skip the export/serving part")
    demo.set_defaults(run=_cmd_demo)

    build = commands.add_parser(
        "build-index",
        help="compile sequences into an index file",
        description="Compile semantic IDs into an index file: in this process from one file, "
        "or with --runner beam from many shards (globs, any Beam filesystem) through an "
        "Apache Beam pipeline (docs/beam.md).",
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

    inspect = commands.add_parser(
        "inspect", help="print an index file's statistics (semantic IDs or a string set)"
    )
    inspect.add_argument(
        "index", help="index file written by build-index, StaticIndex.save or StringIndex.save"
    )
    inspect.set_defaults(run=_cmd_inspect)

    def model_arguments(command):
        command.add_argument("model", help=".keras model holding a ConstrainedBeamSearch")
        command.add_argument(
            "--index", help="index file to decode over instead (an index-only refresh)"
        )
        command.add_argument("--xla", action="store_true", help="save jit-compiled functions")
        command.add_argument(
            "--warmup-batch-sizes", type=int, nargs="+", default=[1, 8],
            help="batch sizes of the warmup requests (default 1 8)",
        )  # fmt: skip
        command.add_argument("--model-name", default="static_keras", help="name in warmup requests")

    export = commands.add_parser("export", help="write a SavedModel for TF Serving")
    model_arguments(export)
    export.add_argument("--out", required=True, help="directory to create")
    export.set_defaults(run=_cmd_export)

    publish = commands.add_parser(
        "publish", help="export atomically as a new version under a model base path"
    )
    model_arguments(publish)
    publish.add_argument("--model-base-path", required=True, help="directory TF Serving polls")
    publish.add_argument("--version", type=int, help="version number (default: newest + 1)")
    publish.add_argument(
        "--keep", type=int, default=3,
        help="versions that load and warm up to keep; rejected ones never count (default 3)",
    )  # fmt: skip
    publish.set_defaults(run=_cmd_publish)

    refresh = commands.add_parser(
        "refresh-eligibility",
        help="publish a version whose only change is some eligibility sets (no rebuild)",
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

    serve = commands.add_parser(
        "serve-dev",
        help="development TF Serving stand-in (production: tensorflow_model_server)",
        description="A development server for local use and tests, with the flag names of "
        "tensorflow_model_server. Production runs tensorflow_model_server (docs/serving.md).",
    )
    serve.add_argument("--port", type=int, default=8500, help="gRPC port (default 8500)")
    serve.add_argument("--rest_api_port", type=int, default=8501, help="REST port (default 8501)")
    serve.add_argument("--model_name", default="default", help="model name (default 'default')")
    serve.add_argument("--model_base_path", help="directory of integer version directories")
    serve.add_argument("--model_config_file", help="models.config (labels, specific versions)")
    serve.add_argument("--file_system_poll_wait_seconds", type=float, default=1.0)
    serve.add_argument("--xla_cpu_compilation_enabled", action="store_true")
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

    query = commands.add_parser("query", help="send one Predict request to a server")
    query.add_argument("--model", required=True, help="model name")
    query.add_argument("--grpc", help="gRPC address HOST:PORT")
    query.add_argument("--rest", help="REST base URL, e.g. http://127.0.0.1:8501")
    query.add_argument(
        "--input", action="append", required=True, help="NAME=1,2,3;4,5,6 (rows split by ';')"
    )
    query.add_argument("--version", type=int, help="model version")
    query.add_argument("--label", help="version label")
    query.add_argument("--timeout", type=float, default=10.0, help="seconds (default 10)")
    query.add_argument(
        "--wait", type=float, default=0.0,
        help="seconds to keep retrying while the server is not up yet (default 0)",
    )  # fmt: skip
    query.set_defaults(run=_cmd_query)

    bench = commands.add_parser(
        "bench", help="run the benchmark suite (benchmarks/ in a source checkout)"
    )
    bench.add_argument("args", nargs=argparse.REMAINDER, help="passed on, e.g. --quick")
    bench.set_defaults(run=_cmd_bench)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.run(args)
    except Exception as error:
        from static_keras.serving.client import ServingError

        if not isinstance(error, (UserError, ValueError, FileNotFoundError, ServingError)):
            raise
        print(f"static-keras: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
