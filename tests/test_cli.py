"""The `static-keras` command line: happy paths and one-line user errors."""

import json
import os
import re
import subprocess
import sys
import zipfile

import numpy as np
import pytest
from conftest import make_index

from static_keras import StaticIndex
from static_keras.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_build_index_and_inspect(capsys, tmp_path):
    rows = np.random.default_rng(0).integers(0, 64, size=(500, 3))
    np.save(tmp_path / "ids.npy", rows)
    np.savetxt(tmp_path / "items.csv", np.arange(500)[:, None], fmt="%d", delimiter=",")
    code, out, _ = run(
        capsys, "build-index", str(tmp_path / "ids.npy"), "--vocab-size", "64",
        "--out", str(tmp_path / "index.npz"), "--item-ids", str(tmp_path / "items.csv"),
        "--on-duplicate-item", "first",
    )  # fmt: skip
    assert code == 0 and "step_widths" in out
    index = StaticIndex.load(tmp_path / "index.npz")
    assert index.contains(rows).all() and index.has_item_ids
    code, out, _ = run(capsys, "inspect", str(tmp_path / "index.npz"))
    assert code == 0
    assert re.search(rf"sequences\s+{index.num_sequences:,}", out)
    assert index.checksum in out


def test_build_index_from_parquet_with_progress(capsys, tmp_path):
    parquet = pytest.importorskip("pyarrow.parquet", reason="parquet input needs pyarrow")
    import pyarrow

    rows = np.random.default_rng(1).integers(0, 32, size=(300, 3))
    columns = {f"level_{i}": rows[:, i] for i in range(3)}
    columns["item_id"] = np.arange(300) + 5
    parquet.write_table(pyarrow.table(columns), tmp_path / "ids.parquet")
    code, _, err = run(
        capsys, "build-index", str(tmp_path / "ids.parquet"), "--vocab-size", "32",
        "--out", str(tmp_path / "index.npz"), "--item-ids", str(tmp_path / "ids.parquet"),
        "--on-duplicate-item", "first", "--progress",
    )  # fmt: skip
    assert code == 0 and "100%" in err
    index = StaticIndex.load(tmp_path / "index.npz")
    assert index.contains(rows).all()
    first = {tuple(r): i + 5 for i, r in reversed(list(enumerate(rows.tolist())))}
    np.testing.assert_array_equal(
        index.lookup_item_ids(rows[:20]), [first[tuple(r)] for r in rows[:20].tolist()]
    )


def test_every_subcommand_has_help(capsys):
    for command in ("demo", "build-index", "inspect", "export", "publish",
                    "refresh-eligibility", "serve-dev", "query", "bench"):  # fmt: skip
        with pytest.raises(SystemExit) as exit_info:
            main([command, "--help"])
        assert exit_info.value.code == 0
        out = capsys.readouterr().out
        assert "usage: static-keras " + command in out
        assert "example:\n  static-keras " + command in out


def test_no_description_or_flag_help_is_empty():
    """Every subcommand explains itself with a paragraph and an example, every flag in a line."""
    import argparse

    from static_keras.cli import build_parser

    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    helps = {choice.dest: choice.help for choice in commands._choices_actions}
    assert set(helps) == set(commands.choices)
    for name, command in [("static-keras", parser), *commands.choices.items()]:
        if command is not parser:
            assert helps[name] and len(command.description) > 150, name
            assert command.epilog.startswith("example:\n  static-keras " + name), name
        for action in command._actions:
            if not isinstance(action, argparse._SubParsersAction):
                assert action.help and action.help.strip(), (name, action.option_strings)


def test_bench_passes_its_arguments_on(capsys, monkeypatch):
    import static_keras.cli

    seen = []
    monkeypatch.setattr(
        static_keras.cli.bench_command, "command_bench", lambda args: seen.append(args.args)
    )
    for argv, passed in (
        (["bench", "--quick"], ["--quick"]),
        (["bench", "--only", "build", "n", "--sizes", "1e5"], ["--only", "build", "n",
                                                                 "--sizes", "1e5"]),
        (["--verbose", "bench", "--", "--help"], ["--help"]),
        (["bench"], []),
    ):  # fmt: skip
        assert main(argv) == 0
        assert seen.pop() == passed


