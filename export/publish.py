"""`publish`: a Keras model exported as a new version under a TF Serving base path.

The model is exported (`saved_model.export_saved_model`) into a staging
directory and made visible by the publishing rule every path follows
(`staging.publish_staged`: checked, numbered and renamed under the lock;
see that module). A model whose search holds eligibility sets carries in
the sets that rules jobs published while it exported (`rebase.py`), so no
rules change is rolled back.
"""

from __future__ import annotations

import dataclasses
import os
import time

from static_keras.export.leftovers import DEFAULT_STALE_AFTER_SECONDS
from static_keras.export.staging import check_version_arguments
from static_keras.export.staging import newest_good_version  # noqa: F401 (re-exported)
from static_keras.export.staging import publish_staged
from static_keras.export.version_checks import list_versions
from static_keras.export.version_lock import check_base_path


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


class HandedOver:
    """A model given to `publish` for good: it is dropped once exported.

    `publish` exports the model, then loads the export as the server will
    to check it. A caller that holds no other reference to the model (the
    `static-keras publish` command) passes `HandedOver(model)`: the model,
    and the index its weights share, are freed before that check load,
    which would otherwise hold a second copy of every index tensor beside
    them (at 10^8 items, 4 GB more at the job's peak).
    """

    def __init__(self, model):
        self._model = model

    def peek(self):
        """The model, still held."""
        if self._model is None:
            raise ValueError("this model was already exported and dropped by `publish`")
        return self._model

    def take(self):
        """The model; this object holds it no longer."""
        model, self._model = self.peek(), None
        return model


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
            wrapped in a `ConstrainedBeamSearch` over the new index. Or
            `HandedOver(model)`: the model is dropped (and its memory
            returned) once exported, before the check load.
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
    from static_keras.serving.servable import release_memory
    from static_keras.tensorflow_log_lines import quiet_tensorflow_start

    with quiet_tensorflow_start():
        from static_keras.export.saved_model import export_saved_model

    start = time.perf_counter()
    base = os.fspath(model_base_path)
    check_base_path(base)
    os.makedirs(base, exist_ok=True)
    existing = list_versions(base)
    check_version_arguments(base, version, keep)  # bad arguments fail before the export
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
    handed_over = model if isinstance(model, HandedOver) else None
    if handed_over is not None:
        del model  # held only by `handed_over` from here
    searched = handed_over.peek() if handed_over is not None else model
    read_sets = [read_sets_of(base, read) if eligible_search(searched) is not None else None]
    del searched

    def export(staging):
        if handed_over is None:
            return export_saved_model(model, staging, xla=xla, **export_kwargs)
        written = export_saved_model(handed_over.take(), staging, xla=xla, **export_kwargs)
        release_memory()  # the model's cycles, and the index its weights share
        return written

    def rebase(staging, head):
        if read_sets[0] is None:
            return staging
        staging, read_sets[0] = rebase_staged_sets(base, staging, read_sets[0], head)
        return staging

    staged = publish_staged(
        base,
        export,
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
