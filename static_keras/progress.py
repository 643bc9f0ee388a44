"""Stage lines of the long jobs (build, export, publish, refresh, catalogue delta).

At 10^8 items a publish or a refresh takes minutes; a person at a terminal
wants to see which stage it is in. The jobs log each stage's start and end
at INFO on the `static_keras.progress` logger, and nothing else is printed:
a script that configures no logging sees none of it (Python shows WARNING
and above by default), a script that logs at INFO sees the stages, and the
command line shows them on stderr when stderr is a terminal or with
`--progress` (`printed`).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time

logger = logging.getLogger("static_keras.progress")


@contextlib.contextmanager
def stage(what: str):
    """Logs `what` when the block starts and, with its seconds, when it ends."""
    logger.info("%s ...", what)
    start = time.perf_counter()
    yield
    logger.info("%s: done in %.1f s", what, time.perf_counter() - start)


@contextlib.contextmanager
def printed(stream=None):
    """Within the block, the stage lines are printed on `stream` (default
    stderr), each with the seconds since the block began."""
    start = time.perf_counter()

    class _Elapsed(logging.Formatter):
        def format(self, record):
            return f"[{time.perf_counter() - start:7.1f} s] {record.getMessage()}"

    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(_Elapsed())
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    # Printed here only: a handler on the root logger (TensorFlow's save
    # installs absl's) would print every line a second time.
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate
