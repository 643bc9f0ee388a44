"""Which versions under a base path load, remembered; rejected ones moved out.

TF Serving's `latest` policy serves nothing when the newest version fails to
load, so publishing jobs check the versions newer than the newest good one
(`serving.servable.load_servable`, the development server's load path) and
move each rejected one out of the integer namespace to
`rejected-<version>-<UTC time>` (kept for inspection; TF Serving ignores
non-numeric names; its number is never used again).

Verdicts are remembered in `.static_keras_versions.json` in the base path,
keyed by the size and modification time of every file in the version: a
changed file is checked again. Jobs overlap, so the record is merged into
what is on disk under the publishing lock (a verdict another job wrote is
never lost, and never paid for twice), and a version that another job's
pruning removes while it is looked at is skipped, not an error.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import logging
import os
import re
import time
import uuid

from static_keras.export.leftovers import temporary_prefix
from static_keras.export.version_lock import version_lock
from static_keras.serving.versions import list_versions

_QUARANTINED = re.compile(r"^rejected-(?P<version>[1-9][0-9]*)-")
VERIFIED_FILENAME = ".static_keras_versions.json"
logger = logging.getLogger("static_keras.export")


def list_quarantined(model_base_path: str | os.PathLike) -> dict[int, list[str]]:
    """`{version: [paths]}` of rejected versions moved out of the integer namespace."""
    base = os.fspath(model_base_path)
    moved: dict[int, list[str]] = {}
    for name in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        match = _QUARANTINED.match(name)
        if match and os.path.isdir(os.path.join(base, name)):
            moved.setdefault(int(match["version"]), []).append(os.path.join(base, name))
    return moved


def read_record(base: str) -> dict[int, dict]:
    try:
        with open(os.path.join(base, VERIFIED_FILENAME)) as file:
            return {int(k): v for k, v in json.load(file).items()}
    except (OSError, ValueError, AttributeError):
        return {}  # missing or unreadable: versions are checked again


def write_record(
    base: str, record: dict[int, dict], *, locked: bool = False, also: tuple[int, ...] = ()
) -> None:
    """Merges `record` into the stored verdicts of the versions present and
    `also` (a version about to be renamed into place), atomically, under the
    publishing lock unless the caller holds it (`locked`). A cache: an
    unwritable base path only means versions are checked again."""
    if not also and _merged(base, record, set()) == read_record(base):
        return  # nothing new: no lock taken
    try:
        with contextlib.nullcontext() if locked else version_lock(base):
            _merge_record(base, record, set(also))
    except (OSError, ValueError) as error:
        logger.warning("could not write %s in %s: %s", VERIFIED_FILENAME, base, error)


def _merged(base: str, record: dict[int, dict], also: set[int]) -> dict[int, dict]:
    present = set(list_versions(base)) | also
    stored = read_record(base)
    return {v: e for v, e in sorted({**stored, **record}.items()) if v in present}


def _merge_record(base: str, record: dict[int, dict], also: set[int]) -> None:
    stored = read_record(base)
    merged = _merged(base, record, also)
    if merged == stored:
        return  # unchanged (or nothing to record in an empty base path)
    temporary = os.path.join(base, temporary_prefix("record") + uuid.uuid4().hex)
    try:
        with open(temporary, "w") as file:
            json.dump({str(v): e for v, e in merged.items()}, file, indent=1)
        os.replace(temporary, os.path.join(base, VERIFIED_FILENAME))
    finally:
        with contextlib.suppress(OSError):
            os.remove(temporary)


def walk(base: str, record: dict[int, dict], xla: bool, wanted: int):
    """`(good, rejected)`: versions from the newest down until `wanted` good
    ones (versions removed meanwhile by another job are skipped)."""
    good, rejected = [], []
    for version in reversed(list_versions(base)):
        if len(good) == wanted:
            break
        try:
            error = _verdict(base, version, record, xla)
        except FileNotFoundError:
            continue  # pruned by another job while we looked
        (rejected if error else good).append(version)
    return good, rejected


def _verdict(base: str, version: int, record: dict[int, dict], xla: bool) -> str:
    """Why the server rejects `version` ("" when it loads), from `record`
    (or, for a version published since it was read, the record on disk)
    when the version's files did not change; a fresh verdict is stored."""
    path = os.path.join(base, str(version))
    # A version exported with XLA is for a server started with XLA on.
    xla = xla or _exported_with_xla(path)
    fingerprint = version_fingerprint(path)
    for entry in (record.get(version), read_record(base).get(version)):
        if entry and entry.get("fingerprint") == fingerprint and entry.get("xla", xla) == xla:
            record[version] = entry
            return entry["error"]
    error = load_error(path, version, xla)
    if not os.path.isdir(path):
        raise FileNotFoundError(path)  # removed while it loaded: no verdict
    record[version] = {"fingerprint": fingerprint, "error": error, "xla": xla}
    return error


def _exported_with_xla(path: str) -> bool:
    from static_keras.export.metadata import read_metadata

    try:
        return bool(read_metadata(path).get("xla"))
    except Exception:  # no or unreadable metadata: the version is checked as it is
        return False


def quarantine(base: str, versions: list[int], record: dict[int, dict]) -> dict[int, str]:
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
        except FileNotFoundError:
            continue  # another job moved it out first
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
        fsync_dir(base)
    return moved


def load_error(path: str, version: int, xla: bool) -> str:
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


def version_fingerprint(path: str) -> str:
    """Size and modification time of every file: a changed file changes it.
    FileNotFoundError when the version is gone."""
    if not os.path.isdir(path):
        raise FileNotFoundError(path)
    entries = []
    for folder, _, files in os.walk(path):
        for name in files:
            full = os.path.join(folder, name)
            stat = os.stat(full)
            entries.append(f"{os.path.relpath(full, path)}:{stat.st_size}:{stat.st_mtime_ns}")
    return hashlib.sha256("\n".join(sorted(entries)).encode()).hexdigest()


def fsync_dir(folder: str) -> None:
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
