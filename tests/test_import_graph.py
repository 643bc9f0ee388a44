"""The import graph: no cycles, and serving/ never imports export/.

Read from the source by `tools/import_graph.py` (every import statement,
function-level ones included, and literal names given to `importlib`), so a
cycle cannot hide behind a late import.
"""

import importlib.util
import os

import pytest

_TOOL = os.path.join(os.path.dirname(__file__), os.pardir, "tools", "import_graph.py")


def _tool():
    spec = importlib.util.spec_from_file_location("import_graph", _TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_package_has_no_import_cycle():
    tool = _tool()
    edges = tool.graph()
    assert len(edges) > 100  # the whole package was read, export/ and serving/ included
    assert "static_keras.export.publish" in edges and "static_keras.serving.servable" in edges
    assert tool.cycles(edges) == []


def test_a_cycle_is_found_where_there_is_one():
    tool = _tool()
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert tool.cycles(edges) == [["a", "b", "c"]]


def test_serving_reads_what_export_writes_and_imports_none_of_it():
    """export/ checks a version through the server's load path; serving/
    loads versions without the code that writes them."""
    counts = _tool().package_edges(_tool().graph())
    assert counts.get(("static_keras.serving", "static_keras.export"), 0) == 0
    assert counts.get(("static_keras.export", "static_keras.serving"), 0) > 0


def test_function_level_and_importlib_imports_count(tmp_path, monkeypatch):
    tool = _tool()
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text('_LAZY = {"Name": "static_keras.pkg.lazy"}\n')
    (package / "late.py").write_text("def f():\n    from static_keras.pkg import lazy\n")
    (package / "named.py").write_text(
        'import importlib\nimportlib.import_module("static_keras.pkg.late")\n'
    )
    (package / "lazy.py").write_text("")
    monkeypatch.setattr(tool, "PACKAGE_DIRS", {"static_keras.pkg": package})
    edges = tool.graph()
    assert edges["static_keras.pkg.late"] == {"static_keras.pkg.lazy"}
    assert edges["static_keras.pkg.named"] == {"static_keras.pkg.late"}
    assert edges["static_keras.pkg"] == {"static_keras.pkg.lazy"}


def test_the_core_never_imports_export_serving_or_the_cli():
    """DESIGN.md's dependency direction: index building, kernels, the layer
    and its parts, the searches and the string kind sit below export,
    serving and the CLI."""
    core = ("index", "kernels", "constraint", "layers", "decoding", "strings", "keras_hub")
    above = {"static_keras.export", "static_keras.serving", "static_keras.cli"}
    counts = _tool().package_edges(_tool().graph())
    wrong = {
        (source, target): count
        for (source, target), count in counts.items()
        if source in {f"static_keras.{name}" for name in core} and target in above
    }
    assert wrong == {}


def test_every_package_folder_installs():
    """A wheel holds only the packages pyproject.toml lists: a new folder
    (kernels/backends/ was one) must be listed, or installs without it."""
    tomllib = pytest.importorskip("tomllib")
    tool = _tool()
    with open(os.path.join(os.path.dirname(_TOOL), os.pardir, "pyproject.toml"), "rb") as file:
        listed = set(tomllib.load(file)["tool"]["setuptools"]["packages"])
    folders = {
        name for name, path in tool.modules().items() if os.path.basename(path) == "__init__.py"
    }
    assert folders == listed
