"""Every runnable example in a library docstring runs and prints what it claims.

The one doctest runner of the suite: modules are found by their `>>>` lines,
so a new example is tested without being listed. A module whose optional
dependency (Apache Beam, keras-hub, ...) is not installed is skipped with
its name.
"""

import doctest
import importlib
import os
import pathlib
import re

import pytest

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Source folder -> import path (export/ and serving/ install as static_keras.*).
_PACKAGES = {
    "static_keras": "static_keras",
    "export": "static_keras.export",
    "serving": "static_keras.serving",
}

_EXAMPLE = re.compile(r"^\s*>>> ", re.MULTILINE)


def _modules_with_examples():
    found = []
    for folder, package in _PACKAGES.items():
        for root, _, files in os.walk(os.path.join(_REPO, folder)):
            for name in sorted(files):
                path = os.path.join(root, name)
                if not name.endswith(".py") or not _EXAMPLE.search(pathlib.Path(path).read_text()):
                    continue
                parts = os.path.relpath(path, os.path.join(_REPO, folder))[:-3].split(os.sep)
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                found.append(".".join([package, *parts]))
    return sorted(found)


MODULES = _modules_with_examples()


def test_examples_are_found():
    assert "static_keras.layers.constrained_decoding" in MODULES
    assert "static_keras.serving.registry" in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name.split(".")[0] in ("static_keras", "keras", "numpy"):
            raise
        pytest.skip(f"{name} needs {error.name}, which is not installed")
    flags = doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS
    result = doctest.testmod(module, optionflags=flags)
    assert result.attempted > 0, "no example found"
    assert result.failed == 0
