"""Atomic version publishing under a TF Serving `model_base_path`.

TF Serving polls `model_base_path` and loads any new integer directory it
finds, so a directory copied in place would be picked up half written. Here
every version is exported into a non-numeric temporary directory beside the
versions (same filesystem), loaded and warmed up as the server will, and
renamed to its number in one step.

Pruning (`keep`) counts only versions that load and warm up: a version the
server rejects (truncated variables, failing warmup, flipped bytes) is never
one of the kept, so the newest good version is never removed. Whether a
version is good is decided by loading it (`serving.servable.load_servable`,
the development server's load path) and remembered in
`.static_keras_versions.json` in the base path, keyed by the size and
modification time of every file in the version: a changed file is checked
again. Leftover temporary directories of killed publishes are removed first
(`leftovers.py`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import shutil
import time
import uuid

from static_keras.export.check import check_saved_model
from static_keras.export.leftovers import DEFAULT_STALE_AFTER_SECONDS
from static_keras.export.leftovers import remove_leftovers
from static_keras.export.leftovers import temporary_prefix
from static_keras.export.saved_model import ExportInfo
from static_keras.export.saved_model import export_saved_model

_VERSION = re.compile(r"^[1-9][0-9]*$")
VERIFIED_FILENAME = ".static_keras_versions.json"
logger = logging.getLogger("static_keras.export")


@dataclasses.dataclass(frozen=True)
class PublishInfo:
    version: int
    path: str
    export: ExportInfo
    removed_versions: tuple[int, ...]
    seconds: float
    rejected_versions: tuple[int, ...] = ()
    removed_leftovers: tuple[str, ...] = ()


def list_versions(model_base_path: str | os.PathLike) -> list[int]:
    """Integer version directories, ascending (temporary dirs are ignored)."""
    base = os.fspath(model_base_path)
    if not os.path.isdir(base):
        return []
    return sorted(
        int(name)
        for name in os.listdir(base)
        if _VERSION.match(name) and os.path.isdir(os.path.join(base, name))
    )


def publish(
    model,
    model_base_path: str | os.PathLike,
    *,
    version: int | None = None,
    keep: int | None = 3,
    xla: bool = False,
    check: bool = True,
    stale_after_seconds: float = DEFAULT_STALE_AFTER_SECONDS,
    **export_kwargs,
) -> PublishInfo:
    """Exports `model` as a new version under `model_base_path`, atomically.

    Args:
        model: the functional Keras model to export (see
            `export_saved_model`). An index-only refresh is the same decoder
            wrapped in a `ConstrainedBeamSearch` over the new index.
        model_base_path: the directory TF Serving polls.
        version: int or None. The version number; defaults to the newest
            existing version + 1. An existing version is never overwritten.
        keep: int or None. Good versions kept after publishing: the newest
            `keep` versions that load and warm up (the new one included),
            plus every newer version that does not (kept for inspection);
            older ones are removed. Rejected versions never count, so the
            newest good version always stays. None keeps all. Defaults to 3.
        xla: bool. Export jit-compiled functions (see `export_saved_model`).
        check: bool. Run `check_saved_model` on the export, then load it and
            replay its warmup records as the server will, before it becomes
            visible. Defaults to True.
        stale_after_seconds: float. Leftover temporary directories of other
            hosts (or without an owner) are removed after this long without
            a change; those of dead processes on this host at once. Defaults
            to one day.
        **export_kwargs: passed on to `export_saved_model`.

    Returns:
        `PublishInfo`.
    """
    start = time.perf_counter()
    base = os.fspath(model_base_path)
    os.makedirs(base, exist_ok=True)
    existing = list_versions(base)
    version = new_version(base, existing, version, keep)
    staged = publish_staged(
        base,
        version,
        lambda staging: export_saved_model(model, staging, xla=xla, **export_kwargs),
        keep=keep,
        xla=xla,
        check=check,
        stale_after_seconds=stale_after_seconds,
        what="The export",
    )
    return PublishInfo(
        version=version,
        path=staged.path,
        export=dataclasses.replace(staged.written, path=staged.path),
        removed_versions=staged.removed_versions,
        seconds=time.perf_counter() - start,
        rejected_versions=staged.rejected_versions,
        removed_leftovers=staged.removed_leftovers,
    )


def new_version(base: str, existing: list[int], version, keep) -> int:
    """The version to write (default: newest + 1), checked with `keep`: a
    positive int that no existing directory has (versions are immutable)."""
    if version is None:
        version = (existing[-1] + 1) if existing else 1
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"`version` must be a positive integer. Received: version={version!r}")
    if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
        raise ValueError(f"`keep` must be a positive integer or None. Received: keep={keep!r}")
    target = os.path.join(base, str(version))
    if os.path.exists(target):
        raise ValueError(f"Version {version} already exists at {target!r}; versions are immutable")
    return version


@dataclasses.dataclass(frozen=True)
class StagedVersion:
    path: str
    written: object  # what `write` returned
    removed_versions: tuple[int, ...]
    rejected_versions: tuple[int, ...]
    removed_leftovers: tuple[str, ...]


def publish_staged(
    base: str,
    version: int,
    write,
    *,
    keep: int | None,
    xla: bool,
    check: bool,
    stale_after_seconds: float,
    what: str,
) -> StagedVersion:
    """Makes `version` visible in one rename, after `write(staging)` filled a
    temporary directory beside the versions and (with `check`) it loaded and
    warmed up as the server will; then prunes to `keep` good versions.
    `what` names the version in the error when it does not load."""
    leftovers = remove_leftovers(base, stale_after_seconds=stale_after_seconds)
    for name in leftovers:
        logger.info("removed %s: left over by a publish that did not finish", name)

    target = os.path.join(base, str(version))
    staging = os.path.join(base, temporary_prefix(str(version)) + uuid.uuid4().hex)
    try:
        written = write(staging)
        if check:
            check_saved_model(staging, xla_enabled=xla)
            error = _load_error(staging, version, xla)
            if error:
                raise ValueError(f"{what} fails to load or warm up as a server would: {error}")
        fingerprint = _fingerprint(staging)
        _fsync_tree(staging)
        os.rename(staging, target)  # atomic on one filesystem; fails if target exists
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    _fsync_dir(base)

    removed, rejected = [], []
    if keep is not None:
        removed, rejected = _prune(base, keep, xla, {version: fingerprint} if check else {})
    return StagedVersion(target, written, tuple(removed), tuple(rejected), tuple(leftovers))


def _prune(base: str, keep: int, xla: bool, known_good: dict[int, str]):
    """Removes versions older than the `keep`-th newest good one."""
    record_path = os.path.join(base, VERIFIED_FILENAME)
    try:
        with open(record_path) as file:
            record = {int(k): v for k, v in json.load(file).items()}
    except (OSError, ValueError, AttributeError):
        record = {}  # missing or unreadable: versions are checked again
    record.update({v: {"fingerprint": f, "error": ""} for v, f in known_good.items()})
    versions = list_versions(base)
    good, rejected, cut = 0, [], None
    for position in range(len(versions) - 1, -1, -1):
        version = versions[position]
        path = os.path.join(base, str(version))
        fingerprint = _fingerprint(path)
        entry = record.get(version)
        if entry is None or entry.get("fingerprint") != fingerprint:
            entry = {"fingerprint": fingerprint, "error": _load_error(path, version, xla)}
            record[version] = entry
        if entry["error"]:
            rejected.append(version)
            continue
        good += 1
        if good == keep:
            cut = position
            break
    removed = versions[:cut] if cut is not None else []
    for old in removed:
        shutil.rmtree(os.path.join(base, str(old)))
        record.pop(old, None)
    present = set(list_versions(base))
    record = {str(v): e for v, e in sorted(record.items()) if v in present}
    temporary = os.path.join(base, temporary_prefix("record") + uuid.uuid4().hex)
    with open(temporary, "w") as file:
        json.dump(record, file, indent=1)
    os.replace(temporary, record_path)
    for version in rejected:
        logger.warning("version %d does not load or warm up; it is not counted in keep", version)
    return removed, sorted(rejected)


def _load_error(path: str, version: int, xla: bool) -> str:
    """Why the server would reject the version at `path` ("" when it loads and warms up)."""
    # The development server's load path; imported here because serving
    # depends on export, not the other way round.
    from static_keras.serving.servable import load_servable

    try:
        load_servable(path, version, xla_enabled=xla)
    except Exception as error:  # any load or warmup failure is a rejection
        return f"{type(error).__name__}: {error}".strip()
    return ""


def _fingerprint(path: str) -> str:
    """Size and modification time of every file: a changed file changes it."""
    entries = []
    for folder, _, files in os.walk(path):
        for name in files:
            full = os.path.join(folder, name)
            stat = os.stat(full)
            entries.append(f"{os.path.relpath(full, path)}:{stat.st_size}:{stat.st_mtime_ns}")
    return hashlib.sha256("\n".join(sorted(entries)).encode()).hexdigest()


def _fsync_tree(root: str) -> None:
    for folder, _, files in os.walk(root):
        for name in files:
            with open(os.path.join(folder, name), "rb") as file:
                os.fsync(file.fileno())
        _fsync_dir(folder)


def _fsync_dir(folder: str) -> None:
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