def test_rest_address_without_a_scheme_is_http(capsys):
    from static_keras.cli.serving_commands import _rest_url

    assert _rest_url("127.0.0.1:8501") == "http://127.0.0.1:8501"
    assert _rest_url("https://serving.example:443/") == "https://serving.example:443/"
    # A closed port: a connection error, not "unknown url type: 127.0.0.1".
    code, _, err = run(capsys, "query", "--rest", "127.0.0.1:1", "--model", "m",
                       "--input", "x=1,2")  # fmt: skip
    assert code == 2 and "http://127.0.0.1:1/v1/models/m:predict failed" in err, err
    assert "unknown url type" not in err


# The answers of serve-dev (and tensorflow_model_server) to an id out of range.
_GRPC_ERROR = (
    "gRPC Predict to 127.0.0.1:18500 for model 'recs' failed: INVALID_ARGUMENT: Graph execution "
    "error:\n\nDetected at node Assert/Assert defined at (most recent call last):\n<stack traces "
    "unavailable>\nassertion failed: [Input \\'history\\' holds ids outside [0, 50) (the rows "
    "of its embedding); smallest and largest:] [1] [500]\n\t [[{{node Assert/Assert}}]] "
    "[Op:__inference_signature_wrapper_4186]"
)
_MODEL_SERVER_ERROR = (
    "REST predict to http://h:8501/v1/models/recs:predict failed: HTTP 400: assertion failed: "
    "[Input \\'history\\' holds ids outside [0, 50) (the rows of its embedding); smallest and "
    "largest:] [-1] [4]\n\t [[{{function_node __inference_serve_12}}{{node Assert/Assert}}]]"
)
_GATHER_ERROR = (
    "gRPC Predict to h:1 for model 'recs' failed: INVALID_ARGUMENT: Graph execution error:\n\n"
    "Detected at node GatherV2 defined at (most recent call last):\n<stack traces unavailable>\n"
    "indices[0,4] = 500 is not in [0, 50)\n\t [[{{node GatherV2}}]] [Op:__inference_fn_7]"
)


@pytest.mark.parametrize(
    "served,printed",
    [
        (_GRPC_ERROR, "gRPC Predict to 127.0.0.1:18500 for model 'recs' failed: INVALID_ARGUMENT: "
         "Input 'history' holds ids outside [0, 50) (the rows of its embedding); smallest and "
         "largest: 1, 500"),
        (_MODEL_SERVER_ERROR, "REST predict to http://h:8501/v1/models/recs:predict failed: "
         "HTTP 400: Input 'history' holds ids outside [0, 50) (the rows of its embedding); "
         "smallest and largest: -1, 4"),
        (_GATHER_ERROR, "gRPC Predict to h:1 for model 'recs' failed: INVALID_ARGUMENT: "
         "indices[0,4] = 500 is not in [0, 50)"),
        ("gRPC Predict to h:1 failed: NOT_FOUND: Servable not found for request: Specific(r, 7)",
         "gRPC Predict to h:1 failed: NOT_FOUND: Servable not found for request: Specific(r, 7)"),
    ],
)  # fmt: skip
def test_served_errors_print_their_message_alone(served, printed, capsys, monkeypatch):
    import static_keras.cli
    from static_keras.serving import ServingError

    def fail(args):
        raise ServingError(served, code="INVALID_ARGUMENT")

    monkeypatch.setattr(static_keras.cli.serving_commands, "command_query", fail)
    argv = ["query", "--model", "recs", "--grpc", "h:1", "--input", "history=1,500"]
    code, _, err = run(capsys, *argv)
    assert code == 2 and err == f"static-keras: error: {printed}\n"
    code, _, err = run(capsys, *argv, "--verbose")
    assert code == 2 and err == f"static-keras: error: {served}\n"


