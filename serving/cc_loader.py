"""TF Serving's own load path, reproduced with the C++ library in the TF wheel.

`tensorflow_model_server` cannot be installed from PyPI or Debian, but it
loads a version with `tensorflow::LoadSavedModel` (tag `serve`) with XLA
compilation disabled unless a flag enables it. The pip `tensorflow` wheel
ships `libtensorflow_cc.so.2` and its headers, so `cc/savedmodel_runner.cc`
compiled against them runs exactly that path: load, run `serving_default`,
print the outputs as JSON lines. Use it as a pre-flight check of a version
before it reaches a server, and in tests.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile

import numpy as np

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cc", "savedmodel_runner.cc")
_DTYPES = {np.dtype(np.int32): "int32", np.dtype(np.int64): "int64",
           np.dtype(np.float32): "float32", np.dtype(np.float64): "float64",
           np.dtype(bool): "bool"}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class CcRunResult:
    outputs: dict[str, np.ndarray]
    load_ms: float
    run_ms: float
    #: Times of the `repeat` runs after the first (ms), when asked for.
    repeat_ms: tuple[float, ...] = ()


class CcLoaderError(RuntimeError):
    """The C++ loader failed to build, load the SavedModel, or run it.

    `code` is the status code name `Session::Run` returned (for example
    "INVALID_ARGUMENT": what `tensorflow_model_server` would answer), or None
    when the failure came before the run.
    """

    def __init__(self, message: str, code: str | None = None):
        super().__init__(message)
        self.code = code


def compiler() -> str | None:
    return shutil.which("g++")


def build_runner(build_dir: str | None = None) -> str:
    """Compiles the runner once per source and TF version; returns its path."""
    import tensorflow as tf

    cxx = compiler()
    if cxx is None:
        raise CcLoaderError("No C++ compiler (g++) found: install g++ to build the loader")
    tf_dir = os.path.dirname(tf.__file__)
    with open(SOURCE, "rb") as file:
        key = hashlib.sha256(file.read() + tf.__version__.encode() + tf_dir.encode()).hexdigest()
    build_dir = build_dir or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "static_keras"
    )
    os.makedirs(build_dir, exist_ok=True)
    binary = os.path.join(build_dir, f"savedmodel_runner-{key[:16]}")
    if os.path.exists(binary):
        return binary
    # The wheel's own compile flags: C++17, the new libstdc++ ABI (=1; =0
    # compiles but fails to link), Eigen's alignment.
    flags = [f for f in tf.sysconfig.get_compile_flags() if not f.startswith("-I")]
    linker = ["-fuse-ld=gold"] if shutil.which("ld.gold") else []
    temporary = binary + f".tmp-{os.getpid()}"
    command = [
        cxx, "-O1", "-w", *flags, f"-I{tf_dir}/include", SOURCE, "-o", temporary,
        *linker, f"-L{tf_dir}", "-l:libtensorflow_cc.so.2", "-l:libtensorflow_framework.so.2",
        f"-Wl,-rpath,{tf_dir}",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise CcLoaderError(f"Building the C++ loader failed:\n{result.stderr[-3000:]}")
    os.replace(temporary, binary)
    return binary


def run_saved_model(
    path: str | os.PathLike,
    inputs: dict[str, np.ndarray],
    *,
    xla: bool = False,
    signature: str = "serving_default",
    binary: str | None = None,
    timeout: float = 600,
    repeat: int = 0,
    evict_mib: int = 0,
) -> CcRunResult:
    """Loads `path` with `tensorflow::LoadSavedModel` and runs `signature`.

    Args:
        path: SavedModel (version) directory.
        inputs: arrays by signature input name (int32, int64, float32,
            float64 or bool).
        xla: bool. Leave XLA compilation enabled; False calls
            `tensorflow::DisableXlaCompilation()` like a default server.
        signature: signature to run. Defaults to "serving_default".
        binary: a runner built by `build_runner`; built when None.
        repeat: int. Runs timed after the first, which pays the graph's
            one-time costs (`CcRunResult.repeat_ms`). Defaults to 0.
        evict_mib: int. MiB of scratch memory written before each repeated
            run, so caches are as cold as between a server's requests.

    Raises:
        CcLoaderError: with the loader's message (e.g. "XLA compilation
            disabled" for a jit-compiled export with `xla=False`).
    """
    binary = binary or build_runner()
    lines = []
    for name, value in inputs.items():
        value = np.asarray(value)
        if value.dtype not in _DTYPES:
            raise ValueError(f"Input {name!r}: unsupported dtype {value.dtype}")
        shape = ",".join(str(d) for d in value.shape) or "[]"
        if value.dtype.kind in "iub":
            values = ",".join(str(int(v)) for v in value.ravel())
        else:
            values = ",".join(repr(float(v)) for v in value.ravel())
        lines.append(f"{name} {_DTYPES[value.dtype]} {shape} {values}")
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as file:
        file.write("\n".join(lines) + "\n")
        spec = file.name
    try:
        command = [binary, f"--xla={'on' if xla else 'off'}", f"--signature={signature}",
                   f"--repeat={int(repeat)}", f"--evict_mib={int(evict_mib)}",
                   os.fspath(path), spec]  # fmt: skip
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    finally:
        os.unlink(spec)
    timings = {}
    for line in result.stderr.splitlines():
        if line.startswith(('{"load_time_ms"', '{"run_time_ms"', '{"repeat_times_ms"')):
            timings.update(json.loads(line))
    if result.returncode != 0:
        errors = [line for line in result.stderr.splitlines() if line.startswith("ERROR:")]
        message = errors[-1][7:] if errors else result.stderr[-2000:]
        code = re.match(r"Session::Run: ([A-Z_]+):", message)
        raise CcLoaderError(message, code[1] if code else None)
    outputs = {}
    for line in result.stdout.splitlines():
        record = json.loads(line)
        values = [float(v) if isinstance(v, str) else v for v in record["values"]]
        outputs[record["name"]] = np.asarray(values, dtype=record["dtype"]).reshape(record["shape"])
    return CcRunResult(
        outputs,
        timings.get("load_time_ms", 0.0),
        timings.get("run_time_ms", 0.0),
        tuple(timings.get("repeat_times_ms", ())),
    )
