"""The import graph of static_keras, read from the source, and its cycles.

    python tools/import_graph.py            # cycles (0 expected), then edges per package
    python tools/import_graph.py --edges    # every module -> module edge

Every import statement counts, at module level or inside a function (a
function-level import only delays a cycle), as does a literal module name
handed to `importlib.import_module` or `import_quietly`, and the modules a
package's `_LAZY` map names (imported on first use of a name); imports under
`if TYPE_CHECKING:` do not (they never run). `export/` and `serving/` are read
where they install: `static_keras.export` and `static_keras.serving`.
"""

from __future__ import annotations

import argparse
import ast
import collections
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
#: folder in the repository -> the package it installs as
PACKAGE_DIRS = {
    "static_keras": ROOT / "static_keras",
    "static_keras.export": ROOT / "export",
    "static_keras.serving": ROOT / "serving",
}
_NAMED_IMPORTERS = {"import_module", "import_quietly"}


def modules() -> dict[str, pathlib.Path]:
    """`{module name: source file}` of every module of the package."""
    found = {}
    for package, folder in PACKAGE_DIRS.items():
        for path in folder.rglob("*.py"):
            relative = path.relative_to(folder).with_suffix("").parts
            if relative[-1] == "__init__":
                relative = relative[:-1]
            name = ".".join((package, *relative))
            if package == "static_keras" and name.split(".")[1:2] in (["export"], ["serving"]):
                continue
            found[name] = path
    return found


def _type_checking_blocks(tree: ast.AST) -> set[int]:
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    return skipped


def imported_names(path: pathlib.Path, module: str, is_package: bool) -> set[str]:
    """Dotted names `path` imports (a `from a import b` gives `a.b` and `a`)."""
    tree = ast.parse(path.read_text(), str(path))
    skipped = _type_checking_blocks(tree)
    names = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = module.split(".")[: len(module.split(".")) - node.level + is_package]
                base = ".".join(parent + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Assign) and is_package and isinstance(node.value, ast.Dict):
            if any(getattr(target, "id", "") == "_LAZY" for target in node.targets):
                names.update(v.value for v in node.value.values if isinstance(v, ast.Constant))
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) in _NAMED_IMPORTERS
        ):
            if (
                node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                names.add(node.args[0].value)
    return names


def graph() -> dict[str, set[str]]:
    """`{module: modules it imports}` within static_keras."""
    found = modules()
    edges = {}
    for module, path in found.items():
        targets = set()
        for name in imported_names(path, module, path.name == "__init__.py"):
            # `from pkg import module` names the module; `from pkg import name` the package
            if name in found and name != module:
                targets.add(name)
        # an import of `a.b.c` also means `a.b.c`, not its parents: keep the deepest
        edges[module] = {t for t in targets if not any(o.startswith(t + ".") for o in targets)}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def package_of(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 else module


def package_edges(edges: dict[str, set[str]]) -> dict[tuple[str, str], int]:
    counts = collections.Counter()
    for source, targets in edges.items():
        for target in targets:
            if package_of(source) != package_of(target):
                counts[package_of(source), package_of(target)] += 1
    return dict(counts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edges", action="store_true", help="print every module edge")
    args = parser.parse_args()
    edges = graph()
    if args.edges:
        for source in sorted(edges):
            for target in sorted(edges[source]):
                print(f"{source} -> {target}")
        return
    found = cycles(edges)
    print(f"{len(edges)} modules, {sum(map(len, edges.values()))} edges, {len(found)} cycles")
    for component in found:
        print("cycle:", " <-> ".join(component))
    for (source, target), count in sorted(package_edges(edges).items()):
        print(f"{source} -> {target}: {count}")


if __name__ == "__main__":
    main()
