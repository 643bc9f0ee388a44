"""Atomic version publishing under a TF Serving `model_base_path`.

TF Serving polls `model_base_path` and loads any new integer directory it
finds, so a directory copied in place would be picked up half written. Here
every version is exported into a non-numeric temporary directory beside the
versions (same filesystem), loaded and warmed up as the server will, and
renamed to its number in one step.

The newest integer version always loads. TF Serving's `latest` policy
serves nothing when the newest version fails to load (after a restart, every
request gets "Servable not found"), so before the new version becomes
visible, every version newer than the newest good one is checked, and each
rejected one (truncated variables, a failing warmup, flipped bytes) is moved
out of the integer namespace to `rejected-<version>-<UTC time>` beside the
versions, kept for inspection; TF Serving ignores non-numeric names. Its
number is never used again. Pruning (`keep`) counts only good versions, so
the newest good version is never removed; rejected versions met on the way
are moved out too. Whether a version is good is decided by loading it
(`serving.servable.load_servable`, the development server's load path) and
remembered in `.static_keras_versions.json` in the base path, keyed by the
size and modification time of every file in the version: a changed file is
checked again. Leftover temporary directories of killed publishes are
removed first (`leftovers.py`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
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

_VERSION = re.compile(r"^[1-9][0-9]*$")
_QUARANTINED = re.compile(r"^rejected-(?P<version>[1-9][0-9]*)-")
VERIFIED_FILENAME = ".static_keras_versions.json"
logger = logging.getLogger("static_keras.export")


@dataclasses.dataclass(frozen=True)
class PublishInfo:
    version: int
    path: str
    export: object  # the `ExportInfo` of `export_saved_model`
    removed_versions: tuple[int, ...]
    seconds: float
    rejected_versions: tuple[int, ...] = ()
    removed_leftovers: tuple[str, ...] = ()
    quarantined_versions: tuple[int, ...] = ()
    quarantined_paths: tuple[str, ...] = ()  # where each of `quarantined_versions` went


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


def list_quarantined(model_base_path: str | os.PathLike) -> dict[int, list[str]]:
    """`{version: [paths]}` of rejected versions moved out of the integer namespace."""
    base = os.fspath(model_base_path)
    moved: dict[int, list[str]] = {}
    for name in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        match = _QUARANTINED.match(name)
        if match and os.path.isdir(os.path.join(base, name)):
            moved.setdefault(int(match["version"]), []).append(os.path.join(base, name))
    return moved


def newest_good_version(model_base_path: str | os.PathLike, *, xla: bool = False) -> int | None:
    """The newest version under `model_base_path` that loads and warms up, or None.

    Versions are checked from the newest down as `publish` checks them (a
    version exported with XLA is checked with XLA on), reading and updating
    the verdicts cached in `.static_keras_versions.json`, so a known-good
    version is not loaded again. Nothing is moved: the rejected versions
    newer than the one returned stay where they are until the next publish.

    Args:
        model_base_path: the directory TF Serving polls.
        xla: bool. Check every version with XLA enabled, as a server started
            with `--xla_cpu_compilation_enabled` loads it. Defaults to False.

    Returns:
        The version number; None when there is none or none loads.
    """
    base = os.fspath(model_base_path)
    if not list_versions(base):
        return None
    record = _read_record(base)
    good, _ = _walk(base, record, xla, 1)
    _write_record(base, record)
    return good[0] if good else None


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
        version: int or None. The version number; defaults to one above
            every version on disk or moved out as rejected. An existing
            version is never overwritten, a rejected one's number never
            reused.
        keep: int or None. Good versions kept after publishing: the newest
            `keep` versions that load and warm up (the new one included);
            older ones are removed. Rejected versions never count, so the
            newest good version always stays. None keeps all (the versions
            newer than the newest good one are still checked). Defaults to 3.
        xla: bool. Export jit-compiled functions (see `export_saved_model`).
        check: bool. Run `check_saved_model` on the export, then load it and
            replay its warmup records as the server will, before it becomes
            visible. Defaults to True.
        stale_after_seconds: float. Leftover temporary directories of other
            hosts (or without an owner) are removed after this long without
            a change; those of dead processes on this host at once. Defaults
            to one day.
        **export_kwargs: passed on to `export_saved_model`.

    Every version newer than the newest good one, and with `keep` every
    rejected version among those kept, is moved to
    `rejected-<version>-<UTC time>` in `model_base_path` and logged at
    WARNING, before the new version becomes visible: TF Serving and the
    development server always find a newest version that loads.

    Returns:
        `PublishInfo`: `version`, `path`, `export`, `removed_versions`,
        `rejected_versions` (the versions found not to load),
        `quarantined_versions` and `quarantined_paths` (those moved out, and
        where to), `removed_leftovers`, `seconds`.
    """
    # TensorFlow is imported here: refreshes and version checks publish without it.
    from static_keras.export.saved_model import export_saved_model

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
        quarantined_versions=staged.quarantined_versions,
        quarantined_paths=staged.quarantined_paths,
    )


