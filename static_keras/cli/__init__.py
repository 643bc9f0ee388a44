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

import contextlib
import os
import sys

from static_keras import progress
from static_keras.cli.bench_command import split_bench_arguments
from static_keras.cli.index_commands import check_is_archive
from static_keras.cli.model_commands import check_is_model
from static_keras.cli.output import UserError
from static_keras.cli.output import quiet_tensorflow
from static_keras.cli.output import served_error_message
from static_keras.cli.parser import build_parser
from static_keras.tensorflow_allocator import return_freed_memory

__all__ = ["UserError", "build_parser", "main"]

# Commands that load TensorFlow: it is imported before they run, with its
# start-up lines filtered (`quiet_tensorflow`).
# (refresh-eligibility is not one: a rules job runs NumPy only, and loads
# TensorFlow only where a version on disk has never been checked.)
_TENSORFLOW_COMMANDS = ("demo", "export", "publish", "serve-dev", "bench")
# Commands that print their stages (`static_keras.progress`) with --progress
# or on a terminal.
_STAGED_COMMANDS = ("export", "publish", "refresh-eligibility", "update-catalogue")


def main(argv=None) -> int:
    argv, passed_on = split_bench_arguments(sys.argv[1:] if argv is None else list(argv))
    args = build_parser().parse_args(argv)
    if passed_on is not None:
        args.args = passed_on
    # Before TensorFlow's first op: an unloaded version's memory goes back.
    return_freed_memory()
    try:
        _check_input_files(args)
        if not args.verbose:
            quiet_tensorflow(import_now=args.command in _TENSORFLOW_COMMANDS)
        staged = args.command in _STAGED_COMMANDS and (args.progress or sys.stderr.isatty())
        with progress.printed() if staged else contextlib.nullcontext():
            args.run(args)
    except Exception as error:
        from static_keras.serving.client import ServingError

        if not isinstance(error, (UserError, ValueError, FileNotFoundError, ServingError)):
            raise
        message = str(error)
        if isinstance(error, ServingError) and not args.verbose:
            message = served_error_message(message)
        print(f"static-keras: error: {message}", file=sys.stderr)
        return 2
    return 0


def _check_input_files(args) -> None:
    """A missing model or index file fails before TensorFlow loads (seconds)."""
    if args.command not in ("export", "publish"):
        return
    if not os.path.isfile(args.model):
        raise UserError(f"no such model file: {args.model}")
    check_is_model(args.model, args.command)
    if args.index:
        if not os.path.isfile(args.index):
            raise UserError(f"no such index file: {args.index}")
        check_is_archive(args.index)


if __name__ == "__main__":
    sys.exit(main())
