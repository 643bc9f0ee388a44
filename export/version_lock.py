"""The short critical section in which a version number is taken and made visible.

Every job that publishes a version (a full `publish`, an index swap, a rules
refresh) stages its files for as long as it needs, then takes
`version_lock(base)` for milliseconds: it checks that nothing was published
since the version it read, takes the next number and renames its staged
directory into place. No export or staging ever runs under the lock, so a
rules job never waits for a catalogue job's export; only a job overtaken
three times rebases once holding it (`staging.OPTIMISTIC_REBASES`), so that
it cannot be starved.

The lock is `flock` on `<base>/.static_keras.lock`. On one host it is the
kernel's. On NFS, Linux maps `flock` to NFS byte-range locks (NFSv4, or v3
with lockd), which every client sees, unless the mount says
`local_lock=flock` or `local_lock=all` (then each client locks alone: warned
once). A FUSE mount of an object store (gcsfuse, s3fs, mountpoint-s3, ...)
renames a directory by copying each object, so a server can see a half
version whatever the lock does: warned once. `gs://` and `s3://` paths are
refused: object stores have neither (docs/serving.md, "When jobs overlap",
says how to serve from one).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import time

LOCK_FILENAME = ".static_keras.lock"
#: How long a job waits for the lock: others hold it for milliseconds, or,
#: once per job overtaken three times, for one rebase (seconds at 2x10^7).
DEFAULT_LOCK_TIMEOUT_SECONDS = 300.0
#: File system types whose directory rename copies objects one by one.
_OBJECT_STORE_MOUNTS = ("gcsfuse", "s3fs", "mountpoint-s3", "goofys", "rclone", "blobfuse")

logger = logging.getLogger("static_keras.export")
_warned: set[str] = set()


class PublishConflict(ValueError):
    """A job could not publish without losing a change published while it ran.

    The message is one line: what changed under the job and what to rerun."""


def check_base_path(base: str) -> None:
    """ValueError for a base path the publishing rule cannot hold on (an
    object store URL); a warning, once per mount, where it holds only in
    part (see the module docstring)."""
    if "://" in base:
        raise ValueError(
            f"Cannot publish to {base!r}: object stores have neither an atomic rename "
            "nor locks. Publish to a local or NFS base path (docs/serving.md, 'When jobs "
            "overlap', says how to serve from an object store)"
        )
    fstype, options, mount = _mount_of(base)
    if mount in _warned:
        return
    problem = ""
    if fstype.startswith("nfs") and any(
        option in ("local_lock=all", "local_lock=flock") for option in options
    ):
        problem = (
            f"{mount} is NFS mounted with {','.join(o for o in options if 'local_lock' in o)}: "
            "locks are local to this client, so jobs on other hosts can overlap unseen"
        )
    elif fstype.startswith("fuse.") and any(name in fstype for name in _OBJECT_STORE_MOUNTS):
        problem = (
            f"{mount} is an object store mount ({fstype}): a directory rename copies object "
            "by object, so a server may see a version half written"
        )
    if problem:
        _warned.add(mount)
        logger.warning("publishing under %s: %s (docs/serving.md, 'When jobs overlap')",
                       base, problem)  # fmt: skip


def _mount_of(path: str) -> tuple[str, list[str], str]:
    """`(fstype, options, mount point)` of the mount holding `path` (from
    /proc/mounts; `("", [], "")` where it cannot be read)."""
    real = os.path.realpath(path)
    best = ("", [], "")
    try:
        with open("/proc/mounts") as mounts:
            for line in mounts:
                fields = line.split()
                if len(fields) < 4:
                    continue
                mount = fields[1].replace("\\040", " ")
                inside = real == mount or real.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) >= len(best[2]):
                    best = (fields[2], fields[3].split(","), mount)
    except OSError:
        pass
    return best


@contextlib.contextmanager
def version_lock(base: str, *, timeout_seconds: float = DEFAULT_LOCK_TIMEOUT_SECONDS):
    """Holds the base path's publishing lock (exclusive, across processes).

    Raises `PublishConflict` after `timeout_seconds` (a holder stopped in
    its critical section), and ValueError where the file system has no
    locks, naming the lock file."""
    path = os.path.join(base, LOCK_FILENAME)
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        deadline = time.monotonic() + timeout_seconds
        while True:
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as error:
                if error.errno not in (errno.EAGAIN, errno.EACCES):
                    raise ValueError(
                        f"Cannot lock {path} ({error.strerror}): this file system has no "
                        "locks, so overlapping jobs could lose changes (docs/serving.md, "
                        "'When jobs overlap')"
                    ) from None
                if time.monotonic() > deadline:
                    raise PublishConflict(
                        f"{path} stayed locked for {timeout_seconds:.0f} s (a job stopped "
                        "while it held it; jobs hold it for milliseconds, or seconds for a "
                        "last rebase): nothing was published; rerun once that job ends"
                    ) from None
                time.sleep(0.005)
        yield
    finally:
        os.close(descriptor)  # releases the lock