def new_version(base: str, existing: list[int], version, keep) -> int:
    """The version to write (default: one above every version ever seen,
    rejected ones moved out included), checked with `keep`: a positive int
    that no existing or rejected directory has (numbers are never reused)."""
    moved = list_quarantined(base)
    if version is None:
        version = max([*existing, *moved, 0]) + 1
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"`version` must be a positive integer. Received: version={version!r}")
    if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
        raise ValueError(f"`keep` must be a positive integer or None. Received: keep={keep!r}")
    target = os.path.join(base, str(version))
    if os.path.exists(target):
        raise ValueError(f"Version {version} already exists at {target!r}; versions are immutable")
    if version in moved:
        raise ValueError(
            f"Received version={version}, but version {version} was rejected and moved to "
            f"{moved[version][0]!r}; version numbers are never reused"
        )
    return version


@dataclasses.dataclass(frozen=True)
class StagedVersion:
    path: str
    written: object  # what `write` returned
    removed_versions: tuple[int, ...]
    rejected_versions: tuple[int, ...]
    removed_leftovers: tuple[str, ...]
    quarantined_versions: tuple[int, ...] = ()
    quarantined_paths: tuple[str, ...] = ()


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
    verified: bool = False,
) -> StagedVersion:
    """Makes `version` visible in one rename, after `write(staging)` filled a
    temporary directory beside the versions and (with `check`) it loaded and
    warmed up as the server will; then prunes to `keep` good versions.
    `verified`: `write` checked the version itself (an eligibility refresh:
    a good version's graph and tensors with new set values, read back), so
    it is recorded as good without a load here; the server's load is the
    only one.

    First, every version newer than the newest good one is moved out of the
    integer namespace (`rejected-<version>-<UTC time>`), so the newest
    version loads even if this publish fails; pruning moves out the rejected
    versions it meets too. `what` names the version in the error when it
    does not load."""
    leftovers = remove_leftovers(base, stale_after_seconds=stale_after_seconds)
    for name in leftovers:
        logger.info("removed %s: left over by a publish that did not finish", name)

    record = _read_record(base)
    _, rejected = _walk(base, record, xla, 1)
    moved = _quarantine(base, rejected, record)
    _write_record(base, record)

    target = os.path.join(base, str(version))
    staging = os.path.join(base, temporary_prefix(str(version)) + uuid.uuid4().hex)
    try:
        written = write(staging)
        if check and not verified:
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

    removed = []
    if check or verified:
        record[version] = {"fingerprint": fingerprint, "error": "", "xla": xla}
    if keep is not None:
        good, rejected_now = _walk(base, record, xla, keep)
        moved.update(_quarantine(base, rejected_now, record))
        rejected += rejected_now
        if len(good) == keep:
            removed = [v for v in list_versions(base) if v < good[-1] and v != version]
        for old in removed:
            shutil.rmtree(os.path.join(base, str(old)))
    _write_record(base, record)
    return StagedVersion(
        target,
        written,
        tuple(removed),
        tuple(sorted(rejected)),
        tuple(leftovers),
        tuple(sorted(moved)),
        tuple(moved[v] for v in sorted(moved)),
    )