@pytest.mark.parametrize(
    "argv,message",
    [
        (["inspect", "missing.npz"], "No index file"),
        (["build-index", "missing.npy", "--vocab-size", "4", "--out", "x.npz"], "no such file"),
        (["build-index", "ids.npy", "--vocab-size", "8", "--out", "x.npz"], "out of range"),
        (["build-index", "ids.txt", "--vocab-size", "8", "--out", "x.npz"], "unsupported input"),
        (
            ["build-index", "big.npy", "--vocab-size", "8", "--out", "x.npz"],
            "holds token 9 (row 0, position 0), out of range for vocab_size=8; its largest "
            "token is 12, so vocab_size must be at least 13",
        ),
        (
            ["publish", "catalogue.npz", "--model-base-path", "m"],
            "catalogue.npz is an index or array archive, not a model: the model (.keras) comes "
            "first and the index after --index, e.g. static-keras publish model.keras --index "
            "catalogue.npz --model-base-path models/recs",
        ),
        (["export", "ids.npy", "--out", "m"], "ids.npy: not a .keras model"),
        (
            ["inspect", "ids.npy"],
            "ids.npy: not a static-keras index: it holds one int array "
            "[N, L] (shape (2, 2)); build an index from it with `static-keras build-index`",
        ),
        (
            ["inspect", "items.npy"],
            "not a static-keras index: it holds one int array [N] (shape (2,)) (item ids?)",
        ),
        (["inspect", "ids.txt"], "not a static-keras index: it is a text file (CSV?); build"),
        (["inspect", "model.keras"], "not a static-keras index: it is a Keras model (.keras)"),
        (["inspect", "empty.npz"], "not a static-keras index: the file is empty"),
        (["export", "missing.keras", "--out", "m"], "no such model file"),
        (
            ["export", "model.keras", "--index", "in_stock.npz", "--out", "m"],
            "no such index file: in_stock.npz",
        ),
        (
            ["publish", "model.keras", "--index", "ids.npy", "--model-base-path", "m"],
            "not a static-keras index: it holds one int array [N, L]",
        ),
        (["serve-dev", "--port", "0"], "--model_base_path"),
        (["query", "--model", "m", "--input", "x=1,2"], "exactly one of --grpc"),
        (["query", "--model", "m", "--grpc", "h:1", "--input", "x"], "--input must look like"),
    ],
)
def test_user_errors_are_one_line(capsys, tmp_path, argv, message, monkeypatch):
    monkeypatch.chdir(tmp_path)
    np.save(tmp_path / "ids.npy", np.array([[1, 9], [2, 3]]))
    np.save(tmp_path / "items.npy", np.array([7, 8]))
    np.save(tmp_path / "big.npy", np.array([[9, 1], [2, 12]]))
    np.savez(tmp_path / "catalogue.npz", tokens=np.zeros(3))
    (tmp_path / "ids.txt").write_text("1,2\n")
    (tmp_path / "empty.npz").write_bytes(b"")
    with zipfile.ZipFile(tmp_path / "model.keras", "w") as model:  # a .keras file's members
        for name in ("config.json", "metadata.json", "model.weights.h5"):
            model.writestr(name, "{}")
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert err.count("\n") == 1 and message in err, err


def test_version(capsys):
    from static_keras import __version__

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"static-keras {__version__}\n"


@pytest.mark.slow  # an export, a publish, a server and a query: 35 s on 2 cores
def test_export_publish_serve_and_query(capsys, tmp_path):
    index = make_index(1)
    from conftest import histories
    from conftest import make_model

    model = make_model(index)
    model.save(tmp_path / "model.keras")
    fresh = make_index(2, n=120)
    fresh.save(tmp_path / "fresh.npz")
    code, out, _ = run(capsys, "export", str(tmp_path / "model.keras"), "--out",
                       str(tmp_path / "exported"))  # fmt: skip
    assert code == 0 and "['item_ids', 'scores', 'tokens']" in out
    base = str(tmp_path / "recs")
    assert run(capsys, "publish", str(tmp_path / "model.keras"), "--model-base-path", base)[0] == 0
    code, out, _ = run(capsys, "publish", str(tmp_path / "model.keras"), "--model-base-path",
                       base, "--index", str(tmp_path / "fresh.npz"))  # fmt: skip
    assert code == 0 and "published version 2" in out

    log = open(tmp_path / "serve.log", "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "static_keras.cli", "serve-dev", "--port", "0",
         "--rest_api_port", "0", "--model_name", "recs", "--model_base_path", base,
         "--run-seconds", "120"],
        stdout=subprocess.PIPE, stderr=log, text=True,
    )  # fmt: skip
    try:
        line = server.stdout.readline()
        grpc_address = re.search(r"gRPC (\S+),", line).group(1)
        rest_url = re.search(r"REST (\S+)", line).group(1)
        row = ",".join(map(str, histories(1)[0]))
        for flag, address in (("--grpc", grpc_address), ("--rest", rest_url)):
            code, out, err = run(capsys, "query", "--model", "recs", flag, address,
                                 "--input", f"history={row}")  # fmt: skip
            assert code == 0, err
            tokens = np.array(json.loads(re.search(r"tokens: (.*)", out).group(1)))
            assert fresh.contains(tokens.reshape(-1, 4)).all()
            assert "model_version: 2" in out
        code, _, err = run(capsys, "query", "--model", "recs", "--grpc", grpc_address,
                           "--input", f"history={row}", "--version", "1")  # fmt: skip
        assert code == 2 and "NOT_FOUND" in err
    finally:
        server.terminate()
        server.wait(timeout=60)
        server.stdout.close()
        log.close()
    assert "model recs version 2 loaded and warmed up" in (tmp_path / "serve.log").read_text()
    assert sorted(os.listdir(base)) == [
        ".static_keras.lock",
        ".static_keras_versions.json",
        "1",
        "2",
    ]


