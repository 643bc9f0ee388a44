"""examples/string_choice.py runs end to end (CI smoke run, so it cannot rot)."""

import os
import subprocess
import sys

import pytest

_EXAMPLE = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "string_choice.py"
)


@pytest.mark.slow  # about a minute: keras-hub import, three traced models, an export
def test_string_choice_example_runs(tmp_path):
    pytest.importorskip("tokenizers", reason="the example trains its vocabulary with `tokenizers`")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run(
        [sys.executable, _EXAMPLE, "--export", str(tmp_path / "export")],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    for step in (
        "1. compiled",
        "2. any decode loop",
        "3. beam search",
        "4. keras-hub",
        "5. SavedModel",
    ):
        assert step in result.stdout
    assert "served answers" in result.stdout
