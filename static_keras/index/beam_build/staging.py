"""The staging folder of a Beam build: what workers write, what the launcher reads.

Workers stage each partition's tail (`part-<key>.npz`), a marker per file
read (`read-<file>.npy`: its row count, then its keys), the partitions'
summaries and the bad rows (`summaries.npz`, `errors.json`); the launcher
checks them (every row read is in a partition), raises the first bad
row's error, reports progress from the markers while the pipeline runs
(`Watcher`) and removes the folder. Any Beam filesystem.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
import threading
import uuid

import numpy as np
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import GoogleCloudOptions
from apache_beam.options.pipeline_options import PipelineOptions

from static_keras.index.beam_build import partitions


class PipelineFailed(RuntimeError):
    """The Beam pipeline did not finish; no index was written."""


def make_staging(temp_location, options: PipelineOptions, out: str) -> str:
    temp_location = temp_location or options.view_as(GoogleCloudOptions).temp_location
    if temp_location:
        staging = FileSystems.join(temp_location, f"static-keras-{uuid.uuid4().hex}")
        FileSystems.mkdirs(staging)
        return staging
    directory = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"No directory {directory!r} to write {out!r} into")
    return tempfile.mkdtemp(prefix=".static-keras-beam-", dir=directory)


def part_path(staging: str, key) -> str:
    return FileSystems.join(staging, f"part-{int(key):019d}.npz")


def write_summaries(summaries, staging: str) -> None:
    summaries = sorted(summaries, key=lambda s: s[0])
    keys = np.array([s[0] for s in summaries], dtype=np.int64)
    counts = np.array([s[1] for s in summaries], dtype=np.int64)
    widths = np.array([s[2] for s in summaries], dtype=np.int64)
    rows = np.array([s[3] for s in summaries], dtype=np.int64)
    arrays = {"keys": keys, "counts": counts, "widths": widths, "rows": rows}
    write_bytes(FileSystems.join(staging, "summaries.npz"), partitions.to_bytes(arrays))


def write_errors(errors, staging: str) -> None:
    text = json.dumps(sorted(errors))
    write_bytes(FileSystems.join(staging, "errors.json"), text.encode())


def raise_first_error(staging: str) -> None:
    """ValueError of the first bad file (in path order), else of the first partition."""
    with FileSystems.open(FileSystems.join(staging, "errors.json")) as file:
        errors = json.loads(file.read().decode())
    if not errors:
        return
    kind, _, message = errors[0]
    others = sum(1 for e in errors if e[0] == kind) - 1
    if others:
        message += f" ({others} more {'files' if kind == 0 else 'partitions'} failed likewise)"
    raise ValueError(message)


def read_summaries(staging: str, num_files: int, length: int):
    with FileSystems.open(FileSystems.join(staging, "summaries.npz")) as file:
        summary = partitions.from_bytes(file.read())
    read = sum(int(read_npy(path)[0]) for path in list_paths(FileSystems.join(staging, "read-*")))
    built = int(summary["rows"].sum())
    if read != built:  # a runner that lost or repeated work
        raise PipelineFailed(
            f"The Beam pipeline read {read} rows but its partitions hold {built}; "
            "no index was written"
        )
    if summary["keys"].size == 0:
        raise ValueError(
            "`sequences` is empty: the valid set needs at least one sequence of at "
            f"least one token. Received 0 rows in {num_files} files"
        )
    return summary["keys"], summary["counts"].reshape(-1, length + 1), summary["widths"]


def list_paths(pattern: str) -> list[str]:
    try:
        return [m.path for m in FileSystems.match([pattern])[0].metadata_list]
    except Exception:  # a folder being written or removed: try again later
        return []


def remove(staging: str) -> None:
    paths = list_paths(FileSystems.join(staging, "*"))
    try:
        if paths:
            FileSystems.delete(paths)
        FileSystems.delete([staging])
    except Exception:  # nothing left to delete, or a filesystem without folders
        pass


def write_bytes(path: str, data: bytes) -> None:
    with FileSystems.create(path) as file:
        file.write(data)


def read_npy(path: str) -> np.ndarray:
    with FileSystems.open(path) as file:
        return np.load(io.BytesIO(file.read()), allow_pickle=False)


def npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


class Watcher:
    """Reports progress from the markers workers leave in the staging folder."""

    def __init__(self, plan, num_files: int, report, interval: float = 0.5):
        self.plan, self.num_files, self.report = plan, num_files, report
        self.interval = interval
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.keys: dict[str, np.ndarray] = {}

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        if exc[0] is None:
            self._poll()

    def _loop(self):
        while not self.stop.wait(self.interval):
            self._poll()

    def _poll(self):
        staging = self.plan.staging
        read = list_paths(FileSystems.join(staging, "read-*"))
        if len(read) < self.num_files:
            self.report(
                f"reading {len(read)}/{self.num_files} files", 0.4 * len(read) / self.num_files
            )
            return
        for path in read:
            if path not in self.keys:
                try:
                    self.keys[path] = read_npy(path)[1:]
                except Exception:  # still being written
                    return
        total = len(np.unique(np.concatenate(list(self.keys.values()))))
        built = len(list_paths(FileSystems.join(staging, "part-*")))
        self.report(f"partitions {built}/{total}", 0.4 + 0.4 * built / max(total, 1))
