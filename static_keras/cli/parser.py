"""The parser of the `static-keras` command line: one subcommand per command,
each with a paragraph and an example in its --help.

The commands are declared as data, in `COMMANDS` (in the order that
`static-keras --help` lists them); `build_parser` turns that table into the
argparse parser. Arguments that several commands share are declared once,
as the constants above the table.
"""

from __future__ import annotations

import argparse
import dataclasses
import textwrap
from collections.abc import Callable
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from static_keras import __version__
from static_keras.cli import bench_command
from static_keras.cli import index_commands
from static_keras.cli import model_commands
from static_keras.cli import serving_commands


@dataclasses.dataclass(frozen=True)
class Argument:
    """One `add_argument` call. A field left None is not passed, so argparse's
    own default holds (False for store_true, None for a value, required for a
    positional)."""

    name: str  # "--flag", or a positional's name
    help: str
    action: str | None = None
    type: Callable[[str], Any] | None = None
    default: Any = None
    choices: Sequence[str] | None = None
    nargs: int | str | None = None
    required: bool | None = None
    metavar: str | None = None

    def keywords(self) -> dict[str, Any]:
        """The keywords of `add_argument` that this argument sets."""
        keywords = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name == "name" or value is None:
                continue
            # argparse hands out a default object as is: a fresh list per parser
            # keeps one run's changes out of the next (the table is shared).
            keywords[field.name] = list(value) if isinstance(value, list) else value
        return keywords


# A function that returns some arguments when the parser is built rather than when
# this module is imported: serve-dev's request limits show ServerLimits' defaults,
# and importing static_keras.serving loads NumPy.
ArgumentsAtBuild = Callable[[], Sequence[Argument]]


@dataclasses.dataclass(frozen=True)
class Command:
    """One subcommand: its line in `static-keras --help`, the paragraph and the
    example of its own --help (dedented when the parser is built), the function
    that runs it and its arguments, in --help order."""

    name: str
    help: str
    description: str
    example: str
    # The function that runs the command, as a module and a name: it is looked up
    # when the parser is built, so that a function patched into the module (by a
    # test) is the one that runs.
    module: ModuleType
    function: str
    arguments: tuple[Argument | ArgumentsAtBuild, ...]


DESCRIPTION = (
    "STATIC constrained decoding for Keras 3 and TensorFlow Serving: compile a "
    "catalogue's valid set into an index, decode only its members inside a Keras "
    "model, serve it with index refreshes that need no retraining."
)
EPILOG = (
    "Start with `static-keras demo`; docs/quickstart.md goes from your own semantic "
    "IDs to a served model. `static-keras COMMAND --help` explains each command."
)
VERBOSE_HELP = "also print TensorFlow's log lines and served errors in full"

# --verbose is also accepted after the command (`static-keras demo --verbose`);
# SUPPRESS keeps an earlier `static-keras --verbose demo` from being reset.
VERBOSE_AFTER_COMMAND = Argument(
    "--verbose", action="store_true", default=argparse.SUPPRESS, help=VERBOSE_HELP
)

# export and publish: a .keras model, and how its SavedModel is written.
MODEL_FILE_ARGUMENTS = (
    Argument("model", help=".keras model holding a ConstrainedBeamSearch"),
    Argument(
        "--index",
        help="index file to decode over instead (an index-only refresh: same decoder "
        "weights, another valid set)",
    ),
    Argument(
        "--xla",
        action="store_true",
        help="save jit-compiled functions (the server needs XLA enabled: docs/serving.md)",
    ),
    Argument(
        "--warmup-batch-sizes",
        type=int,
        nargs="+",
        default=[1, 8],
        help="batch sizes of the warmup requests (default 1 8)",
    ),
    Argument(
        "--model-name",
        default="static_keras",
        help="model name in the warmup requests (default static_keras)",
    ),
)

# The commands that publish a version under a base path.
MODEL_BASE_PATH = Argument("--model-base-path", required=True, help="directory TF Serving polls")
NEW_VERSION = Argument("--version", type=int, help="version number (default: newest + 1)")
# The long jobs: their stage lines (static_keras.progress).
STAGE_LINES = Argument(
    "--progress",
    action="store_true",
    help="print each stage with its time on stderr (the default when stderr is a terminal)",
)
KEEP_GOOD_VERSIONS = Argument(
    "--keep", type=int, default=3, help="good versions to keep (default 3)"
)


