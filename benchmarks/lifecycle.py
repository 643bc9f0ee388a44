"""Production-lifecycle benchmark: the daily loop an operator runs, timed from outside.

Per catalogue size N (each in its own process, so peak RSS is its own):

- data: semantic IDs of 8 tokens over 2048 (random, distinct rows, drawn in
  chunks as in benchmarks/decoding/common.py), sparse item ids
  `10**9 + 2 * permutation(N)` (`--dense-ids`: 0..N-1); one eligibility set
  "in_stock", a random half of the items;
- `index_build` (`StaticIndex.build`), `eligibility_build`
  (`EligibilitySets.build` of the one set), `publish_v1` (the README's small
  `CachedTransformerDecoder` in `ConstrainedBeamSearch(beam_size=20)`,
  warmup batch sizes 1 and 32; the version dir size), `cc_load` (the C++
  `LoadSavedModel` load and first run, `serving/cc_loader.py`; skipped with
  `--quick` or without g++);
- `server_start`: `static-keras serve-dev --file_system_poll_wait_seconds 1`
  as a subprocess on free ports, until its first answer;
- `predict_*`: p50/p90 over gRPC at batch 1 and 32, `serving_default` and
  `serving_eligible` (set_id 0, three excluded item ids);
- `rules_change`: 1% of the set flipped (as many items leave "in_stock" as
  join it). A fresh job process (`--job refresh`: import, read the ids,
  `refresh_eligibility(base, {"in_stock": ids})`) is started; timed from
  its start to the first answer served by the new version. Sub-stages: the
  in-process `EligibilitySets.replace` (for reference), the job's import and
  refresh call, the server's load and warmup (from its log), the pickup
  (job end to first new answer), and the server's RSS once the old version
  is unloaded;
- `catalogue_change`: 1% of the items replaced by new semantic IDs and new
  item ids. A fresh job process (`--job catalogue`) loads the trained model
  (`.keras`, saved at set-up), puts the served version's sets on it
  (`read_eligibility` + `set_eligibility`: the rules live in the served
  version, not in the model file), builds the new index, calls
  `replace_index(model, new_index)` and `publish`. Timed from its start to
  the first answer from the new version. `catalogue_change.eligibility_kept`
  FAILs when the new version has no eligibility sets (no `serving_eligible`:
  every restricted request to it fails, and is counted).

During each swap, `--load-threads` (at least 3) client threads send Predict
requests continuously, one in flight per thread and `--load-pause-ms`
(default 50: a 2-core machine's server is busy, not saturated) between two,
with `serving_default` at batch 1 and `serving_eligible` at batch 1 and 32
(round robin over the threads). The swap's row counts
answers, failed requests, the longest request, answers from versions other
than the old and the new one, and answers holding an item the answering
version may not return (outside its catalogue, its "in_stock" set, or
excluded).

    python benchmarks/lifecycle.py --sizes 1e5,1e6,2e7 [--dense-ids] [--csv PATH]
    python benchmarks/lifecycle.py --quick     # N = 1e5, no C++ loader, well under 2 min

Prints a table per N and writes benchmarks/results/lifecycle.csv (`--quick`:
a temporary file unless `--csv`). Everything runs on one machine: version
files are read back from the page cache, so a server on another host
loading from a network volume would take longer.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.decoding import common  # noqa: E402

MODEL = "recs"
VOCAB, LENGTH = 2048, 8
HISTORY, CONTEXT_VOCAB = 20, 10_000
BEAM, RESULTS = 20, 10
WARMUP_BATCHES = (1, 32)
SET = "in_stock"
CHANGE = 0.01  # share of the set (rules) and of the catalogue (items) changed
EXCLUDED = 8  # item ids each restricted request excludes
COLUMNS = ["n", "ids", "stage", "seconds", "peak_rss_mib", "status", "requests", "failed",
           "failed_default", "unexpected_versions", "wrong_items", "max_latency_ms", "p50_ms",
           "p90_ms", "ratio", "notes"]  # fmt: skip
MIB = 2**20


# Data --------------------------------------------------------------------------


def row_keys(ids, vocab_size: int):
    """uint64 per row: the leading bits of its tokens. Distinct keys imply
    distinct rows (the key is the whole row when `L * bits <= 64`)."""
    import numpy as np

    bits = max(1, int(vocab_size - 1).bit_length())
    keys = np.zeros(len(ids), np.uint64)
    used = 0
    for t in range(ids.shape[1]):
        take = min(bits, 64 - used)
        if take <= 0:
            break
        token = ids[:, t].astype(np.uint64) >> np.uint64(bits - take)
        keys <<= np.uint64(take)
        keys |= token
        used += take
    return keys


def distinct_ids(n: int, seed: int, taken=()):
    """`[n, LENGTH]` uint16 random rows, distinct from each other and from the
    row keys in `taken` (a sorted array, or several: no merged copy of a
    10^8-key catalogue is needed); returns `(ids, keys)`. Rows whose key
    repeats are drawn again (vectorised; one pass at random sizes up to 2e7)."""
    import numpy as np

    if isinstance(taken, np.ndarray):
        taken = (taken,)
    ids = common.random_ids(n, VOCAB, LENGTH, seed)
    rng = np.random.default_rng([seed, 17])
    while True:
        keys = row_keys(ids, VOCAB)
        ordered = np.sort(keys)
        repeated = ordered[1:][ordered[1:] == ordered[:-1]]
        redraw = np.isin(keys, repeated) if repeated.size else np.zeros(n, bool)
        for sorted_keys in taken:
            redraw |= member(sorted_keys, keys)
        del ordered
        if not redraw.any():
            return ids, keys
        ids[redraw] = rng.integers(0, VOCAB, (int(redraw.sum()), LENGTH), dtype=ids.dtype)


def member(sorted_ids, values):
    """bool per value: is it in the sorted array (or the `IdSet`)."""
    import numpy as np

    if isinstance(sorted_ids, IdSet):
        return sorted_ids.contains(values)
    if not len(sorted_ids):
        return np.zeros(np.shape(values), bool)
    at = np.minimum(np.searchsorted(sorted_ids, values), len(sorted_ids) - 1)
    return sorted_ids[at] == values


class IdSet:
    """A set of ids as a sorted base array, less the ids `removed`, plus the
    ids `added`: what a version may return after a delta, without a merged
    copy of the base (at 10^8 items each copy is 0.8 GB of the benchmark's
    memory beside the server and the job)."""

    def __init__(self, base, removed=(), added=()):
        import numpy as np

        if isinstance(base, IdSet):  # a delta on a delta: fold into one
            removed = np.concatenate([base.removed, np.asarray(removed, np.int64)])
            added = np.concatenate([np.setdiff1d(base.added, removed), np.asarray(added)])
            base = base.base
        self.base = base
        self.removed = np.sort(np.asarray(removed, np.int64))
        self.added = np.sort(np.asarray(added, np.int64))

    def contains(self, values):
        import numpy as np

        values = np.asarray(values)
        inside = member(self.base, values) & ~member(self.removed, values)
        return inside | member(self.added, values)


# Processes: memory, ports, the server ------------------------------------------------


def rss(pid: int) -> int:
    import psutil

    try:
        return psutil.Process(pid).memory_info().rss
    except psutil.Error:
        return 0


class PeakRss:
    """Samples `measure()` (bytes) every 20 ms in a thread; `.peak` in bytes."""

    def __init__(self, measure, interval: float = 0.02):
        self.measure, self.interval, self.peak = measure, interval, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while True:
            self.peak = max(self.peak, self.measure())
            if self._stop.wait(self.interval):
                return

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.measure())


class InProcess:
    """Wall time and peak RSS of this process over a `with` block."""

    def __enter__(self):
        self.before = rss(os.getpid())
        self._sampler = PeakRss(lambda: rss(os.getpid())).__enter__()
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self._start
        self._sampler.__exit__(*exc)
        self.peak = self._sampler.peak
        self.grown = f"peak +{(self.peak - self.before) / MIB:.0f} MiB over the stage's start"


def children_rss():
    """RSS of this process' children (a loader subprocess)."""
    import psutil

    return lambda: sum(rss(child.pid) for child in psutil.Process().children(recursive=True))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def child_env() -> dict:
    return dict(
        os.environ,
        KERAS_BACKEND="tensorflow",
        TF_CPP_MIN_LOG_LEVEL="2",
        PYTHONPATH=os.pathsep.join([common.REPO, os.environ.get("PYTHONPATH", "")]),
    )


