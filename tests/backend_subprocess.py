"""Runs a test script under another Keras backend, in a subprocess: the
backend is fixed when Keras is first imported, and this process runs the
test backend."""

import os
import subprocess
import sys

TESTS = os.path.dirname(os.path.abspath(__file__))


def run_under(backend: str, script: str, expect: str, timeout: int = 300) -> None:
    """Runs `script` (`python -c`, with this folder as `sys.argv[1]`) under
    `backend`; asserts it exits 0 and prints `expect`."""
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run(
        [sys.executable, "-c", script, TESTS], capture_output=True, text=True, env=env,
        timeout=timeout,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert expect in done.stdout
