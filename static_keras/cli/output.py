"""What a command prints: one line for a user's mistake, TensorFlow's
harmless start-up lines hidden, a served error without its graph wrapping."""

from __future__ import annotations

import os
import sys


class UserError(Exception):
    """A mistake in the command's input: reported in one line."""


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


def quiet_tensorflow(import_now: bool) -> None:
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


def served_error_message(text: str) -> str:
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