class ServerProcess:
    """`static-keras serve-dev` in a subprocess; its log goes to a file."""

    def __init__(self, base: str, log_path: str):
        self.grpc_port, self.rest_port = free_port(), free_port()
        command = self._command(["serve-dev", "--model_base_path", base, "--model_name", MODEL,
                    "--port", str(self.grpc_port), "--rest_api_port", str(self.rest_port),
                    "--file_system_poll_wait_seconds", "1"])  # fmt: skip
        self.log_path = log_path
        self._log = open(log_path, "w")
        self.process = subprocess.Popen(
            command, stdout=self._log, stderr=subprocess.STDOUT, env=child_env(), cwd=common.REPO
        )
        self.address = f"127.0.0.1:{self.grpc_port}"

    def _command(self, arguments: list[str]) -> list[str]:
        """The static-keras command line (this checkout's code)."""
        executable = os.path.join(os.path.dirname(sys.executable), "static-keras")
        if os.path.exists(executable):
            return [executable, *arguments]
        return [sys.executable, "-m", "static_keras.cli", *arguments]

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        with open(self.log_path) as file:
            return file.read()

    def load_seconds(self, version: int) -> float | None:
        """'version V loaded and warmed up in S s' from the server's log."""
        found = re.findall(rf"version {version} loaded and warmed up in ([0-9.]+) s", self.log())
        return float(found[-1]) if found else None

    def wait_until_answering(self, proto, timeout: float) -> float:
        """Seconds until a `serving_default` Predict of `proto` is answered
        (the server started and loaded a version)."""
        from static_keras.serving import GrpcClient
        from static_keras.serving import ServingError

        start = time.perf_counter()
        with GrpcClient(self.address, timeout=timeout) as client:
            while True:
                self.check_alive()
                try:
                    client.predict_raw(MODEL, proto)
                    return time.perf_counter() - start
                except ServingError:
                    if time.perf_counter() - start > timeout:
                        raise
                    time.sleep(0.2)

    def check_alive(self):
        if self.process.poll() is not None:
            raise RuntimeError(
                f"serve-dev exited ({self.process.returncode}):\n{self.log()[-3000:]}"
            )

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


# Requests and load ------------------------------------------------------------------


class Requests:
    """Prepared Predict inputs (TensorProtos) and the check of an answer."""

    def __init__(self, rng, in_stock):
        import numpy as np
        import tensorflow as tf

        def history(batch):
            return rng.integers(1, CONTEXT_VOCAB, (batch, HISTORY)).astype(np.int32)

        excluded = np.full((32, EXCLUDED + 1), -1, np.int64)  # -1: padding
        excluded[:, :EXCLUDED] = rng.choice(in_stock, (32, EXCLUDED))
        self.excluded = excluded
        self.inputs, self.proto = {}, {}
        for batch in WARMUP_BATCHES:
            self.inputs["serving_default", batch] = {"history": history(batch)}
            self.inputs["serving_eligible", batch] = {
                "history": history(batch),
                "set_id": np.zeros(batch, np.int32),
                "excluded_item_ids": excluded[:batch],
            }
        for key, inputs in self.inputs.items():
            self.proto[key] = {name: tf.make_tensor_proto(v) for name, v in inputs.items()}
        #: version -> (sorted catalogue item ids, sorted ids a restricted row may return)
        self.allowed: dict[int, tuple] = {}

    def wrong_items(self, version: int, signature: str, item_ids) -> int:
        """Items in the answer the answering version may not return."""
        import numpy as np

        if version not in self.allowed:
            return 0
        catalogue, eligible = self.allowed[version]
        wrong = 0
        for row, items in enumerate(item_ids):
            items = items[items >= 0]
            bad = ~member(catalogue, items)
            if signature == "serving_eligible":
                bad |= ~member(eligible, items) | np.isin(items, self.excluded[row])
            wrong += int(bad.sum())
        return wrong


