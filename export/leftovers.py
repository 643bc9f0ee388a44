"""Temporary directories of exports and publishes, and the removal of dead ones.

An export is written into a temporary directory and renamed into place, so
a process killed mid-export leaves that directory behind (up to a whole
SavedModel). Each temporary directory is named after its owner,
`.tmp-export-<pid>@<host>-<random>` or `.tmp-publish-<pid>@<host>-<random>`
(`.tmp-<version>-...` before version numbers were taken at the rename),
so the next `publish` into the same base path can tell a leftover from a
directory another publish is still writing: one owned by a process of this
host that no longer runs is removed at once; one from another host (a
shared volume) or without an owner in its name (older static-keras) is
removed once nothing in it changed for `stale_after_seconds`. Rejected
versions that `publish` moved out of the way (`rejected-<version>-<time>`)
are not temporary: nothing here removes them.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import time

#: Leftovers of other hosts are removed after this long without a change.
DEFAULT_STALE_AFTER_SECONDS = 24 * 3600

_TEMPORARY = re.compile(r"^\.tmp-(?:export|publish|[1-9][0-9]*)-")
_OWNER = re.compile(r"-(?P<pid>[0-9]+)@(?P<host>.+)-[A-Za-z0-9_]+$")


def _host() -> str:
    # No '-' or '/': the name's parts stay separable and it is one path component.
    return re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname()) or "host"


def temporary_prefix(kind: str) -> str:
    """The name prefix of this process's temporary directories (`kind`: "export" or a version)."""
    return f".tmp-{kind}-{os.getpid()}@{_host()}-"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by another user
        return True
    return True


def _last_change(path: str) -> float:
    newest = os.path.getmtime(path)
    for folder, _, files in os.walk(path):
        for name in files:
            try:
                newest = max(newest, os.path.getmtime(os.path.join(folder, name)))
            except OSError:  # removed while we look
                pass
    return newest


def is_leftover(path: str, *, stale_after_seconds: float = DEFAULT_STALE_AFTER_SECONDS) -> bool:
    """Whether `path` is a temporary directory whose writer is gone."""
    name = os.path.basename(path)
    if not _TEMPORARY.match(name) or not os.path.isdir(path):
        return False
    owner = _OWNER.search(name)
    if owner is not None and owner["host"] == _host():
        return not _pid_alive(int(owner["pid"]))
    return time.time() - _last_change(path) > stale_after_seconds


def remove_leftovers(
    base: str | os.PathLike, *, stale_after_seconds: float = DEFAULT_STALE_AFTER_SECONDS
) -> list[str]:
    """Removes the leftover temporary directories in `base`; returns their names."""
    base = os.fspath(base)
    removed = []
    for name in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        path = os.path.join(base, name)
        if is_leftover(path, stale_after_seconds=stale_after_seconds):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(name)
    return removed
