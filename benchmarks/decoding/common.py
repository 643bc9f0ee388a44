"""Shared pieces of the decoding benchmarks: device, data, model, timing, CSV.

The set-up follows the STATIC paper (Table 1 and Table 4): random semantic
IDs (`L = 8` tokens in `[0, V)`), batch 2 x beam 70, `V = 2048`, `d = 2`. The
"model" is a random-logits step function, identical for every constraint:
each row's logits are one row of a fixed random table, chosen by a hash of
its prefix and a per-run salt. Only the constraint differs between methods.
"""

from __future__ import annotations

import csv
import json
import os
import platform
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS_DIR = os.path.join(REPO, "benchmarks", "results")
IMG_DIR = os.path.join(REPO, "docs", "img")

#: Methods in table order. "unconstrained" is the floor overhead is measured from.
METHODS = ("unconstrained", "static", "cpu_trie", "ppv_exact", "ppv_approx", "hash_bitmap")
#: Methods that XLA can compile (the CPU trie calls back into Python).
XLA_METHODS = ("unconstrained", "static", "ppv_exact", "ppv_approx", "hash_bitmap")
LABELS = {
    "unconstrained": "Unconstrained",
    "static": "STATIC",
    "cpu_trie": "CPU trie",
    "ppv_exact": "PPV exact",
    "ppv_approx": "PPV approx (top-50)",
    "hash_bitmap": "Hash bitmap",
}
#: Rows of the random logits table (a prime, so prefix hashes spread).
TABLE_ROWS = 257
_PREFIX_WEIGHTS = (3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59)
#: IDs are drawn in chunks with a seed per chunk, so the first N rows are the
#: same for every N: the sets are nested and every fan-out grows with N.
_CHUNK = 1 << 16


# Device --------------------------------------------------------------------