class Load:
    """Client threads sending Predict requests continuously during a swap.

    Answers are kept (version, signature, items) and checked after the job
    has said which version it published (`finish`)."""

    KINDS = (("serving_default", 1), ("serving_eligible", 1), ("serving_eligible", 32))

    def __init__(self, address: str, requests: Requests, threads: int, pause_s: float):
        self.address, self.requests, self.pause_s = address, requests, pause_s
        self.kinds = [self.KINDS[i % len(self.KINDS)] for i in range(max(3, threads))]
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = []

    def start(self):
        self.answers = []  # (version, signature, item ids, end time)
        self.failures = []  # (signature, message)
        self.max_latency = 0.0
        self.timeline = []  # (end time, seconds) of every request: when the slow ones were
        self.first = {}  # (version, signature) -> perf_counter of its first answer
        self.completed = [0] * len(self.kinds)
        self._stop.clear()
        self._threads = [
            threading.Thread(target=self._run, args=(i,), daemon=True)
            for i in range(len(self.kinds))
        ]
        for thread in self._threads:
            thread.start()

    def first_answer(self, version: int, signature: str | None = None):
        with self.lock:
            times = [
                t for (v, s), t in self.first.items() if v == version and signature in (None, s)
            ]
        return min(times) if times else None

    def _run(self, i: int):
        import tensorflow as tf

        from static_keras.serving import GrpcClient
        from static_keras.serving import ServingError

        signature, batch = self.kinds[i]
        proto = self.requests.proto[signature, batch]
        with GrpcClient(self.address, timeout=120) as client:
            while not self._stop.is_set():
                start = time.perf_counter()
                try:
                    response = client.predict_raw(MODEL, proto, signature=signature)
                except ServingError as error:
                    with self.lock:
                        self.failures.append((signature, re.sub(r"\d+", "#", str(error))))
                        self.max_latency = max(self.max_latency, time.perf_counter() - start)
                        self.completed[i] += 1
                    self._stop.wait(max(self.pause_s, 0.1))
                    continue
                end = time.perf_counter()
                version = int(response.model_spec.version.value)
                items = tf.make_ndarray(response.outputs["item_ids"])
                with self.lock:
                    self.answers.append((version, signature, items))
                    self.max_latency = max(self.max_latency, end - start)
                    self.timeline.append((end, end - start))
                    self.first.setdefault((version, signature), end)
                    self.completed[i] += 1
                if self.pause_s:
                    self._stop.wait(self.pause_s)

    def stop(self):
        self._stop.set()
        for thread in self._threads:
            thread.join()

    def finish(self, old: int, new: int | None) -> tuple[dict, str]:
        """The swap's counts (CSV columns) and a note, once the threads stopped."""
        versions, wrong, unexpected = {}, 0, 0
        for version, signature, items in self.answers:
            versions[version] = versions.get(version, 0) + 1
            unexpected += version not in (old, new)
            wrong += self.requests.wrong_items(version, signature, items)
        failed_default = sum(signature == "serving_default" for signature, _ in self.failures)
        summary = {
            "requests": len(self.answers) + len(self.failures),
            "failed": len(self.failures),
            "failed_default": failed_default,
            "unexpected_versions": unexpected,
            "wrong_items": wrong,
            "max_latency_ms": round(1e3 * self.max_latency, 1),
        }
        counts = ",".join(f"v{v}:{c}" for v, c in sorted(versions.items()))
        note = (
            f"load {len(self.kinds)} threads: {len(self.answers)} answers ({counts}), "
            f"{len(self.failures)} failed, {wrong} wrong items, max {1e3 * self.max_latency:.0f} ms"
        )
        errors = {}
        for signature, message in self.failures:
            errors[signature, message] = errors.get((signature, message), 0) + 1
        for (signature, message), count in sorted(errors.items(), key=lambda kv: -kv[1])[:2]:
            note += f"; {count}x {signature}: {message[-240:]!r}"
        return summary, note


# The per-N run ------------------------------------------------------------------------


class Stages:
    """Rows of the table: one per stage (or sub-stage), each also written to
    `sink` as it comes, so a run stopped from outside (a memory watchdog at
    10^8) still leaves the rows it measured."""

    def __init__(self, n: int, ids: str, sink: str | None = None):
        self.n, self.ids, self.rows, self.sink = n, ids, [], sink

    def add(self, stage, seconds=None, peak=None, status="ok", notes="", **extra) -> dict:
        row = {
            "n": self.n,
            "ids": self.ids,
            "stage": stage,
            "seconds": None if seconds is None else round(seconds, 3),
            "peak_rss_mib": None if not peak else round(peak / MIB, 1),
            "status": status,
            "notes": notes,
            **extra,
        }
        self.rows.append(row)
        print(format_row(row), flush=True)
        self.save()
        return row

    def save(self) -> None:
        if self.sink:
            with open(self.sink + ".part", "w") as file:
                json.dump(self.rows, file)
            os.replace(self.sink + ".part", self.sink)


def run_size(config: dict) -> list[dict]:
    os.environ["KERAS_BACKEND"] = "tensorflow"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    n, seed = config["n"], config["seed"]
    stages = Stages(n, "dense" if config["dense_ids"] else "sparse", sink=config["rows_path"])
    workdir = tempfile.mkdtemp(prefix=f"lifecycle-{n}-", dir=config.get("workdir"))
    try:
        _run_size(config, n, seed, stages, workdir)
    except Exception as error:  # the rows so far, and the error, still reach the table
        stages.add("run", status="FAIL", notes=f"{type(error).__name__}: {error}"[:600])
        raise
    finally:
        stages.save()
        if not config.get("keep_workdir"):
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"    kept {workdir}")
    return stages.rows


