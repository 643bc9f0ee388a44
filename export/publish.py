"""Atomic version publishing under a TF Serving `model_base_path`.

TF Serving polls `model_base_path` and loads any new integer directory it
finds, so a directory copied in place would be picked up half written. Here
every version is exported into a non-numeric temporary directory beside the
versions (same filesystem) and renamed to its number in one step.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import time
import uuid

from static_keras.export.check import check_saved_model
from static_keras.export.saved_model import ExportInfo
from static_keras.export.saved_model import export_saved_model

_VERSION = re.compile(r"^[1-9][0-9]*$")


@dataclasses.dataclass(frozen=True)
class PublishInfo:
    version: int
    path: str
    export: ExportInfo
    removed_versions: tuple[int, ...]
    seconds: float


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
        keep: int or None. Versions kept after publishing (the newest ones,
            the new version included); None keeps all. Defaults to 3.
        xla: bool. Export jit-compiled functions (see `export_saved_model`).
        check: bool. Run `check_saved_model` on the export before it becomes
            visible. Defaults to True.
        **export_kwargs: passed on to `export_saved_model`.

    Returns:
        `PublishInfo`.
    """
    start = time.perf_counter()
    base = os.fspath(model_base_path)
    os.makedirs(base, exist_ok=True)
    existing = list_versions(base)
    if version is None:
        version = (existing[-1] + 1) if existing else 1
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"`version` must be a positive integer. Received: version={version!r}")
    if keep is not None and (not isinstance(keep, int) or keep < 1):
        raise ValueError(f"`keep` must be a positive integer or None. Received: keep={keep!r}")
    target = os.path.join(base, str(version))
    if os.path.exists(target):
        raise ValueError(f"Version {version} already exists at {target!r}; versions are immutable")

    staging = os.path.join(base, f".tmp-{version}-{uuid.uuid4().hex}")
    try:
        info = export_saved_model(model, staging, xla=xla, **export_kwargs)
        if check:
            check_saved_model(staging, xla_enabled=xla)
        _fsync_tree(staging)
        os.rename(staging, target)  # atomic on one filesystem; fails if target exists
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    _fsync_dir(base)

    removed = []
    if keep is not None:
        for old in list_versions(base)[:-keep]:
            shutil.rmtree(os.path.join(base, str(old)))
            removed.append(old)
    info = dataclasses.replace(info, path=target)
    return PublishInfo(
        version=version,
        path=target,
        export=info,
        removed_versions=tuple(removed),
        seconds=time.perf_counter() - start,
    )


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
