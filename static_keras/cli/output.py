"""What a command prints: one line for a user's mistake, TensorFlow's
harmless start-up lines hidden, a served error without its graph wrapping."""

from __future__ import annotations

import os

from static_keras.tensorflow_log_lines import import_quietly


class UserError(Exception):
    """A mistake in the command's input: reported in one line."""


def _no_retracing_warning(record) -> bool:
    """False for TensorFlow's "triggered tf.function retracing" warning: a hint to
    whoever writes the code (Keras traces a predict function per model, and the
    demo builds several), nothing a user of a command can act on."""
    return "triggered tf.function retracing" not in record.getMessage()


def quiet_tensorflow(import_now: bool) -> None:
    """Hides TensorFlow's start-up lines that are known to be harmless.

    `TF_CPP_MIN_LOG_LEVEL=1` (unless already set) hides its C++ INFO lines once
    its logging is up. Lines written while its libraries load come before
    that and ignore the level, so with `import_now` TensorFlow is imported
    here with them filtered (`tensorflow_log_lines.import_quietly`). Its
    Python warnings about tf.function retracing are dropped.
    """
    import logging

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    logger = logging.getLogger("tensorflow")
    if _no_retracing_warning not in logger.filters:
        logger.addFilter(_no_retracing_warning)
    if import_now:
        import_quietly("tensorflow")


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