def served_model(index, sets, seed: int):
    """The model every lifecycle benchmark serves: the README's small decoder
    (seeded) in a `ConstrainedBeamSearch` over `index` with `sets`."""
    import keras

    from static_keras import CachedTransformerDecoder
    from static_keras import ConstrainedBeamSearch
    from static_keras import ConstrainedDecoding

    keras.utils.set_random_seed(seed)
    decoder = CachedTransformerDecoder(VOCAB, LENGTH, context_vocab_size=CONTEXT_VOCAB)
    constraint = ConstrainedDecoding(index, eligibility=sets, name="constraint")
    search = ConstrainedBeamSearch(
        constraint=constraint, decoder=decoder, beam_size=BEAM, num_results=RESULTS
    )
    history = keras.Input((HISTORY,), dtype="int32", name="history")
    return keras.Model(history, search(history))


def _spilled(workdir: str, **arrays) -> list:
    """`arrays` written to `workdir` and mapped back read-only (page cache,
    not this process's heap)."""
    import numpy as np

    mapped = []
    for name, array in arrays.items():
        path = os.path.join(workdir, f"{name}.npy")
        np.save(path, array)
        mapped.append(np.load(path, mmap_mode="r"))
    return mapped


def _rows_replaced(array, gone, new, step: int = 1 << 22):
    """`array` (a mapped file) without the rows at the sorted positions
    `gone`, then the rows `new`: one output array, filled a slice at a time
    (no index of the kept rows and no concatenated copy: at 10^8 each would
    be another GB beside the server)."""
    import numpy as np

    keep = np.ones(len(array), bool)
    keep[gone] = False
    out = np.empty((len(array) - len(gone) + len(new),) + array.shape[1:], array.dtype)
    filled = 0
    for start in range(0, len(array), step):
        part = array[start : start + step][keep[start : start + step]]
        out[filled : filled + len(part)] = part
        filled += len(part)
    out[filled:] = new
    return out


