"""The examples run (short mode), so they cannot rot."""

import os
import subprocess
import sys

import pytest

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


# string_choice.py has its own smoke test (tests/test_strings_example.py, slow step).
# generative_retrieval.py trains a model (30 s on 2 cores): the slow step.
@pytest.mark.parametrize(
    "script",
    [pytest.param("generative_retrieval.py", marks=pytest.mark.slow), "freshness_hot_swap.py"],
)
def test_example_runs(script):
    result = subprocess.run(
        [sys.executable, os.path.join(EXAMPLES, script), "--quick"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
