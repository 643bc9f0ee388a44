"""The one publishing rule: stage a version, then take its number and rename under a lock.

TF Serving polls `model_base_path` and loads any new integer directory it
finds, so a directory copied in place would be picked up half written. Every
path that writes a version (a model's `publish`, an index swap, a rules
refresh, a catalogue delta) stages it in a non-numeric temporary directory
beside the versions (same filesystem), has it loaded and warmed up as the
server will, and renames it to its number in one step: `publish_staged`.

The version that becomes visible contains every change already published.
Jobs overlap (the daily catalogue job outlasts several minute-level rules
jobs), so the version number is taken at the rename, in a critical section
of milliseconds (`version_lock`); a job that finds a version newer than the
one it read rebases onto it out of the lock (its `rebase`: `rebase.py` for
the sets) and tries again, or refuses in one line (`PublishConflict`) where
it cannot.

The newest integer version always loads: before the new version becomes
visible, every version newer than the newest good one is checked and each
rejected one is moved out of the integer namespace (`version_checks.py`).
Pruning (`keep`) counts only good versions, so the newest good version is
never removed. Leftover temporary directories of killed jobs are removed
first (`leftovers.py`). A publishing path supplies its `write` and its
`rebase` and gets all of this; it imports nothing of the others.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import uuid

from static_keras.export import version_checks
from static_keras.export.leftovers import remove_leftovers
from static_keras.export.leftovers import temporary_prefix
from static_keras.export.version_checks import fsync_dir
from static_keras.export.version_checks import list_quarantined
from static_keras.export.version_checks import quarantine
from static_keras.export.version_checks import read_record
from static_keras.export.version_checks import version_fingerprint
from static_keras.export.version_checks import walk
from static_keras.export.version_checks import write_record
from static_keras.export.version_lock import PublishConflict
from static_keras.export.version_lock import check_base_path
from static_keras.export.version_lock import version_lock
from static_keras.progress import stage
from static_keras.serving.saved_model_check import check_saved_model
from static_keras.serving.versions import list_versions

#: Rebases a job does out of the lock; the next one holds it (no job starves).
OPTIMISTIC_REBASES = 2
logger = logging.getLogger("static_keras.export")


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
    record = read_record(base)
    good, _ = walk(base, record, xla, 1)
    write_record(base, record)
    return good[0] if good else None


def source_version_for(base: str, source_version, version, keep, why: str) -> tuple[int, list]:
    """`(source version, versions listed)` of a job that changes a published
    version (a rules refresh, a catalogue delta): the one given, or the
    newest that loads (`why`: what the job needs it for, for the error).
    ValueError for a missing one and for bad `version`/`keep`, before any
    work."""
    check_base_path(base)
    existing = list_versions(base)
    if not existing:
        raise ValueError(f"No versions under {base!r} to {why}")
    given = source_version is not None
    if not given:
        source_version = newest_good_version(base)
        if source_version is None:
            raise ValueError(
                f"No version under {base!r} loads (versions: {existing}): publish a good "
                f"version before you {why}"
            )
    if source_version not in existing and not given:
        existing = list_versions(base)  # published since we listed
    if source_version not in existing:
        raise ValueError(f"No version {source_version} under {base!r} (versions: {existing})")
    check_version_arguments(base, version, keep)
    return source_version, existing


@contextlib.contextmanager
def removed_source_is_a_conflict(source: str, version: int):
    """A job reading or copying version `source` that finds it removed (by
    another job with a small `keep`) ends in one line, not a traceback."""
    try:
        yield
    except FileNotFoundError:
        if os.path.isdir(source):
            raise
        raise PublishConflict(
            f"version {version} was removed while this job read it (by a job with a small "
            "keep): nothing was published; rerun the job"
        ) from None


def check_version_arguments(base: str, version, keep) -> None:
    """Jobs call it at their start, so bad `version`/`keep` fail before any
    work: a positive int (or None) for each, and a `version` given that no
    existing or rejected directory has. The default number is not taken
    here: another job may publish it while this one works, which is no
    error (the number is taken under the lock, `new_version`)."""
    if version is not None:
        new_version(base, list_versions(base), version, keep)
    else:
        _check_keep(keep)


def _check_keep(keep) -> None:
    if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
        raise ValueError(f"`keep` must be a positive integer or None. Received: keep={keep!r}")


def new_version(base: str, existing: list[int], version, keep) -> int:
    """The version a job takes (the caller holds the lock; default: one
    above every version ever seen, rejected ones moved out included),
    checked with `keep`: a positive int that no existing or rejected
    directory has (numbers are never reused)."""
    moved = list_quarantined(base)
    if version is None:
        version = max([*existing, *moved, 0]) + 1
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"`version` must be a positive integer. Received: version={version!r}")
    _check_keep(keep)
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
    version: int
    path: str
    written: object  # what `write` returned
    removed_versions: tuple[int, ...]
    rejected_versions: tuple[int, ...]
    removed_leftovers: tuple[str, ...]
    quarantined_versions: tuple[int, ...] = ()
    quarantined_paths: tuple[str, ...] = ()
    rebased_onto: tuple[int, ...] = ()  # versions published while the job ran


def publish_staged(
    base: str,
    write,
    *,
    read_version: int | None,
    rebase,
    version: int | None = None,
    keep: int | None,
    xla: bool,
    check: bool,
    stale_after_seconds: float,
    what: str,
    verified: bool = False,
) -> StagedVersion:
    """Makes a new version visible in one rename, after `write(staging)`
    filled a temporary directory beside the versions and (with `check`) it
    loaded and warmed up as the server will; then prunes to `keep` good
    versions. `verified`: `write` checked the version itself (an
    eligibility refresh: a good version's graph and tensors with new set
    values, read back), so it is recorded as good without a load here; the
    server's load is the only one.

    The publishing rule: `read_version` is the newest version when the job
    read what it builds on (None: there was none). Under the lock, when a
    newer version exists, `rebase(staging, head)` returns the staged
    directory rebased onto version `head`, carrying its changes (the old
    directory is its to remove), and the rename is tried again; it raises
    `PublishConflict` where it cannot. The first `OPTIMISTIC_REBASES` run
    out of the lock; a job overtaken once more rebases holding it, so short
    jobs publishing every second cannot starve a long one. The version
    number (`version`, or one above every version seen) is taken under the
    lock.

    First, every version newer than the newest good one is moved out of the
    integer namespace (`rejected-<version>-<UTC time>`), so the newest
    version loads even if this publish fails; pruning moves out the rejected
    versions it meets too. `what` names the version in the error when it
    does not load."""
    check_base_path(base)
    leftovers = remove_leftovers(base, stale_after_seconds=stale_after_seconds)
    for name in leftovers:
        logger.info("removed %s: left over by a publish that did not finish", name)

    record = read_record(base)
    _, rejected = walk(base, record, xla, 1)
    moved = quarantine(base, rejected, record)
    write_record(base, record)

    staging = os.path.join(base, temporary_prefix("publish") + uuid.uuid4().hex)
    rebased_onto = []
    try:
        written = write(staging)
        if check and not verified:
            with stage("checking that the new version loads and warms up as a server would"):
                check_saved_model(staging, xla_enabled=xla)
                error = version_checks.load_error(staging, (read_version or 0) + 1, xla)
            if error:
                raise ValueError(f"{what} fails to load or warm up as a server would: {error}")
        with stage("publishing: the next version number and the rename, under the lock"):
            while True:
                _fsync_tree(staging)
                with version_lock(base):
                    head = _newest(base)
                    if _moved(head, read_version) and len(rebased_onto) >= OPTIMISTIC_REBASES:
                        # Overtaken again: this rebase holds the lock, so the job ends
                        # however often short jobs publish (seconds, once per job).
                        staging, read_version = _rebased(rebase, staging, head, rebased_onto)
                        _fsync_tree(staging)
                    if not _moved(head, read_version):
                        number, entry, target = _rename(
                            base, staging, version, keep, check or verified, xla
                        )
                        if entry is not None:
                            record[number] = entry
                        break
                staging, read_version = _rebased(rebase, staging, head, rebased_onto)
    finally:
        shutil.rmtree(staging, ignore_errors=True)

    removed = []
    if keep is not None:
        good, rejected_now = walk(base, record, xla, keep)
        moved.update(quarantine(base, rejected_now, record))
        rejected += rejected_now
        if len(good) == keep:
            removed = [v for v in list_versions(base) if v < good[-1] and v != number]
        for old in removed:
            shutil.rmtree(os.path.join(base, str(old)), ignore_errors=True)  # maybe pruned already
    write_record(base, record)
    return StagedVersion(
        number,
        target,
        written,
        tuple(removed),
        tuple(sorted(rejected)),
        tuple(leftovers),
        tuple(sorted(moved)),
        tuple(moved[v] for v in sorted(moved)),
        tuple(rebased_onto),
    )


def _newest(base: str) -> int | None:
    existing = list_versions(base)
    return existing[-1] if existing else None


def _moved(head: int | None, read_version: int | None) -> bool:
    """Whether a version was published since the job read `read_version`."""
    return head is not None and (read_version is None or head > read_version)


def _rebased(rebase, staging: str, head: int, rebased_onto: list) -> tuple[str, int]:
    logger.info("version %d was published while this job ran: rebasing onto it", head)
    rebased_onto.append(head)
    return rebase(staging, head), head


def _rename(base, staging, version, keep, good: bool, xla: bool):
    """Takes the version number and renames `staging` to it (the caller holds
    the lock); records it as good first (`good`), so no other job ever loads
    it to check it. Returns `(number, its record entry or None, path)`."""
    number = new_version(base, list_versions(base), version, keep)
    entry = {"fingerprint": version_fingerprint(staging), "error": "", "xla": xla} if good else None
    if entry is not None:
        write_record(base, {number: entry}, locked=True, also=(number,))
    target = os.path.join(base, str(number))
    os.rename(staging, target)  # atomic on one filesystem
    fsync_dir(base)
    return number, entry, target


def _fsync_tree(root: str) -> None:
    for folder, _, files in os.walk(root):
        for name in files:
            with open(os.path.join(folder, name), "rb") as file:
                os.fsync(file.fileno())
        fsync_dir(folder)
