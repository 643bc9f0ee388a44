"""Atomic version publishing under a TF Serving `model_base_path`.

TF Serving polls `model_base_path` and loads any new integer directory it
finds, so a directory copied in place would be picked up half written. Here
every version is staged in a non-numeric temporary directory beside the
versions (same filesystem), loaded and warmed up as the server will, and
renamed to its number in one step.

One publishing rule for every path (a model, an index swap, a rules
refresh): the version that becomes visible contains every change already
published. Jobs overlap (the daily catalogue job outlasts several
minute-level rules jobs), so the version number is taken at the rename, in
a critical section of milliseconds (`version_lock`); a job that finds a
version newer than the one it read rebases onto it out of the lock
(`rebase.py`: it carries the newest sets into what it publishes) and tries
again, or refuses in one line (`PublishConflict`) where it cannot.

The newest integer version always loads: before the new version becomes
visible, every version newer than the newest good one is checked and each
rejected one is moved out of the integer namespace (`version_checks.py`).
Pruning (`keep`) counts only good versions, so the newest good version is
never removed. Leftover temporary directories of killed jobs are removed
first (`leftovers.py`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import time
import uuid

from static_keras.export import version_checks
from static_keras.export.check import check_saved_model
from static_keras.export.leftovers import DEFAULT_STALE_AFTER_SECONDS
from static_keras.export.leftovers import remove_leftovers
from static_keras.export.leftovers import temporary_prefix
from static_keras.export.version_checks import VERIFIED_FILENAME  # noqa: F401 (re-exported)
from static_keras.export.version_checks import fsync_dir
from static_keras.export.version_checks import list_quarantined
from static_keras.export.version_checks import list_versions
from static_keras.export.version_checks import quarantine
from static_keras.export.version_checks import read_record
from static_keras.export.version_checks import version_fingerprint
from static_keras.export.version_checks import walk
from static_keras.export.version_checks import write_record
from static_keras.export.version_lock import PublishConflict
from static_keras.export.version_lock import check_base_path
from static_keras.export.version_lock import version_lock

#: Rebases a job does out of the lock; the next one holds it (no job starves).
OPTIMISTIC_REBASES = 2
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
    #: Versions published while the job ran, which it rebased onto (in order).
    rebased_onto: tuple[int, ...] = ()


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


def publish(
    model,
    model_base_path: str | os.PathLike,
    *,
    version: int | None = None,
    keep: int | None = 3,
    xla: bool = False,
    check: bool = True,
    based_on: int | None = None,
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
            every version on disk or moved out as rejected when the version
            becomes visible (not when the job starts). An existing version
            is never overwritten, a rejected one's number never reused.
        keep: int or None. Good versions kept after publishing: the newest
            `keep` versions that load and warm up (the new one included);
            older ones are removed. Rejected versions never count, so the
            newest good version always stays. None keeps all (the versions
            newer than the newest good one are still checked). Defaults to 3.
        xla: bool. Export jit-compiled functions (see `export_saved_model`).
        check: bool. Run `check_saved_model` on the export, then load it and
            replay its warmup records as the server will, before it becomes
            visible. Defaults to True.
        based_on: int or None. The served version whose eligibility sets
            `model` carries (the version the job read them from, as
            `static-keras publish --index` does); defaults to the newest
            version when `publish` starts. When versions are published
            while this one exports, every set the model holds as `based_on`
            held it is taken from the newest version instead (carried over
            to the model's catalogue by item id), so no rules change is
            rolled back; a set the model changed keeps the model's members.
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

    Raises:
        PublishConflict (a ValueError; one line): the job cannot publish
            without losing a change published while it ran (the newest
            version holds other set names; `based_on` was removed).

    Returns:
        `PublishInfo`: `version`, `path`, `export`, `removed_versions`,
        `rejected_versions` (the versions found not to load),
        `quarantined_versions` and `quarantined_paths` (those moved out, and
        where to), `removed_leftovers`, `seconds`.
    """
    # TensorFlow is imported here: refreshes and version checks publish without it.
    from static_keras.export.eligibility import eligible_search
    from static_keras.export.rebase import read_sets_of
    from static_keras.export.rebase import rebase_staged_sets
    from static_keras.tensorflow_log_lines import import_quietly

    export_saved_model = import_quietly("static_keras.export.saved_model").export_saved_model

    start = time.perf_counter()
    base = os.fspath(model_base_path)
    check_base_path(base)
    os.makedirs(base, exist_ok=True)
    existing = list_versions(base)
    new_version(base, existing, version, keep)  # bad arguments fail before the export
    if based_on is not None and (
        isinstance(based_on, bool) or not isinstance(based_on, int) or based_on not in existing
    ):
        raise ValueError(
            f"`based_on` must be a version under {base!r} (the one whose sets the model "
            f"carries); versions: {existing}. Received: based_on={based_on!r}"
        )
    read = based_on if based_on is not None else (existing[-1] if existing else None)
    # What the model's sets started from: held for the rebase (a later job may
    # prune that version); after a rebase, what the job rebased onto.
    read_sets = [read_sets_of(base, read) if eligible_search(model) is not None else None]

    def rebase(staging, head):
        if read_sets[0] is None:
            return staging
        staging, read_sets[0] = rebase_staged_sets(base, staging, read_sets[0], head)
        return staging

    staged = publish_staged(
        base,
        lambda staging: export_saved_model(model, staging, xla=xla, **export_kwargs),
        read_version=read,
        rebase=rebase,
        version=version,
        keep=keep,
        xla=xla,
        check=check,
        stale_after_seconds=stale_after_seconds,
        what="The export",
    )
    return PublishInfo(
        version=staged.version,
        path=staged.path,
        export=dataclasses.replace(staged.written, path=staged.path),
        removed_versions=staged.removed_versions,
        seconds=time.perf_counter() - start,
        rejected_versions=staged.rejected_versions,
        removed_leftovers=staged.removed_leftovers,
        quarantined_versions=staged.quarantined_versions,
        quarantined_paths=staged.quarantined_paths,
        rebased_onto=staged.rebased_onto,
    )


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
    new_version(base, existing, version, keep)
    return source_version, existing


@contextlib.contextmanager
def removed_source_is_a_conflict(source: str, version: int):
    """A job's copy of version `source` that finds it removed (by another
    job with a small `keep`) ends in one line, not a traceback."""
    try:
        yield
    except FileNotFoundError:
        if os.path.isdir(source):
            raise
        raise PublishConflict(
            f"version {version} was removed while this job copied it (by a job with a small "
            "keep): nothing was published; rerun the job"
        ) from None


def new_version(base: str, existing: list[int], version, keep) -> int:
    """The version a job would take now (default: one above every version
    ever seen, rejected ones moved out included), checked with `keep`: a
    positive int that no existing or rejected directory has (numbers are
    never reused). Jobs call it at their start to fail early on bad
    arguments, and again under the lock, where the number is taken."""
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
            check_saved_model(staging, xla_enabled=xla)
            error = version_checks.load_error(staging, (read_version or 0) + 1, xla)
            if error:
                raise ValueError(f"{what} fails to load or warm up as a server would: {error}")
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
