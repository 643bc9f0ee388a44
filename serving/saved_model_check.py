"""`check_saved_model`: a lint for what makes TF Serving fail on a SavedModel."""

from __future__ import annotations

import dataclasses
import hashlib
import os

import numpy as np

#: Constants bigger than this belong in variables: a GraphDef is a protobuf,
#: capped at 2 GB, and a constant is held twice while loading.
DEFAULT_MAX_CONSTANT_BYTES = 16 * 2**20
#: Two variables with identical contents at least this large are reported as
#: stored twice (small ones, like zero biases, legitimately coincide).
DEFAULT_DUPLICATE_MIN_BYTES = 2**20


class SavedModelCheckError(ValueError):
    """A SavedModel that TF Serving would refuse, or serve badly."""


@dataclasses.dataclass(frozen=True)
class CheckReport:
    signatures: tuple[str, ...]
    num_variables: int
    variable_bytes: int
    xla_functions: tuple[str, ...]
    largest_constant_bytes: int


def _graph_functions(meta_graph):
    return list(meta_graph.graph_def.library.function)


def _xla_functions(meta_graph) -> list[str]:
    """Functions that only run under XLA (jit_compile=True or Xla* ops)."""
    found = []
    for function in _graph_functions(meta_graph):
        must_compile = function.attr.get("_XlaMustCompile")
        if must_compile is not None and must_compile.b:
            found.append(function.signature.name)
            continue
        for node in function.node_def:
            attr = node.attr.get("_XlaMustCompile")
            if (attr is not None and attr.b) or node.op.startswith("Xla"):
                found.append(f"{function.signature.name}/{node.name}")
                break
    for node in meta_graph.graph_def.node:
        attr = node.attr.get("_XlaMustCompile")
        if (attr is not None and attr.b) or node.op.startswith("Xla"):
            found.append(node.name)
    return found


def _constant_sizes(meta_graph):
    nodes = list(meta_graph.graph_def.node)
    for function in _graph_functions(meta_graph):
        nodes.extend(function.node_def)
    for node in nodes:
        if node.op == "Const" and "value" in node.attr:
            tensor = node.attr["value"].tensor
            yield node.name, len(tensor.tensor_content) + len(tensor.string_val)


def _serving_meta_graph(path: str):
    from tensorflow.core.protobuf import saved_model_pb2

    proto_path = os.path.join(path, "saved_model.pb")
    if not os.path.isfile(proto_path):
        raise SavedModelCheckError(f"{path!r} is not a SavedModel (no saved_model.pb)")
    saved_model = saved_model_pb2.SavedModel()
    with open(proto_path, "rb") as file:
        saved_model.ParseFromString(file.read())
    serve = [m for m in saved_model.meta_graphs if "serve" in m.meta_info_def.tags]
    if not serve:
        raise SavedModelCheckError(f"{path!r} has no MetaGraph tagged 'serve'")
    return serve[0]


def _needs_xla(xla: list[str]) -> str:
    return (
        f"{len(xla)} function(s) need XLA ({', '.join(xla[:3])}), but XLA is disabled: "
        "a stock TF Serving fails every request with 'XLA compilation disabled'. "
        "Export with xla=False, or start the server with "
        "--xla_cpu_compilation_enabled=true (CPU) / --xla_gpu_compilation_enabled=true (GPU)"
    )


def check_runs_without_xla(path: str | os.PathLike) -> None:
    """Raises `SavedModelCheckError` when a function of the SavedModel at
    `path` only runs under XLA: what a server started without XLA refuses.
    Reads the graph only (milliseconds), not the variables."""
    path = os.fspath(path)
    xla = _xla_functions(_serving_meta_graph(path))
    if xla:
        raise SavedModelCheckError(f"{path!r} failed its serving checks:\n- {_needs_xla(xla)}")


def check_saved_model(
    path: str | os.PathLike,
    *,
    xla_enabled: bool = False,
    max_constant_bytes: int = DEFAULT_MAX_CONSTANT_BYTES,
    duplicate_min_bytes: int = DEFAULT_DUPLICATE_MIN_BYTES,
) -> CheckReport:
    """Fails with a clear message where TF Serving would fail or waste memory.

    Checks: a `serving_default` signature exists; no function needs XLA
    unless `xla_enabled` (a stock server has XLA off and fails every request
    to such a function with "XLA compilation disabled"); no constant exceeds
    `max_constant_bytes` (index tensors belong in variables); no large
    variable is stored twice (keras-team/keras#23553).

    Args:
        path: SavedModel directory (a version directory).
        xla_enabled: whether the server runs with
            `--xla_cpu_compilation_enabled` / `--xla_gpu_compilation_enabled`.
        max_constant_bytes: largest constant allowed. Defaults to 16 MiB.
        duplicate_min_bytes: variables at least this large with identical
            contents count as duplicates. Defaults to 1 MiB.

    Returns:
        `CheckReport` when every check passes.

    Raises:
        SavedModelCheckError: naming every problem found.
    """
    import tensorflow as tf

    path = os.fspath(path)
    meta_graph = _serving_meta_graph(path)
    problems = []
    signatures = tuple(k for k in meta_graph.signature_def if not k.startswith("__"))
    if "serving_default" not in signatures:
        problems.append(f"no 'serving_default' signature (found: {list(signatures)})")

    xla = _xla_functions(meta_graph)
    if xla and not xla_enabled:
        problems.append(_needs_xla(xla))

    largest = 0
    for name, size in _constant_sizes(meta_graph):
        largest = max(largest, size)
        if size > max_constant_bytes:
            problems.append(
                f"constant {name!r} holds {size:,} bytes (limit {max_constant_bytes:,}): "
                "store large tensors as variables (GraphDef protobufs are capped at 2 GB)"
            )

    num_variables, variable_bytes = 0, 0
    prefix = os.path.join(path, "variables", "variables")
    if os.path.exists(prefix + ".index"):
        reader = tf.train.load_checkpoint(prefix)
        digests: dict[tuple, str] = {}
        for key in sorted(reader.get_variable_to_shape_map()):
            if not key.endswith(".ATTRIBUTES/VARIABLE_VALUE"):
                continue
            value = np.asarray(reader.get_tensor(key))
            num_variables += 1
            variable_bytes += value.nbytes
            if value.nbytes < duplicate_min_bytes:
                continue
            digest = (value.dtype.str, value.shape, hashlib.sha256(value.tobytes()).hexdigest())
            if digest in digests:
                problems.append(
                    f"variables {digests[digest]!r} and {key!r} hold the same "
                    f"{value.nbytes:,} bytes: a variable is stored twice"
                )
            else:
                digests[digest] = key

    if problems:
        raise SavedModelCheckError(
            f"{path!r} failed its serving checks:\n- " + "\n- ".join(problems)
        )
    return CheckReport(
        signatures=signatures,
        num_variables=num_variables,
        variable_bytes=variable_bytes,
        xla_functions=tuple(xla),
        largest_constant_bytes=largest,
    )