def server_limit_arguments() -> tuple[Argument, ...]:
    """serve-dev's limits on one request, with ServerLimits' defaults."""
    from static_keras.serving.limits import ServerLimits

    defaults = ServerLimits()
    return (
        Argument(
            "--max_body_bytes",
            type=int,
            default=defaults.max_body_bytes,
            help=f"largest REST body; larger ones get HTTP 413 (default {defaults.max_body_bytes})",
        ),
        Argument(
            "--read_timeout_seconds",
            type=float,
            default=defaults.read_timeout_seconds,
            help="time a REST client has to send a request; then HTTP 408 "
            f"(default {defaults.read_timeout_seconds:g})",
        ),
        Argument(
            "--max_batch_rows",
            type=int,
            default=defaults.max_batch_rows,
            help=f"most rows in one request, 0 = no limit (default {defaults.max_batch_rows})",
        ),
    )


COMMANDS = (
    # -- the demo, and index files ------------------------------------------------
    Command(
        name="demo",
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
            with three plots. 40 s to 2 minutes on 2 CPU cores; --quick is smaller (about 1).
            With --strings, the second demo instead: a small transformer trained here for at
            most 3 minutes answers which AWS operation (botocore's 15,000 names) a sentence
            describes, by beam search over its BPE vocabulary and constrained to the names;
            prints validity, accuracy and time per answer and writes OUT/report.md with a plot.
        """,
        example="""
            static-keras demo --quick --out /tmp/demo   # then read /tmp/demo/report.md
            static-keras demo --strings                 # a weak LLM-style model, constrained
        """,
        module=model_commands,
        function="command_demo",
        arguments=(
            Argument(
                "--strings",
                action="store_true",
                help="the second demo: a small model trained here answers which AWS operation "
                "a sentence describes, unconstrained and constrained to the 15,000 names "
                "(validity, accuracy, time per answer); needs botocore and tokenizers "
                "(static-keras[strings-demo])",
            ),
            Argument(
                "--quick",
                action="store_true",
                help="20,000 items and fewer users and epochs (for CI); with --strings: 2,000 "
                "training questions",
            ),
            Argument(
                "--out",
                help="report folder (default static_keras_demo, with --strings "
                "static_keras_strings_demo)",
            ),
            Argument("--seed", type=int, default=0, help="random seed (default 0)"),
            Argument("--no-serve", action="store_true", help="skip the export/serving part"),
        ),
    ),
    Command(
        name="build-index",
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
        module=index_commands,
        function="command_build_index",
        arguments=(
            Argument(
                "sequences",
                nargs="+",
                help="int array [N, L] of semantic IDs: .npy, .csv (no header) or .parquet "
                "(one integer column per level; a column 'item_id' is skipped); with --runner "
                "beam, paths or globs of .parquet, .tfrecord or .csv shards",
            ),
            Argument("--vocab-size", type=int, required=True, help="token ids per level, V"),
            Argument("--out", required=True, help="index file to write (.npz)"),
            Argument(
                "--item-ids",
                help="int array [N] of catalogue ids (.npy, .csv, or .parquet column item_id)",
            ),
            Argument("--progress", action="store_true", help="always draw the progress bar"),
            Argument(
                "--dense-levels",
                default="auto",
                type=index_commands.dense_levels,
                help="steps served by dense masks (int or 'auto', the default)",
            ),
            Argument(
                "--on-duplicate-item",
                default="error",
                choices=["error", "first", "last"],
                help="one semantic ID with two item ids: fail, or keep the first/last",
            ),
            Argument(
                "--headroom",
                default=0.0,
                type=float,
                help="capacities this share above the catalogue, so that update-catalogue can "
                "publish later deltas without a new graph (e.g. 0.1; default 0: exact)",
            ),
            Argument(
                "--runner",
                default="in-process",
                choices=["in-process", "beam"],
                help="in-process (default): StaticIndex.build in this process; beam: an Apache "
                "Beam pipeline, the local runner unless --beam-option says otherwise",
            ),
            Argument(
                "--beam-option",
                action="append",
                metavar="FLAG",
                help="a Beam pipeline option, passed on; repeat it, and write it with '=': "
                "--beam-option=--runner=DataflowRunner --beam-option=--direct_num_workers=2",
            ),
            Argument(
                "--input-format",
                default="auto",
                choices=["auto", "parquet", "tfrecord", "csv"],
                help="(beam) shard format; auto: from each file's suffix",
            ),
            Argument(
                "--sequence-field",
                help="(beam) Parquet list column or TFRecord int64 feature of the IDs (default: "
                "every Parquet column but the item ids; TFRecord feature 'semantic_id')",
            ),
            Argument(
                "--item-id-field",
                help="(beam) Parquet column or TFRecord feature of the item ids; for CSV, any "
                "name reads the last column",
            ),
            Argument(
                "--partition-levels",
                default="auto",
                type=index_commands.dense_levels,
                help="(beam) first tokens of a partition key (int or 'auto': at least 256 keys)",
            ),
            Argument(
                "--temp-location",
                help="(beam) folder for staged partitions, on a filesystem the workers can "
                "write (default: the pipeline's --temp_location, else beside --out)",
            ),
        ),
    ),
    Command(
        name="inspect",
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
        module=index_commands,
        function="command_inspect",
        arguments=(
            Argument(
                "index",
                help="index file written by build-index, StaticIndex.save or StringIndex.save",
            ),
        ),
    ),
    # -- models, and the versions a server polls -----------------------------------
    Command(
        name="export",
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
        module=model_commands,
        function="command_export",
        arguments=(
            *MODEL_FILE_ARGUMENTS,
            Argument("--out", required=True, help="directory to create"),
            STAGE_LINES,
        ),
    ),
    Command(
        name="publish",
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
        module=model_commands,
        function="command_publish",
        arguments=(
            *MODEL_FILE_ARGUMENTS,
            MODEL_BASE_PATH,
            NEW_VERSION,
            Argument(
                "--keep",
                type=int,
                default=3,
                help="versions that load and warm up to keep; rejected ones never count "
                "(default 3)",
            ),
            STAGE_LINES,
        ),
    ),
    Command(
        name="refresh-eligibility",
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
        module=model_commands,
        function="command_refresh_eligibility",
        arguments=(
            MODEL_BASE_PATH,
            Argument(
                "--set",
                action="append",
                required=True,
                metavar="NAME=FILE",
                help="a set to replace and its eligible item ids (.npy, .csv or .parquet); "
                "repeatable",
            ),
            Argument("--column", help="the item id column of a .parquet file"),
            Argument("--source-version", type=int, help="version to copy (default: newest)"),
            NEW_VERSION,
            KEEP_GOOD_VERSIONS,
            STAGE_LINES,
        ),
    ),
    Command(
        name="update-catalogue",
        help="publish a catalogue delta (items added/removed) without a new graph",
        description="""
            Publish a new version whose catalogue is the served one's with items removed and
            added: the newest version (or --source-version) is read, the delta merged into
            its index (no full sort), the eligibility sets carried over by item id, and only
            the index and set tensors are written; the graph and warmup records are copied,
            and the copy is published as publish does. NumPy only: seconds at 2e7 items.
            The version's index must have headroom (StaticIndex.build(..., headroom=0.1));
            a delta beyond it is refused before anything is written.
        """,
        example="""
            static-keras update-catalogue --model-base-path models/recs \\
                --add added.parquet --remove removed.npy --add-to-set in_stock=fresh.npy
        """,
        module=model_commands,
        function="command_update_catalogue",
        arguments=(
            MODEL_BASE_PATH,
            Argument(
                "--add",
                metavar="FILE",
                help="items added: .npz (semantic_ids, item_ids), .parquet (item_id + one "
                "column per token), or .npy/.csv semantic ids with --add-item-ids",
            ),
            Argument("--add-item-ids", metavar="FILE", help="item ids of .npy/.csv --add rows"),
            Argument("--remove", metavar="FILE", help="item ids removed (.npy/.csv/.parquet)"),
            Argument(
                "--add-to-set",
                action="append",
                metavar="NAME=FILE",
                help="added items that join set NAME (others join no set); repeatable",
            ),
            Argument(
                "--on-duplicate-item",
                choices=("error", "first", "last"),
                default="error",
                help="an added semantic ID that an item already has (default: error)",
            ),
            Argument(
                "--base-fingerprint",
                help="the catalogue the delta was computed against (the last update's printed "
                "fingerprint): refused when the served catalogue differs",
            ),
            Argument("--source-version", type=int, help="version to change (default: newest)"),
            NEW_VERSION,
            KEEP_GOOD_VERSIONS,
            STAGE_LINES,
        ),
    ),
    # -- serving --------------------------------------------------------------------
    Command(
        name="serve-dev",
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
            history=3,14,15,92,65,35,89,79,32,38,46,26,43,38,32,79,50,28,84,19
            static-keras query --grpc 127.0.0.1:8500 --model recs --input history=$history --wait 60
        """,
        module=serving_commands,
        function="command_serve_dev",
        # The flag names are tensorflow_model_server's (snake case), but --run-seconds.
        arguments=(
            Argument("--port", type=int, default=8500, help="gRPC port (default 8500)"),
            Argument("--rest_api_port", type=int, default=8501, help="REST port (default 8501)"),
            Argument("--model_name", default="default", help="model name (default 'default')"),
            Argument("--model_base_path", help="directory of integer version directories"),
            Argument("--model_config_file", help="models.config (labels, specific versions)"),
            Argument(
                "--file_system_poll_wait_seconds",
                type=float,
                default=1.0,
                help="seconds between looks for new or removed versions (default 1)",
            ),
            Argument(
                "--xla_cpu_compilation_enabled",
                action="store_true",
                help="serve versions exported with --xla (jit-compiled); without it they are "
                "rejected, as tensorflow_model_server does",
            ),
            server_limit_arguments,
            Argument("--run-seconds", type=float, help="stop after this long (default: never)"),
        ),
    ),
    Command(
        name="query",
        help="send one Predict request to a server",
        description="""
            Send one Predict request (signature serving_default) to tensorflow_model_server
            or serve-dev and print each output. Inputs are int32 rows: --input
            history=1,2,3 is one row, 'history=1,2,3;4,5,6' two. A row has the length the
            model was built for (20 ids for a history of 20); another length is refused
            with INVALID_ARGUMENT naming the input and its shape. A gRPC answer says which
            version served it; a REST answer from tensorflow_model_server does not (pin
            --version). Neither path loads TensorFlow, so a query against a running server
            takes a fraction of a second. Errors raised by the model (an id out of range)
            print as their message alone; --verbose prints them as served.
        """,
        example="""
            static-keras query --grpc 127.0.0.1:8500 --model recs \\
                --input history=3,14,15,92,65,35,89,79,32,38,46,26,43,38,32,79,50,28,84,19
            static-keras query --rest 127.0.0.1:8501 --model recs \\
                --input history=3,14,15,92,65,35,89,79,32,38,46,26,43,38,32,79,50,28,84,19
        """,
        module=serving_commands,
        function="command_query",
        arguments=(
            Argument("--model", required=True, help="model name"),
            Argument("--grpc", help="gRPC address HOST:PORT, e.g. 127.0.0.1:8500"),
            Argument(
                "--rest", help="REST address: a base URL or HOST:PORT, e.g. 127.0.0.1:8501 (http)"
            ),
            Argument(
                "--input",
                action="append",
                required=True,
                metavar="NAME=ROWS",
                help="an input and its int32 rows, NAME=1,2,3;4,5,6 (rows split by ';'); "
                "repeatable",
            ),
            Argument("--version", type=int, help="model version (default: the newest)"),
            Argument("--label", help="version label (from a models.config)"),
            Argument("--timeout", type=float, default=10.0, help="seconds (default 10)"),
            Argument(
                "--wait",
                type=float,
                default=0.0,
                help="seconds to keep retrying while the server is not up yet (default 0)",
            ),
        ),
    ),
    # -- benchmarks -------------------------------------------------------------------
    Command(
        name="bench",
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
        module=bench_command,
        function="command_bench",
        arguments=(
            Argument(
                "args",
                nargs=argparse.REMAINDER,
                metavar="ARGS",
                help="arguments of benchmarks/run_all.py (see above), passed on as given",
            ),
        ),
    ),
)


def build_parser() -> argparse.ArgumentParser:
    """The parser of `static-keras`, made from `COMMANDS`."""
    parser = argparse.ArgumentParser(prog="static-keras", description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    parser.add_argument("--version", action="version", version=f"static-keras {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        subparser = subparsers.add_parser(
            command.name,
            help=command.help,
            description=textwrap.dedent(command.description).strip(),
            epilog="example:\n" + textwrap.indent(textwrap.dedent(command.example).strip(), "  "),
            # The paragraph and the example keep their line breaks as written.
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        for argument in [*_written_out(command.arguments), VERBOSE_AFTER_COMMAND]:
            subparser.add_argument(argument.name, **argument.keywords())
        subparser.set_defaults(run=getattr(command.module, command.function))
    return parser


def _written_out(arguments: Sequence[Argument | ArgumentsAtBuild]) -> list[Argument]:
    """`arguments`, with each function among them replaced by the arguments it returns."""
    written_out = []
    for entry in arguments:
        if isinstance(entry, Argument):
            written_out.append(entry)
        else:
            written_out.extend(entry())
    return written_out