def configure_device(device: str) -> str:
    """Selects the TensorFlow backend and device; returns the device name.

    `cpu` hides every GPU; `gpu` requires one (a CUDA build of TensorFlow).
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if os.environ.get("KERAS_BACKEND", "tensorflow") != "tensorflow" and "keras" in sys.modules:
        raise SystemExit("the decoding benchmarks run on the TensorFlow backend")
    os.environ["KERAS_BACKEND"] = "tensorflow"
    import tensorflow as tf

    if device == "cpu":
        try:
            tf.config.set_visible_devices([], "GPU")
        except RuntimeError:  # already initialised; placement below still pins the CPU
            pass
        return "/CPU:0"
    if device == "gpu":
        if not tf.config.list_physical_devices("GPU"):
            raise SystemExit("--device gpu: TensorFlow sees no GPU (needs a CUDA build and driver)")
        return "/GPU:0"
    raise SystemExit(f"--device must be cpu or gpu, got {device!r}")


# Data and model --------------------------------------------------------------


def random_ids(n: int, vocab_size: int, length: int, seed: int = 0):
    """`[n, length]` random semantic IDs; the first rows do not depend on n."""
    import numpy as np

    dtype = np.uint16 if vocab_size <= 2**16 else np.int32
    out = np.empty((n, length), dtype=dtype)
    for chunk, start in enumerate(range(0, n, _CHUNK)):
        rng = np.random.default_rng([seed, vocab_size, length, chunk])
        block = rng.integers(0, vocab_size, size=(_CHUNK, length), dtype=dtype)
        out[start : start + _CHUNK] = block[: min(_CHUNK, n - start)]
    return out


def logits_table(vocab_size: int, seed: int = 0):
    import numpy as np

    rng = np.random.default_rng([seed, vocab_size, 7])
    return rng.normal(size=(TABLE_ROWS, vocab_size)).astype(np.float32)


def random_logits_step_fn(table, salt):
    """`step_fn(prefix, state)` of the random-logits model.

    The logits of a row are row `hash(prefix, salt) mod TABLE_ROWS` of `table`:
    a deterministic function of the prefix (so every constraint sees the same
    logits for the same beam) that changes with `salt` from run to run.
    """
    from keras import ops

    def step_fn(prefix, state):
        rows, t = prefix.shape[0], prefix.shape[1]
        code = ops.zeros((rows,), dtype="int32") + salt * 7919 + 101 * t
        if t:
            weights = ops.convert_to_tensor(list(_PREFIX_WEIGHTS[:t]), dtype="int32")
            code = code + ops.sum(ops.cast(prefix, "int32") * weights, axis=1)
        return ops.take(table, ops.mod(code, TABLE_ROWS), axis=0), state

    return step_fn


# Timing ----------------------------------------------------------------------


def percentile(values, q: float) -> float:
    values = sorted(values)
    if not values:
        return float("nan")
    position = (len(values) - 1) * q
    low = int(position)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (position - low)


def time_interleaved(
    functions: dict,
    *,
    warmup: int,
    min_repeats: int,
    max_repeats: int,
    budget_s: float,
    seed: int = 0,
):
    """Times `functions[key](salt)` in interleaved rounds.

    Each function first runs `warmup` times untimed (call each once before,
    so that tracing and compiling are not in here). Then, round after round,
    every function still in play runs once, in a shuffled order, with the
    round's salt (so all see the same logits in a round). A function leaves
    once it has run `min_repeats` rounds and spent `budget_s` seconds (fast
    ones run up to `max_repeats` rounds, slow ones `min_repeats`);
    functions whose key is a floor (`key[0] == "unconstrained"`) stay while
    any function of their mode does. Interleaving makes the paired
    difference "method minus floor in the same round" immune to slow drift.

    Returns:
        `{key: {"runs": [seconds or None per round]}}`.
    """
    import random

    order_rng = random.Random(seed)
    results = {key: {"runs": [], "spent": 0.0} for key in functions}
    for key, function in functions.items():
        for i in range(warmup):
            _sync(function(-1 - i))
    for round_index in range(max_repeats):
        playing = [
            key
            for key in functions
            if key[0] != "unconstrained"
            and (round_index < min_repeats or results[key]["spent"] < budget_s)
        ]
        modes = {key[1] for key in playing}
        playing += [key for key in functions if key[0] == "unconstrained" and key[1] in modes]
        if not playing:
            break
        order_rng.shuffle(playing)
        for key in functions:
            results[key]["runs"].append(None)
        for key in playing:
            start = time.perf_counter()
            _sync(functions[key](round_index + 1))
            seconds = time.perf_counter() - start
            results[key]["runs"][-1] = seconds
            results[key]["spent"] += seconds
    return {key: {"runs": value["runs"]} for key, value in results.items()}


def _sync(outputs) -> None:
    """Waits for a decode to finish (fetching its small scores tensor)."""
    outputs[-1].numpy()


def summarize_runs(runs, floor_runs, length: int) -> dict:
    """Median/p90 of a method's runs and of its per-step overhead over the floor."""
    own = [r for r in runs if r is not None]
    paired = [(r - f) / length for r, f in zip(runs, floor_runs) if r is not None and f is not None]
    ms = 1e3
    return {
        "repeats": len(own),
        "run_ms_median": round(statistics.median(own) * ms, 4),
        "run_ms_p90": round(percentile(own, 0.9) * ms, 4),
        "step_ms_median": round(statistics.median(own) * ms / length, 5),
        "overhead_ms_step_median": round(statistics.median(paired) * ms, 5),
        "overhead_ms_step_p10": round(percentile(paired, 0.1) * ms, 5),
        "overhead_ms_step_p90": round(percentile(paired, 0.9) * ms, 5),
    }


# Subprocesses, CSV, machine ---------------------------------------------------


def run_child(module: str, config: dict, *, timeout: float | None = None) -> list[dict]:
    """Runs `python -m module --child JSON` from the repository root; returns its rows.

    Each measurement point gets its own process, so its memory is its own and
    one point's allocations cannot slow the next.
    """
    command = [sys.executable, "-m", module, "--child", json.dumps(config)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
    process = subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )
    if process.returncode != 0:
        sys.stderr.write(process.stderr[-4000:])
        raise RuntimeError(f"{module} child failed (exit {process.returncode}) for {config}")
    for line in process.stderr.splitlines():
        if line.startswith("    "):
            print(line, flush=True)
    return json.loads(process.stdout.strip().splitlines()[-1])