def test_bench_runs_only_from_a_source_checkout(tmp_path):
    """An installed package must not run whatever sits at site-packages/benchmarks."""
    site = tmp_path / "site-packages"
    (site / "benchmarks").mkdir(parents=True)
    marker = tmp_path / "ran"
    (site / "benchmarks" / "run_all.py").write_text(
        f"def main(args):\n    open({str(marker)!r}, 'w').close()\n"
    )
    import static_keras

    package = os.path.dirname(os.path.abspath(static_keras.__file__))
    os.symlink(package, site / "static_keras")
    code = (
        f"import sys; sys.path.insert(0, {str(site)!r}); from static_keras.cli import main; "
        "sys.exit(main(['bench']))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 2, result.stderr
    assert "runs from a source checkout only" in result.stderr
    assert not marker.exists()


def test_inspect_a_string_index(capsys, tmp_path):
    from static_keras.strings import StringIndex
    from static_keras.strings import TokenVocabulary

    vocab = TokenVocabulary.from_token_bytes([b"a", b"b", b"ab", b"<e>"], special=[3])
    index = StringIndex.from_strings(["ab", "ba", "b"], vocab, eos_token_id=3)
    index.save(tmp_path / "tools.npz")
    code, out, _ = run(capsys, "inspect", str(tmp_path / "tools.npz"))
    assert code == 0, out
    assert re.search(r"kind\s+strings", out) and re.search(r"members\s+3", out)
    assert re.search(r"eos_token_id\s+3", out) and index.checksum in out


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_query_errors_say_what_listens_there(capsys):
    """REST pointed at nothing, or at a gRPC port: one line that says so."""
    from concurrent import futures

    import grpc

    port = _free_port()
    query = ["query", "--model", "recs", "--input", "history=1,2,3"]
    code, _, err = run(capsys, *query, "--rest", f"127.0.0.1:{port}")
    assert code == 2 and err.count("\n") == 1, err
    assert f"nothing listens at 127.0.0.1:{port} (connection refused)" in err
    assert "serve-dev" in err and "--wait" in err

    holder = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    grpc_port = holder.add_insecure_port("127.0.0.1:0")
    holder.start()
    try:
        code, _, err = run(capsys, *query, "--rest", f"127.0.0.1:{grpc_port}", "--wait", "5")
    finally:
        holder.stop(None)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert f"127.0.0.1:{grpc_port} does not answer HTTP" in err and "is it a gRPC port?" in err


def test_serve_dev_says_when_the_base_path_is_missing(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "static_keras.cli", "serve-dev", "--model_name", "recs",
         "--model_base_path", str(tmp_path / "nope" / "recs"), "--port", "0",
         "--rest_api_port", "0", "--run-seconds", "1"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    warning = [line for line in done.stderr.splitlines() if "warning" in line]
    assert warning == [
        f"static-keras: warning: model 'recs': {tmp_path / 'nope' / 'recs'} does not exist "
        "(a typo?); it serves nothing until a version is published there"
    ]
