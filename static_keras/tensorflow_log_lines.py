"""TensorFlow's harmless log lines, kept out of a user's terminal.

Importing TensorFlow writes lines at the file descriptor that tell a user
nothing (absl's banner, oneDNN and CPU-feature notices, the CUDA stub's "no
driver" note and, on a machine with no NVIDIA driver, an `E0000 ... failed
call to cuInit` that reads like an error). They come before TensorFlow reads
`TF_CPP_MIN_LOG_LEVEL`, so no setting hides them. Where static-keras is what
imports Keras or TensorFlow, the import runs with stderr captured and every
line but these is written back: real errors still show. A user's own
logging configuration is never changed; `notes_hidden` drops TensorFlow's
and absl's INFO records only while static-keras saves a SavedModel.
"""

from __future__ import annotations

import contextlib
import glob
import importlib
import logging
import os
import re
import sys
import tempfile

_HARMLESS = (
    "All log messages before absl::InitializeLog() is called are written to STDERR",
    "oneDNN custom operations are on",
    "Could not find cuda drivers on your machine",
    "This TensorFlow binary is optimized to use available CPU instructions",
    "To enable the following instructions:",
)


def harmless(line: str) -> bool:
    """True for a start-up line of TensorFlow's that is known to be harmless."""
    if re.match(r"I\d{4} ", line):  # absl C++ INFO ("I0000 00:00:...")
        return True
    if any(text in line for text in _HARMLESS):
        return True
    # The CUDA probe fails on every machine without an NVIDIA driver; where a
    # GPU device exists the same line is a real error and stays.
    return "failed call to cuInit" in line and not glob.glob("/dev/nvidia[0-9]*")


@contextlib.contextmanager
def startup_lines_filtered():
    """Captures stderr at the file descriptor; on exit writes back every
    captured line that `harmless` does not recognise."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no stderr to capture
        yield
        return
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            lines = captured.read().decode(errors="replace").splitlines(keepends=True)
            sys.stderr.write("".join(line for line in lines if not harmless(line)))
            sys.stderr.flush()


@contextlib.contextmanager
def quiet_tensorflow_start():
    """TensorFlow's harmless start-up lines filtered from what the block
    prints, when the block is what loads TensorFlow (Keras on its TensorFlow
    backend loads it too); nothing changes where it is loaded already.
    TensorFlow's devices are listed inside the capture, as the CUDA probe
    writes its line then."""
    if "tensorflow" in sys.modules:  # nothing left to filter
        yield
        return
    with startup_lines_filtered():
        yield
        if "tensorflow" in sys.modules:
            sys.modules["tensorflow"].config.list_physical_devices()


def import_quietly(name: str):
    """`importlib.import_module(name)` inside `quiet_tensorflow_start()`:
    for a module named in data (a package's lazy names)."""
    if name in sys.modules:
        return sys.modules[name]
    with quiet_tensorflow_start():
        return importlib.import_module(name)


class _BelowWarning(logging.Filter):
    def filter(self, record):
        return record.levelno >= logging.WARNING


@contextlib.contextmanager
def notes_hidden():
    """Drops the `tensorflow` and `absl` loggers' INFO records in this block
    (`tf.saved_model.save` logs "Assets written to: ..." and a note on input
    names): a filter on those two loggers, removed on exit, so a user's
    levels and handlers stay as they set them."""
    loggers = [logging.getLogger("tensorflow"), logging.getLogger("absl")]
    below_warning = _BelowWarning()
    for logger in loggers:
        logger.addFilter(below_warning)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(below_warning)