def child_main(function, argv) -> bool:
    """If argv is `--child JSON`, runs `function(config)`, prints its rows as JSON."""
    if len(argv) == 2 and argv[0] == "--child":
        rows = function(json.loads(argv[1]))
        print(json.dumps(rows))
        return True
    return False


def size_sweep(module: str, sizes, config: dict, format_row) -> list[dict]:
    """Runs `module`'s child once per N (`run_child`, config plus `"n"`),
    prints each row it returns with `format_row`; returns all rows."""
    rows = []
    for n in sizes:
        for row in run_child(module, {**config, "n": int(float(n))}):
            rows.append(row)
            print(format_row(row), flush=True)
    return rows


def index_size_sweep(module: str, doc: str, measure, format_row, sizes, csv_name, argv=None):
    """The main of a per-N benchmark over random semantic IDs: parses
    `--sizes --vocab-size --length --dense-levels --seed --out`, runs
    `measure(n, vocab_size, length, dense_levels, seed) -> row` in one child
    process per N (`size_sweep`), prints the rows and writes the CSV."""
    import argparse

    argv = sys.argv[1:] if argv is None else argv
    keys = ("vocab_size", "length", "dense_levels", "seed")
    if child_main(lambda config: [measure(config["n"], *(config[k] for k in keys))], argv):
        return
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", type=float, default=list(sizes))
    parser.add_argument("--vocab-size", type=int, default=2048)
    parser.add_argument("--length", type=int, default=8)
    parser.add_argument("--dense-levels", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=os.path.join(RESULTS_DIR, csv_name))
    args = parser.parse_args(argv)
    rows = size_sweep(module, args.sizes, {k: getattr(args, k) for k in keys}, format_row)
    write_csv(args.out, rows)
    print(machine_line())
    print(f"wrote {args.out}")


def machine_line() -> str:
    """One line for a table's footer: architecture, cores, Python, load."""
    return (
        f"machine: {platform.machine()}, {os.cpu_count()} cpus, "
        f"python {platform.python_version()}, load {os.getloadavg()[0]:.2f}"
    )


def default_csv(name: str, device: str) -> str:
    """benchmarks/results/decoding_<name>.csv, or decoding_gpu_<name>.csv on a GPU."""
    prefix = "decoding_" if device == "cpu" else f"decoding_{device}_"
    return os.path.join(RESULTS_DIR, f"{prefix}{name}.csv")


def write_csv(path: str, rows: list[dict], columns: list[str] | None = None) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if columns is None:
        columns = []
        for row in rows:
            columns += [key for key in row if key not in columns]
    with open(path, "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def read_csv(path: str) -> list[dict]:
    with open(path, newline="") as file:
        return list(csv.DictReader(file))


def peak_rss_bytes() -> int:
    """Peak resident set size of this process: Linux's VmHWM, which starts
    afresh at exec (`ru_maxrss` keeps the parent's peak across fork and
    exec, so a small job started by a large benchmark reads the parent's)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def machine_info(device: str) -> dict:
    """CPU model, cores, RAM, load, versions, GPU name: what a result depends on."""
    import keras
    import numpy as np
    import tensorflow as tf

    info = {
        "device": device,
        "cpu_model": _cpu_model(),
        "cpu_cores": os.cpu_count(),
        "ram_gb": None,
        "load_avg_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "os": platform.platform(),
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "keras_backend": keras.config.backend(),
        "numpy": np.__version__,
        "gpu": "",
    }
    try:
        import psutil

        info["ram_gb"] = round(psutil.virtual_memory().total / 2**30, 1)
    except ImportError:
        pass
    if device == "gpu":
        gpus = tf.config.list_physical_devices("GPU")
        if gpus:
            details = tf.config.experimental.get_device_details(gpus[0])
            info["gpu"] = details.get("device_name", gpus[0].name)
    return info


def _cpu_model() -> str:
    try:
        output = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in output.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return platform.processor() or platform.machine()


def log(message: str) -> None:
    """Progress on stderr (the parent echoes lines starting with 4 spaces)."""
    print(message, file=sys.stderr, flush=True)