def _run_size(config, n, seed, stages, workdir):
    import numpy as np

    from static_keras import StaticIndex
    from static_keras.export import publish
    from static_keras.index.eligibility import EligibilitySets
    from static_keras.serving import GrpcClient
    from static_keras.serving import ServingError

    base = os.path.join(workdir, MODEL)
    rng = np.random.default_rng([seed, n])

    # Data.
    with InProcess() as stage:
        semantic_ids, keys = distinct_ids(n, seed)
        item_ids = (
            np.arange(n, dtype=np.int64)
            if config["dense_ids"]
            else 10**9 + 2 * rng.permutation(n).astype(np.int64)
        )
    notes = f"{n:,} distinct rows of {LENGTH} tokens over {VOCAB}, {stages.ids} ids"
    stages.add("data", stage.seconds, stage.peak, notes=f"{notes}; {stage.grown}")

    with InProcess() as stage:
        index = StaticIndex.build(
            semantic_ids, VOCAB, item_ids=item_ids, headroom=config.get("headroom", 0.0)
        )
    notes = (
        f"index {index.nbytes / MIB:.0f} MiB, dense_levels {index.dense_levels}, "
        f"headroom {config.get('headroom', 0.0)}, step widths {list(index.step_widths)}"
    )
    stages.add("index_build", stage.seconds, stage.peak, notes=f"{notes}; {stage.grown}")

    in_stock = np.sort(item_ids[rng.permutation(n)[: n // 2]])
    with InProcess() as stage:
        sets = EligibilitySets.build(index, {SET: in_stock})
    notes = f"1 set of {len(in_stock):,}, {sets.nbytes / MIB:.1f} MiB"
    stages.add("eligibility_build", stage.seconds, stage.peak, notes=f"{notes}; {stage.grown}")

    with InProcess() as stage:
        model = served_model(index, sets, seed)
    notes = f"CachedTransformerDecoder (hidden 32) in ConstrainedBeamSearch(beam_size={BEAM})"
    stages.add("model_build", stage.seconds, stage.peak, notes=f"{notes}; {stage.grown}")

    with InProcess() as stage:
        v1 = publish(model, base, warmup_batch_sizes=WARMUP_BATCHES, model_name=MODEL)
    size = sum(
        os.path.getsize(os.path.join(folder, name))
        for folder, _, files in os.walk(v1.path)
        for name in files
    )
    notes = (
        f"version dir {size / MIB:.1f} MiB; export {v1.export.seconds:.1f} s, then check + "
        "load + warmup in this process"
    )
    stages.add("publish_v1", v1.seconds, stage.peak, notes=f"{notes}; {stage.grown}")
    model_path = os.path.join(workdir, "model.keras")
    if not config.get("serving_only"):
        model.save(model_path)  # the trained model the daily catalogue job starts from
    # This process only checks answers and writes the jobs' inputs from here
    # on: it drops the model and the index, and keeps the semantic IDs and
    # item ids on disk (read again for the catalogue changes), so that at
    # 10^8 the jobs measured run beside the server, not beside the
    # benchmark's 12 GB.
    del model, index
    gc.collect()
    semantic_ids, keys, item_ids = _spilled(
        workdir, semantic_ids=semantic_ids, keys=keys, item_ids=item_ids
    )

    requests = Requests(rng, in_stock)
    catalogue = np.sort(item_ids)
    requests.allowed[1] = (catalogue, in_stock)

    if config["cc"]:
        _cc_stage(stages, v1.path, requests)
    else:
        stages.add("cc_load", status="skipped", notes="--quick / --no-cc")

    server = ServerProcess(base, os.path.join(workdir, "server.log"))
    try:
        client = GrpcClient(server.address, timeout=120)
        start = time.perf_counter()
        with PeakRss(lambda: rss(server.pid)) as sampler:
            while True:
                server.check_alive()
                try:
                    client.predict_raw(MODEL, requests.proto["serving_default", 1])
                    break
                except ServingError:
                    if time.perf_counter() - start > config["timeout"]:
                        raise
                    time.sleep(0.05)
        steady = rss(server.pid)
        stages.add(
            "server_start",
            time.perf_counter() - start,
            sampler.peak,
            notes=f"serve-dev to first answer; v1 loaded + warmed up in "
            f"{server.load_seconds(1)} s (server log)",
        )

        kinds = [(signature, batch) for batch in WARMUP_BATCHES
                 for signature in ("serving_default", "serving_eligible")]  # fmt: skip
        times = _interleaved_latencies(client, requests, kinds, config["requests"])
        for signature, batch in kinds:
            p50 = common.percentile(times[signature, batch], 0.5)
            p90 = common.percentile(times[signature, batch], 0.9)
            stages.add(
                f"predict_{signature.split('_')[1]}_b{batch}",
                p50,
                rss(server.pid),
                p50_ms=round(1e3 * p50, 2),
                p90_ms=round(1e3 * p90, 2),
                requests=len(times[signature, batch]),
                notes=f"p50 {1e3 * p50:.1f} ms, p90 {1e3 * p90:.1f} ms over "
                f"{len(times[signature, batch])} requests, interleaved",
            )
        for batch in WARMUP_BATCHES:
            _eligible_cost(stages, "dev server", batch, times["serving_default", batch],
                           times["serving_eligible", batch])  # fmt: skip
        steady = rss(server.pid)
        stages.add("server_rss_one_version", peak=steady, notes="server RSS serving v1, warm")
        if config.get("serving_only"):
            return

        load = Load(server.address, requests, config["load_threads"], config["load_pause_ms"] / 1e3)

        # Rules change: 1% of the set leaves it, as many items join it.
        flip = max(1, int(CHANGE * len(in_stock)))
        out_of_stock = np.setdiff1d(catalogue, in_stock, assume_unique=True)
        leaving = rng.choice(in_stock, flip, replace=False)
        joining = rng.choice(out_of_stock, min(flip, len(out_of_stock)), replace=False)
        in_stock_2 = np.sort(np.concatenate([np.setdiff1d(in_stock, leaving), joining]))
        del out_of_stock, leaving, joining
        start = time.perf_counter()
        sets.replace(SET, in_stock_2)
        replace_s = time.perf_counter() - start
        del sets  # its catalogue and table: 2 GB at 10^8, not needed from here on
        ids_path = os.path.join(workdir, "in_stock.npy")
        np.save(ids_path, in_stock_2)
        job = ["--job", "refresh", "--base", base, "--ids", ids_path]
        replace_note = (
            f"EligibilitySets.replace in-process, {2 * flip:,} ids flipped (not part "
            "of the job's time)"
        )
        current = _swap(
            stages,
            "rules_change",
            job,
            server,
            client,
            load,
            1,
            steady,
            config,
            (catalogue, in_stock_2),
            subs=[("rules_change.replace", replace_s, None, replace_note)],
        )
        served_stock = in_stock_2 if current != 1 else in_stock

        if config.get("headroom"):
            # Catalogue delta: 1% of the items replaced, published into the
            # served graph (update_catalogue: no Keras, no TensorFlow).
            # The new rows avoid every served row (the removed ones too: one
            # sorted copy of the keys, no set difference over N).
            change = max(1, int(CHANGE * n))
            gone = rng.choice(n, change, replace=False)
            taken = np.sort(keys)
            added_rows, added_keys = distinct_ids(change, seed + 2, taken=taken)
            top = int(item_ids.max()) + 1
            added_ids = top + 2 * np.arange(change, dtype=np.int64)
            add_path = os.path.join(workdir, "added.npz")
            remove_path = os.path.join(workdir, "removed.npy")
            np.savez(add_path, semantic_ids=added_rows, item_ids=added_ids)
            np.save(remove_path, item_ids[gone])
            # What the new version may return: the served ids less the
            # removed plus the added (added items are in no set).
            delta_catalogue = IdSet(catalogue, removed=item_ids[gone], added=added_ids)
            delta_stock = IdSet(served_stock, removed=item_ids[gone])
            job = ["--job", "delta", "--base", base, "--add", add_path, "--remove", remove_path]
            current = _swap(
                stages, "catalogue_delta", job, server, client, load, current, steady, config,
                (delta_catalogue, delta_stock),
            )  # fmt: skip

            # 1,000 new items, nothing removed.
            fresh_rows, _ = distinct_ids(1000, seed + 3, taken=(taken, np.sort(added_keys)))
            del taken
            fresh_ids = int(added_ids.max()) + 1 + 2 * np.arange(1000, dtype=np.int64)
            np.savez(add_path, semantic_ids=fresh_rows, item_ids=fresh_ids)
            np.save(remove_path, np.zeros(0, np.int64))
            fresh_catalogue = IdSet(delta_catalogue, added=fresh_ids)
            current = _swap(
                stages, "catalogue_add_1000", job, server, client, load, current, steady, config,
                (fresh_catalogue, delta_stock),
            )  # fmt: skip

        # Catalogue change: 1% of the items replaced by new rows and new ids.
        change = max(1, int(CHANGE * n))
        gone = np.sort(rng.choice(n, change, replace=False))
        new_rows, _ = distinct_ids(change, seed + 1, taken=np.sort(keys))
        top = int(item_ids.max()) + 1
        new_items = (
            np.arange(top, top + change, dtype=np.int64)
            if config["dense_ids"]
            else top + 1 + 2 * np.arange(change, dtype=np.int64)
        )
        feed = os.path.join(workdir, "catalogue.npz")
        np.savez(
            feed,
            semantic_ids=_rows_replaced(semantic_ids, gone, new_rows),
            item_ids=_rows_replaced(item_ids, gone, new_items),
        )
        del semantic_ids, keys
        # Sets carried over by item id (replace_index): the served members
        # still in the catalogue; new items are in no set.
        allowed = (IdSet(catalogue, removed=item_ids[gone], added=new_items), served_stock)
        job = ["--job", "catalogue", "--base", base, "--model", model_path, "--feed", feed]
        _swap(
            stages, "catalogue_change", job, server, client, load, current, steady, config, allowed
        )
        client.close()
    finally:
        server.stop()


def _latencies(client, proto, signature, count, warmup=3):
    times = []
    for i in range(warmup + count):
        start = time.perf_counter()
        client.predict_raw(MODEL, proto, signature=signature)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return times


def _interleaved_latencies(client, requests, kinds, count, warmup=3):
    """{(signature, batch): [seconds]}: `count` rounds that each send every
    kind once, in turn forward and backward, so drift in the machine's load
    falls on every kind alike."""
    times = {kind: [] for kind in kinds}
    for i in range(warmup + count):
        for kind in kinds if i % 2 == 0 else kinds[::-1]:
            start = time.perf_counter()
            client.predict_raw(MODEL, requests.proto[kind], signature=kind[0])
            if i >= warmup:
                times[kind].append(time.perf_counter() - start)
    return times


def _eligible_cost(stages, path, batch, plain, eligible):
    """A row: p50 of `serving_eligible` over p50 of `serving_default`."""
    plain_p50, eligible_p50 = common.percentile(plain, 0.5), common.percentile(eligible, 0.5)
    ratio = eligible_p50 / plain_p50
    stages.add(
        f"eligible_cost_b{batch}" + ("_cc" if path != "dev server" else ""),
        ratio=round(ratio, 3),
        notes=f"{ratio:.2f}x: serving_eligible p50 {1e3 * eligible_p50:.1f} ms / "
        f"serving_default {1e3 * plain_p50:.1f} ms, batch {batch}, set 0 and {EXCLUDED} "
        f"excluded ids, interleaved, {path}",
    )


def _cc_stage(stages, path, requests, rounds=3, repeat=20):
    """The C++ `LoadSavedModel` load and first run, then the eligible cost
    through `Session::Run` (XLA off, as a default server): per batch size,
    `rounds` runner processes per signature, alternating, each timing
    `repeat` runs after its first."""
    from static_keras.serving import cc_loader

    if cc_loader.compiler() is None:
        stages.add("cc_load", status="skipped", notes="no g++: the C++ loader cannot be built")
        return
    try:
        start = time.perf_counter()
        binary = cc_loader.build_runner()
        built = time.perf_counter() - start
        with PeakRss(children_rss()) as sampler:
            result = cc_loader.run_saved_model(
                path, requests.inputs["serving_default", 1], binary=binary
            )
        stages.add(
            "cc_load",
            (result.load_ms + result.run_ms) / 1e3,
            sampler.peak,
            notes=f"LoadSavedModel {result.load_ms:.0f} ms + first Run {result.run_ms:.0f} ms "
            f"(XLA off); runner build/cache lookup {built:.1f} s",
        )
        for batch in WARMUP_BATCHES:
            times = {"serving_default": [], "serving_eligible": []}
            for i in range(rounds):
                order = list(times) if i % 2 == 0 else list(times)[::-1]
                for signature in order:
                    run = cc_loader.run_saved_model(
                        path, requests.inputs[signature, batch], signature=signature,
                        binary=binary, repeat=repeat,
                    )  # fmt: skip
                    times[signature] += [ms / 1e3 for ms in run.repeat_ms]
            _eligible_cost(stages, "C++ Session::Run", batch, times["serving_default"],
                           times["serving_eligible"])  # fmt: skip
    except cc_loader.CcLoaderError as error:
        stages.add("cc_load", status="skipped", notes=f"C++ loader failed: {error}"[:300])


def _swap(stages, name, job, server, client, load, old, steady, config, allowed, subs=()):
    """Runs `job` in a fresh process under load, from the served version
    `old`; adds the swap's rows; returns the version serving afterwards.
    `allowed`: (catalogue ids, ids a restricted row may return) of the
    version the job publishes, each sorted or an `IdSet`."""
    from static_keras.serving import ServingError

    load.start()
    flowing = time.perf_counter() + 60
    while min(load.completed) < 1 and time.perf_counter() < flowing:  # load flows first
        time.sleep(0.02)
    wall = time.time()
    start = time.perf_counter()
    command = [sys.executable, os.path.abspath(__file__), *job, "--started", repr(wall)]
    status, notes, report, new = "ok", "", {}, None
    with PeakRss(lambda: rss(server.pid)) as server_peak:
        process = subprocess.run(
            command,
            capture_output=True,
            text=True,
            env=child_env(),
            cwd=common.REPO,
            timeout=config["timeout"],
        )
        job_end = time.perf_counter()
        if process.returncode != 0:
            error = [line for line in process.stderr.splitlines() if line.strip()][-1:]
            status, notes = "FAIL", f"job exited {process.returncode}: {' '.join(error)}"[:600]
        else:
            report = json.loads(process.stdout.strip().splitlines()[-1])
            new = report["version"]
            load.requests.allowed[new] = allowed
        # The new version answers; the old one is unloaded.
        unloaded, deadline = None, time.perf_counter() + config["timeout"]
        while new is not None and time.perf_counter() < deadline:
            server.check_alive()
            try:
                states = {s["version"]: s for s in client.model_status(MODEL)}
            except ServingError:
                states = {}
            if states.get(new, {}).get("state") == "END":
                status, notes = "FAIL", f"v{new} rejected: {states[new]['error']}"[:600]
                break
            gone = states.get(old, {}).get("state") in ("END", None)
            if load.first_answer(new) is not None and gone:
                unloaded = time.perf_counter()
                break
            time.sleep(0.05)
        if new is not None and unloaded is None and status == "ok":
            status, notes = "FAIL", f"v{new} never answered within {config['timeout']} s"
        if unloaded is not None:  # every thread completes requests after the unload
            seen = list(load.completed)
            while any(c < s + 2 for c, s in zip(load.completed, seen)):
                if time.perf_counter() - unloaded > 60:
                    break
                time.sleep(0.05)
    load.stop()
    time.sleep(1.0)  # let the server settle before reading its RSS
    after = rss(server.pid)
    summary, load_note = load.finish(old, new)
    if summary["failed"] or summary["unexpected_versions"] or summary["wrong_items"]:
        status = "FAIL"
    first = load.first_answer(new) if new is not None else None
    first = None if first is None else first - start
    peak = report.get("peak_rss_bytes")
    what = f"job start -> first answer by v{new}" if new else "job failed"
    stages.add(
        name, first, peak, status, f"{what}; {load_note}{'; ' + notes if notes else ''}", **summary
    )
    for sub, seconds, sub_peak, sub_notes in subs:
        stages.add(sub, seconds, sub_peak, notes=sub_notes)
    for key, label in report.get("stages", []):
        stages.add(f"{name}.{label}", report[key], notes=report.get(f"{key}_notes", ""))
    if not report:
        return old
    stages.add(
        f"{name}.job",
        report["end"] - wall,
        peak,
        notes="the job process, start to exit (peak RSS: its own); TensorFlow "
        + ("imported" if report.get("tensorflow_imported") else "not imported"),
    )
    stages.add(
        f"{name}.server_load",
        server.load_seconds(new),
        server_peak.peak,
        notes=f"v{new} loaded + warmed up (server log); RSS: server peak during the swap",
    )
    if first is not None:
        stages.add(
            f"{name}.pickup",
            first - (job_end - start),
            notes="job exit -> first answer by the new version (poll + load + warmup)",
        )
    if name in ("catalogue_change", "catalogue_delta", "catalogue_add_1000"):
        kept = report.get("eligibility_sets")
        answered = load.first_answer(new, "serving_eligible") is not None
        restricted = summary["failed"] - summary["failed_default"]
        ok = bool(kept) and answered
        stages.add(
            f"{name}.eligibility_kept",
            status="ok" if ok else "FAIL",
            notes=(
                f"v{new} holds sets {kept}, serving_eligible answered"
                if ok
                else f"replace_index dropped the eligibility sets: v{new} metadata "
                f"eligibility_sets={kept!r}, serving_eligible answered by v{new}: {answered}; "
                f"{restricted} "
                "restricted requests failed"
            ),
        )
    stages.add(
        f"{name}.server_rss_after",
        peak=after,
        notes=f"{after / max(steady, 1):.2f}x the one-version RSS "
        f"({steady / MIB:.0f} MiB), 1 s after v{old} was unloaded",
    )
    return new if unloaded is not None else old


# Jobs: what an operator's cron runs, in a fresh process -----------------------------


def job_main(args) -> None:
    """Prints one JSON line: absolute times, sub-stage seconds, peak RSS."""
    report = {"started": args.started, "stages": []}

    def timed(key, label, function, notes=""):
        start = time.perf_counter()
        value = function()
        report[key] = round(time.perf_counter() - start, 3)
        report["stages"].append((key, label))
        if notes:
            report[f"{key}_notes"] = notes
        return value

    os.environ.setdefault("KERAS_BACKEND", "tensorflow")

    def imports():
        import numpy  # noqa: F401

        import static_keras.export  # noqa: F401

        if args.job == "catalogue":  # the refresh job needs neither Keras nor TensorFlow
            import static_keras.export.refresh  # noqa: F401
            import static_keras.saving  # noqa: F401

    notes = {"refresh": "python + static_keras.export imports (NumPy only)",
             "delta": "python + static_keras.export imports (NumPy only)",
             "catalogue": "python + TensorFlow + Keras + static_keras imports"}  # fmt: skip
    timed("import_s", "job_import", imports, notes[args.job])
    import numpy as np

    from static_keras.export import read_eligibility
    from static_keras.export import read_metadata
    from static_keras.export import refresh_eligibility
    from static_keras.export.publish import newest_good_version

    if args.job == "delta":
        from static_keras.export import update_catalogue

        def read_delta():
            with np.load(args.add) as added:
                return added["semantic_ids"], added["item_ids"], np.load(args.remove)

        rows, ids, removed = timed("read_delta_s", "read_delta", read_delta)
        info = timed(
            "update_s",
            "update_catalogue",
            lambda: update_catalogue(
                args.base, add_sequences=rows, add_item_ids=ids, remove_item_ids=removed
            ),
            "the library call: read the served index and sets, apply_delta, derived tensors, "
            "patched checkpoint, read back, rename",
        )
        report["version"] = info.version
        report["eligibility_sets"] = read_metadata(info.path).get("eligibility_sets")
    elif args.job == "refresh":
        ids = timed("read_ids_s", "read_ids", lambda: np.load(args.ids))
        info = timed(
            "refresh_s",
            "refresh_eligibility",
            lambda: refresh_eligibility(args.base, {SET: ids}),
            "the library call: copy, patched checkpoint, read back, rename",
        )
        report["version"] = info.version
    else:
        from static_keras import StaticIndex
        from static_keras.export import HandedOver
        from static_keras.export import publish
        from static_keras.export import replace_index

        served_version = newest_good_version(args.base)
        newest = os.path.join(args.base, str(served_version))
        served = timed(
            "served_sets_s",
            "read_served_sets",
            lambda: read_eligibility(newest),
            "read_eligibility of the served version",
        )
        with np.load(args.feed) as feed:
            ids, items = feed["semantic_ids"], feed["item_ids"]
        index = timed(
            "index_build_s", "index_build", lambda: StaticIndex.build(ids, VOCAB, item_ids=items)
        )
        del ids, items
        # The served sets (a delta may have changed the catalogue since the
        # model was saved) carried over to the new index by item id, as
        # `static-keras publish --index` does.
        carried = timed(
            "carry_sets_s", "carry_sets", lambda: served.carried_over(index),
            "the served sets carried over to the new index by item id",
        )  # fmt: skip
        del served
        new_model = timed(
            "replace_index_s",
            "replace_index",
            lambda: replace_index(args.model, index, eligibility=carried),
            "model.keras loaded without its old index, over the new one",
        )
        # As `static-keras publish` does: the model (and the index its weights
        # share) is dropped once exported, before the check load.
        handed_over = HandedOver(new_model)
        del new_model, index, carried
        info = timed(
            "publish_s",
            "publish",
            lambda: publish(
                handed_over,
                args.base,
                based_on=served_version,  # rules published meanwhile are carried in
                warmup_batch_sizes=WARMUP_BATCHES,
                model_name=MODEL,
            ),
        )
        report["publish_s_notes"] = (
            f"export {info.export.seconds:.1f} s, then check + load + warmup in the job "
            "(the server loads it again) + rename"
        )
        report["version"] = info.version
        report["eligibility_sets"] = read_metadata(info.path).get("eligibility_sets")
    report["end"] = time.time()
    report["tensorflow_imported"] = "tensorflow" in sys.modules
    report["peak_rss_bytes"] = common.peak_rss_bytes()
    print(json.dumps(report), flush=True)


# Table, CSV, main ------------------------------------------------------------------


def format_row(row: dict) -> str:
    seconds = "" if row.get("seconds") is None else f"{row['seconds']:.3f}"
    peak = "" if row.get("peak_rss_mib") is None else f"{row['peak_rss_mib']:.0f}"
    return f"  {row['stage']:<38}{seconds:>10}{peak:>9}  {row['status']:<7} {row['notes']}"


def print_table(rows: list[dict]) -> None:
    if not rows:
        return
    print(f"\nN = {rows[0]['n']:,} ({rows[0]['ids']} item ids)")
    print(f"  {'stage':<38}{'seconds':>10}{'RSS MiB':>9}  {'status':<7} notes")
    for row in rows:
        print(format_row(row))


def parse_sizes(values) -> list[int]:
    sizes = []
    for value in values:
        sizes += [int(float(part)) for part in str(value).split(",") if part]
    return sizes


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", help="catalogue sizes, e.g. 1e5,1e6,2e7")
    parser.add_argument("--quick", action="store_true", help="N = 1e5, no C++ loader, 20 requests")
    parser.add_argument("--dense-ids", action="store_true", help="item ids 0..N-1 (not sparse)")
    parser.add_argument("--csv", help="CSV to write (default benchmarks/results/lifecycle.csv)")
    parser.add_argument("--requests", type=int, help="sequential requests per p50/p90 (50)")
    parser.add_argument("--load-threads", type=int, default=3, help="client threads (>= 3)")
    parser.add_argument(
        "--load-pause-ms",
        type=float,
        default=50.0,
        help="pause of a load thread between two requests (default 50)",
    )
    parser.add_argument("--no-cc", action="store_true", help="skip the C++ LoadSavedModel stage")
    parser.add_argument(
        "--serving-only",
        action="store_true",
        help="stop after the served latencies (no rules or catalogue change)",
    )
    parser.add_argument(
        "--headroom",
        type=float,
        default=0.1,
        help="headroom of v1's index (default 0.1; 0: no catalogue_delta stage)",
    )
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per wait")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", help="where version directories go (default: temp)")
    parser.add_argument("--keep-workdir", action="store_true")
    # Internal: one N in a child process, and the jobs.
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--job", choices=["refresh", "catalogue", "delta"], help=argparse.SUPPRESS)
    for name in ("--base", "--ids", "--model", "--feed", "--add", "--remove"):
        parser.add_argument(name, help=argparse.SUPPRESS)
    parser.add_argument("--started", type=float, help=argparse.SUPPRESS)
    return parser


def main(argv=None) -> list[dict]:
    args = build_parser().parse_args(argv)
    if args.job or args.child:
        # As the static-keras commands do: freed tensors go back to the system
        # (TensorFlow's default pool kept the 10^8 publish's 19 GB resident
        # beside the server it then starts).
        from static_keras.tensorflow_allocator import return_freed_memory

        return_freed_memory()
    if args.job:
        job_main(args)
        return []
    if args.child:
        return run_size(json.loads(args.child))
    sizes = (
        parse_sizes(args.sizes)
        if args.sizes
        else ([100_000] if args.quick else [100_000, 1_000_000, 20_000_000])
    )
    out = args.csv or (
        os.path.join(tempfile.gettempdir(), "lifecycle_quick.csv")
        if args.quick
        else os.path.join(common.RESULTS_DIR, "lifecycle.csv")
    )
    config = {
        "seed": args.seed,
        "dense_ids": args.dense_ids,
        "requests": args.requests or (20 if args.quick else 50),
        "load_threads": max(3, args.load_threads),
        "load_pause_ms": args.load_pause_ms,
        "cc": not (args.quick or args.no_cc),
        "serving_only": args.serving_only,
        "headroom": args.headroom,
        "timeout": args.timeout,
        "workdir": args.workdir,
        "keep_workdir": args.keep_workdir,
    }
    rows = []
    for n in sizes:
        print(f"N = {n:,}: running", flush=True)
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as file:
            rows_path = file.name
        try:
            child = {**config, "n": n, "rows_path": rows_path}
            command = [sys.executable, os.path.abspath(__file__), "--child", json.dumps(child)]
            code = subprocess.run(command, env=child_env(), cwd=common.REPO).returncode
            with open(rows_path) as file:
                size_rows = json.load(file) if os.path.getsize(rows_path) else []
        finally:
            os.unlink(rows_path)
        if code != 0:
            size_rows.append(
                {
                    "n": n,
                    "ids": "dense" if args.dense_ids else "sparse",
                    "stage": "run",
                    "status": "FAIL",
                    "notes": f"the N={n} process exited with {code}",
                }
            )
        print_table(size_rows)
        rows += size_rows
        common.write_csv(out, rows, COLUMNS)
    print(common.machine_line())
    print(f"wrote {out}")
    return rows


if __name__ == "__main__":
    main()