def _read_record(base: str) -> dict[int, dict]:
    try:
        with open(os.path.join(base, VERIFIED_FILENAME)) as file:
            return {int(k): v for k, v in json.load(file).items()}
    except (OSError, ValueError, AttributeError):
        return {}  # missing or unreadable: versions are checked again


def _write_record(base: str, record: dict[int, dict]) -> None:
    """Stores the verdicts of the versions present (atomically; a cache: an
    unwritable base path only means versions are checked again)."""
    present = set(list_versions(base))
    kept = {v: e for v, e in sorted(record.items()) if v in present}
    if kept == _read_record(base):
        return  # unchanged (or nothing to record in an empty base path)
    kept = {str(v): e for v, e in kept.items()}
    temporary = os.path.join(base, temporary_prefix("record") + uuid.uuid4().hex)
    try:
        with open(temporary, "w") as file:
            json.dump(kept, file, indent=1)
        os.replace(temporary, os.path.join(base, VERIFIED_FILENAME))
    except OSError as error:
        logger.warning("could not write %s in %s: %s", VERIFIED_FILENAME, base, error)
        with contextlib.suppress(OSError):
            os.remove(temporary)


def _walk(base: str, record: dict[int, dict], xla: bool, wanted: int):
    """`(good, rejected)`: versions from the newest down until `wanted` good ones."""
    good, rejected = [], []
    for version in reversed(list_versions(base)):
        if len(good) == wanted:
            break
        (rejected if _verdict(base, version, record, xla) else good).append(version)
    return good, rejected


def _verdict(base: str, version: int, record: dict[int, dict], xla: bool) -> str:
    """Why the server rejects `version` ("" when it loads), from `record` when
    the version's files did not change; a fresh verdict is stored there."""
    path = os.path.join(base, str(version))
    # A version exported with XLA is for a server started with XLA on.
    xla = xla or _exported_with_xla(path)
    fingerprint = _fingerprint(path)
    entry = record.get(version)
    if entry is None or entry.get("fingerprint") != fingerprint or entry.get("xla", xla) != xla:
        entry = {"fingerprint": fingerprint, "error": _load_error(path, version, xla), "xla": xla}
        record[version] = entry
    return entry["error"]


def _exported_with_xla(path: str) -> bool:
    from static_keras.export.metadata import read_metadata

    try:
        return bool(read_metadata(path).get("xla"))
    except Exception:  # no or unreadable metadata: the version is checked as it is
        return False


def _quarantine(base: str, versions: list[int], record: dict[int, dict]) -> dict[int, str]:
    """Moves rejected `versions` out of the integer namespace; `{version: new path}`."""
    moved = {}
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    for version in versions:
        name = f"rejected-{version}-{stamp}"
        for attempt in itertools.count(2):
            if not os.path.exists(os.path.join(base, name)):
                break
            name = f"rejected-{version}-{stamp}-{attempt}"
        error = record.get(version, {}).get("error", "")
        try:
            os.rename(os.path.join(base, str(version)), os.path.join(base, name))
        except OSError as rename_error:
            logger.error(
                "version %d does not load (%s) and could not be moved out: %s; TF Serving's "
                "latest policy serves nothing while it is the newest version",
                version, error, rename_error,
            )  # fmt: skip
            continue
        moved[version] = os.path.join(base, name)
        logger.warning(
            "version %d does not load or warm up (%s): moved to %s, out of the versions "
            "TF Serving sees", version, error, name,
        )  # fmt: skip
    if moved:
        _fsync_dir(base)
    return moved


def _load_error(path: str, version: int, xla: bool) -> str:
    """Why the server would reject the version at `path` ("" when it loads and warms up)."""
    # The development server's load path; imported here because serving
    # depends on export, not the other way round.
    from static_keras.serving.servable import load_servable
    from static_keras.serving.servable import release_memory

    message = ""
    try:
        load_servable(path, version, xla_enabled=xla)
    except Exception as error:  # any load or warmup failure is a rejection
        message = f"{type(error).__name__}: {error}".strip()
    release_memory()  # the loaded (or half-loaded) version, at 2x10^7 items GBs
    return message


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
