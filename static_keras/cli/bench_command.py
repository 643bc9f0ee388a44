"""`bench`: the benchmark suite of a source checkout, its arguments passed on."""

from __future__ import annotations

import os

from static_keras.cli.output import UserError


def _source_checkout() -> str | None:
    """The repository root when static_keras runs from a source checkout, else None.

    An installed package's parent is site-packages, where a folder named
    `benchmarks` may belong to anything: only a root whose pyproject.toml
    names this project counts.
    """
    here = os.path.abspath(__file__)  # static_keras/cli/bench_command.py
    root = os.path.dirname(os.path.dirname(os.path.dirname(here)))
    try:
        with open(os.path.join(root, "pyproject.toml")) as file:
            project = file.read()
    except OSError:
        return None
    return root if 'name = "static-keras"' in project else None


def command_bench(args) -> None:
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


def split_bench_arguments(argv: list[str]) -> tuple[list[str], list[str] | None]:
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
