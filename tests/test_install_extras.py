"""What the optional extras install (docs/strings.md's CPU recipe).

PyPI's Linux `torch` is the CUDA build: `pip install "static-keras[transformers]"`
on a CPU-only machine would pull about 5 GB of `nvidia-*` wheels and `triton`.
The documented recipe installs PyTorch's CPU build first, and relies on the
extra keeping a `torch` that is already installed. That is checked here with
pip's own resolver (`--dry-run`: nothing is installed) over the extra's
requirements as pyproject.toml declares them.
"""

import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _extra(name: str) -> list[str]:
    import tomllib

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as file:
        return tomllib.load(file)["project"]["optional-dependencies"][name]


def test_the_cpu_recipe_is_in_the_docs_and_the_extra_names_torch_loosely():
    with open(os.path.join(ROOT, "docs", "strings.md"), encoding="utf-8") as file:
        page = file.read()
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu\n" in page
    assert 'pip install "static-keras[transformers]"\n' in page
    (torch,) = [r for r in _extra("transformers") if re.match(r"torch\b", r)]
    assert not re.search(r"==|<|~=", torch), f"{torch}: an installed CPU build must satisfy it"


@pytest.mark.slow  # resolves against PyPI (network); installs nothing
def test_the_transformers_extra_keeps_an_installed_torch(tmp_path):
    pytest.importorskip("torch", reason="the recipe's first step (a torch) is not installed here")
    report = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report",
         str(report), *_extra("transformers")],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if done.returncode != 0 and "NewConnectionError" in done.stderr + done.stdout:
        pytest.skip("PyPI is not reachable from here")
    assert done.returncode == 0, done.stderr
    installs = {
        item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]
    }
    assert "torch" not in installs
    assert not {name for name in installs if name.startswith("nvidia-") or name == "triton"}
