"""The examples run (short mode), so they cannot rot."""

import os
import subprocess
import sys

import pytest

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


# string_choice.py has its own smoke test (tests/test_strings_example.py, slow step).
# generative_retrieval.py trains a model (30 s on 2 cores) and freshness_hot_swap.py
# publishes and serves (34 s): the slow step (tests/test_dev_server.py covers hot swaps).
@pytest.mark.parametrize(
    "script",
    [
        pytest.param("generative_retrieval.py", marks=pytest.mark.slow),
        pytest.param("freshness_hot_swap.py", marks=pytest.mark.slow),
    ],
)
def test_example_runs(script):
    result = subprocess.run(
        [sys.executable, os.path.join(EXAMPLES, script), "--quick"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
