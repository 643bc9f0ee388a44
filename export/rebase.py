"""Rebasing a staged version onto the versions published while its job ran.

The publishing rule (docs/serving.md, "When jobs overlap"): the version a
job makes visible contains every change already published. A job read
version N; when it finds N+1 or later at its rename, it rebases here, out
of the lock, then tries the rename again:

- a rules refresh re-applies its own change (the sets it names) to the
  newest version's sets and stages again from the newest version (its graph
  and index may be a new catalogue's): `refresh_eligibility` does this
  itself;
- a model or index publish keeps its graph and index (its change) and takes
  every set it did not change from the newest version, carried over to its
  catalogue by item id (`merged_sets`); only the set tensors of its staged
  directory are rewritten (`rebase_staged_sets`), as a refresh writes them.

NumPy and the standard library only, like the refresh.
"""

from __future__ import annotations

import os
import shutil
import uuid

import numpy as np

from static_keras.export.eligibility_refresh import read_eligibility
from static_keras.export.eligibility_refresh import write_with_sets
from static_keras.export.leftovers import temporary_prefix
from static_keras.export.metadata import read_metadata
from static_keras.export.version_lock import PublishConflict
from static_keras.index.eligibility import EligibilitySets


def read_sets_of(base: str, version: int | None) -> EligibilitySets | None:
    """The sets of `version` under `base` (what a job starts from), or None
    where there is no version or it holds none."""
    if version is None:
        return None
    path = os.path.join(base, str(version))
    if not os.path.isdir(path):
        raise PublishConflict(
            f"version {version}, which this job's sets come from, is no longer under "
            f"{base!r} (removed by a job's keep): nothing was published; rerun the job"
        )
    return read_eligibility(path) if read_metadata(path).get("eligibility") else None


def merged_sets(read: EligibilitySets, ours: EligibilitySets, newest: EligibilitySets):
    """`(sets, changed)`: each set as `ours` holds it where the job changed
    it since `read` (what it started from), else as `newest` holds it; both
    over `ours`' catalogue (others carried over by item id). `changed`: the
    names taken from `ours`. PublishConflict (one line) where the names
    differ or a catalogue without item ids cannot be carried over."""
    if not read.names == ours.names == newest.names:
        raise PublishConflict(
            f"the newest version holds the sets {list(newest.names)}, this job's model "
            f"{list(ours.names)}: rerun the job over the newest version"
        )
    try:
        read_here = read.carried_over(ours.catalogue)
        newest_here = newest.carried_over(ours.catalogue)
    except ValueError as error:
        raise PublishConflict(f"{error}; then rerun the job") from None
    changed = ~np.all(ours.words == read_here.words, axis=1)
    words = np.where(changed[:, None], ours.words, newest_here.words)
    if np.array_equal(words, ours.words):
        return ours, tuple(name for name, row in zip(ours.names, changed) if row)
    directory = np.where(changed[:, None], ours.directory, newest_here.directory)
    merged = EligibilitySets(ours.names, words, directory, ours.catalogue)
    return merged, tuple(name for name, row in zip(ours.names, changed) if row)


def rebase_staged_sets(base: str, staging: str, read: EligibilitySets, head: int):
    """The staged version at `staging` (a publish's export, checked) with
    its sets merged onto version `head`'s (`merged_sets`: the job's changes
    since `read` kept, the rest taken from `head`). Returns `(directory to
    rename, head's sets)`: `staging` itself when no set changes, else a new
    staged directory (the old one removed; the new one links its shards).
    Head's sets are what the job has read from now on: the next rebase
    compares against them, or it would take what it carried in from `head`
    for a change of its own."""
    newest_path = os.path.join(base, str(head))
    try:
        if not read_metadata(newest_path).get("eligibility"):
            raise PublishConflict(
                f"version {head} was published while this job ran and holds no eligibility "
                "sets: rerun the job over it"
            )
        newest = read_eligibility(newest_path)
    except FileNotFoundError:
        raise _moved_again(head) from None
    ours = read_eligibility(staging)
    sets, _ = merged_sets(read, ours, newest)
    if sets is ours:
        return staging, newest
    rebased = os.path.join(base, temporary_prefix("publish") + uuid.uuid4().hex)
    note = {"rebased_onto": head}
    try:
        write_with_sets(staging, rebased, sets, note, check=True)
    except BaseException:
        shutil.rmtree(rebased, ignore_errors=True)
        raise
    shutil.rmtree(staging, ignore_errors=True)
    return rebased, newest


def _moved_again(head: int) -> PublishConflict:
    return PublishConflict(
        f"version {head} was removed while this job rebased onto it (pruned by a job "
        "with a small keep?): nothing was published; rerun the job"
    )
