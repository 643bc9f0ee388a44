"""Eligibility-only refresh of a published version, without TensorFlow.

The rules (in stock, region, freshness) change by the minute; the model and
the index by the day. `refresh_eligibility` publishes a new version of a
served model whose only change is the eligibility set tensors: the graph and
the warmup records are copied, the checkpoint links the source's data shards
and writes only the new set tensors (`checkpoint_patch`), the result is read
back, and the version is renamed into place like `publish`. That is seconds
where a re-export retraces the whole model and rewrites the whole index.

Everything here is NumPy and the standard library: a rules job that imports
TensorFlow waits seconds for it before its change can reach a server.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from typing import Mapping

import numpy as np

from static_keras.export import checkpoint_patch
from static_keras.export.leftovers import DEFAULT_STALE_AFTER_SECONDS
from static_keras.export.metadata import METADATA_FILENAME
from static_keras.export.metadata import read_metadata
from static_keras.export.served_tensors import DENSE_BOUNDARIES
from static_keras.export.served_tensors import DENSE_MASKS
from static_keras.export.served_tensors import FINGERPRINT
from static_keras.export.served_tensors import MODEL_VARIABLES
from static_keras.export.served_tensors import TABLE_IDS
from static_keras.export.served_tensors import TABLE_MEMBERS
from static_keras.export.served_tensors import TABLES_ATTRIBUTE
from static_keras.export.served_tensors import checkpoint_key
from static_keras.export.served_tensors import checkpoint_prefix
from static_keras.export.served_tensors import top_level_only
from static_keras.export.staging import publish_staged
from static_keras.export.staging import removed_source_is_a_conflict
from static_keras.export.staging import source_version_for
from static_keras.export.version_lock import PublishConflict
from static_keras.index import dense_eligibility
from static_keras.index.eligibility import EligibilitySets
from static_keras.index.member_catalogue import MemberCatalogue
from static_keras.index.member_catalogue import catalogue_fingerprint
from static_keras.index.member_catalogue import exclusion_table_digest
from static_keras.progress import stage


@dataclasses.dataclass(frozen=True)
class EligibilityRefreshInfo:
    """What `refresh_eligibility` wrote."""

    version: int
    path: str
    source_version: int
    sizes: dict
    removed_versions: tuple[int, ...]
    rejected_versions: tuple[int, ...]
    seconds: float
    #: Versions published while the job ran, which it rebased onto (in order).
    rebased_onto: tuple[int, ...] = ()
    #: Versions found not to load, moved out of the integer namespace (as `publish` does).
    quarantined_versions: tuple[int, ...] = ()
    quarantined_paths: tuple[str, ...] = ()


def read_eligibility(saved_model_dir: str | os.PathLike) -> EligibilitySets:
    """The eligibility sets an exported version holds (from its checkpoint)."""
    path = os.fspath(saved_model_dir)
    metadata = read_metadata(path)
    info = metadata.get("eligibility")
    if not info:
        raise ValueError(
            f"{path!r} holds no eligibility sets (export a model whose constraint was "
            "built with `eligibility=`)"
        )
    keys = info["variables"]
    names = {
        "ids": checkpoint_key(TABLES_ATTRIBUTE, TABLE_IDS),
        "members": checkpoint_key(TABLES_ATTRIBUTE, TABLE_MEMBERS),
        "words": checkpoint_key(MODEL_VARIABLES, keys["eligibility_words"]),
        "directory": checkpoint_key(MODEL_VARIABLES, keys["eligibility_directory"]),
    }
    tensors = checkpoint_patch.read_tensors(checkpoint_prefix(path), names.values())
    ids, members, words, directory = (tensors[names[n]] for n in names)
    fingerprint, digest = info["catalogue_fingerprint"], info.get("table_digest")
    if digest is not None:  # one sequential pass binds the table to its fingerprint
        if exclusion_table_digest(fingerprint, ids, members) != digest:
            raise ValueError(f"{path!r}: the exclusion table does not match its metadata")
    catalogue = MemberCatalogue.from_sorted(
        ids, members, info["num_members"], has_item_ids=info.get("has_item_ids", True),
        fingerprint=fingerprint if digest is not None else None,
    )  # fmt: skip
    if digest is None and fingerprint not in (catalogue.fingerprint, _before_identity(catalogue)):
        # A version exported before the digest: the fingerprint re-derived.
        raise ValueError(f"{path!r}: the exclusion table does not match its metadata")
    return EligibilitySets(
        metadata["eligibility_sets"], words.view(np.uint32), directory.view(np.uint32), catalogue
    )


def _before_identity(catalogue: MemberCatalogue) -> str | None:
    """The fingerprint versions exported before session 14 recorded for a
    catalogue whose ids are its member numbers (the ids hashed, not the
    identity), so that their sets still read and refresh."""
    if catalogue.fingerprint != catalogue_fingerprint(None, catalogue.num_members):
        return None
    import hashlib

    digest = hashlib.sha256(f"members:{catalogue.num_members};".encode())
    digest.update(np.arange(catalogue.num_members, dtype="<i8").data)
    return digest.hexdigest()


def refresh_eligibility(
    model_base_path: str | os.PathLike,
    eligibility_sets,
    *,
    source_version: int | None = None,
    version: int | None = None,
    keep: int | None = 3,
    check: bool = True,
    stale_after_seconds: float = DEFAULT_STALE_AFTER_SECONDS,
) -> EligibilityRefreshInfo:
    """Publishes a new version whose only change is the eligibility sets.

    Jobs overlap (docs/serving.md, "When jobs overlap"): when another job
    publishes while this one runs, this one rebases before its version
    becomes visible. It applies its change (the sets it names, or those
    of `eligibility_sets` that differ from the source's) to the newest
    version's sets and stages again from the newest version, whose graph
    and index may be a new catalogue's (item ids it no longer holds drop
    out). A change published meanwhile to another set is kept; one to the
    same set is replaced by this job's, published later.

    Args:
        model_base_path: the directory TF Serving polls (versions `1`, `2`, ...).
        eligibility_sets: an `EligibilitySets` over the served index (same
            names, same catalogue), or `{name: item ids}` for the sets to
            rebuild (the others keep their current members).
        source_version: the version to copy; defaults to the newest that
            loads (`newest_good_version`: a rejected newer one is moved out
            of the integer namespace, as `publish` does). A job given one
            refuses, rather than rebases, when a version lands meanwhile.
        version: the new version number; defaults to one above every
            version when the new one becomes visible (as in `publish`).
        keep, stale_after_seconds: as in `publish`.
        check: bool. Read the new checkpoint back as TensorFlow's reader
            does (every tensor's checksum, the new values) before the version
            becomes visible. The graph, the warmup records and every other
            tensor are the source version's bytes, and the source loaded and
            warmed up, so the job does not load the refreshed version again:
            the server's load is the only one (a server that rejects it
            keeps the old version serving). Defaults to True.

    Returns:
        `EligibilityRefreshInfo`.
    """

    start = time.perf_counter()
    base = os.fspath(model_base_path)
    given_source = source_version is not None
    source_version, existing = source_version_for(
        base, source_version, version, keep, "refresh its sets"
    )

    with stage(f"reading the sets of version {source_version}"):
        current = read_eligibility(os.path.join(base, str(source_version)))
        sets = _new_sets(current, eligibility_sets)
    state = {"source": source_version, "sets": sets}

    def write(staging):
        source = os.path.join(base, str(state["source"]))
        note = {"source_version": state["source"]}
        with removed_source_is_a_conflict(source, state["source"]):
            with stage("writing and verifying the new sets"):
                write_with_sets(source, staging, state["sets"], note, check=check)

    def rebase(staging, head):
        shutil.rmtree(staging, ignore_errors=True)
        if given_source:
            raise PublishConflict(
                f"version {head} was published while this job refreshed version "
                f"{source_version} (--source-version): nothing was published; rerun it over "
                f"version {head}, or without a source version"
            )
        newest = _sets_of(base, head)
        if newest.names != current.names:
            raise PublishConflict(
                f"version {head}, published while this job ran, holds the sets "
                f"{list(newest.names)} where the job read {list(current.names)}: nothing was "
                "published; rerun the job"
            )
        state["sets"] = _applied(newest, _change(current, sets, eligibility_sets))
        state["source"] = head
        write(staging)
        return staging

    staged = publish_staged(
        base,
        write,
        read_version=max(existing[-1], source_version),
        rebase=rebase,
        version=version,
        keep=keep,
        xla=bool(read_metadata(os.path.join(base, str(source_version))).get("xla")),
        check=False,
        verified=check,
        stale_after_seconds=stale_after_seconds,
        what="The refreshed version",
    )
    return EligibilityRefreshInfo(
        version=staged.version,
        path=staged.path,
        source_version=state["source"],
        sizes=state["sets"].sizes(),
        removed_versions=staged.removed_versions,
        rejected_versions=staged.rejected_versions,
        seconds=time.perf_counter() - start,
        quarantined_versions=staged.quarantined_versions,
        quarantined_paths=staged.quarantined_paths,
        rebased_onto=staged.rebased_onto,
    )


def write_with_sets(source: str, staging: str, sets: EligibilitySets, note: dict, *, check: bool):
    """Stages at `staging` the version at `source` with `sets` in place of
    its own: everything but the checkpoint is copied (small files); the
    checkpoint links the source's shards and writes only the set tensors
    (and the dense-step masks derived from them); `note` goes into the
    metadata's "eligibility_refresh". With `check`, read back."""
    metadata = read_metadata(source)
    # TensorFlow's fingerprint.pb hashes the checkpoint index: the source's
    # would name the source, and the loader reads it only for metrics, so
    # the refreshed version has none.
    shutil.copytree(source, staging, ignore=top_level_only("variables", FINGERPRINT))
    info = metadata["eligibility"]
    replaced = _rewrite_checkpoint(
        source, staging, info["variables"], sets, info.get("dense_masks")
    )
    metadata["eligibility_refresh"] = {
        **note,
        "refreshed_unix": time.time(),
        "sizes": sets.sizes(),
    }
    with open(os.path.join(staging, "assets", METADATA_FILENAME), "w") as file:
        json.dump(metadata, file, indent=2, sort_keys=True)
    if check:
        _verify_checkpoint(source, staging, replaced)


def _sets_of(base: str, version: int) -> EligibilitySets:
    path = os.path.join(base, str(version))
    try:
        return read_eligibility(path)
    except FileNotFoundError:
        raise PublishConflict(
            f"version {version} was removed while this job rebased onto it: nothing was "
            "published; rerun the job"
        ) from None


def _applied(newest: EligibilitySets, change) -> EligibilitySets:
    """A rules job's `change` (`{name: item ids}`) applied to the newest
    version's sets; ids no longer in its catalogue are left out, as a
    catalogue swap leaves them out."""
    sets = newest
    for name, item_ids in change.items():
        sets = sets.replace(name, item_ids)
    return sets


def _change(current: EligibilitySets, sets: EligibilitySets, asked) -> dict:
    """What a rules job changes, as `{name: item ids}`: the mapping it was
    given, or the sets of an `EligibilitySets` that differ from `current`."""
    if isinstance(asked, Mapping):
        return dict(asked)
    catalogue = sets.catalogue
    change = {}
    for row, name in enumerate(sets.names):
        if not np.array_equal(sets.words[row], current.words[row]):
            members = np.flatnonzero(sets.contains(row, np.arange(sets.num_members)))
            change[name] = catalogue.item_ids[members]
    return change


def _new_sets(current: EligibilitySets, eligibility_sets) -> EligibilitySets:
    if isinstance(eligibility_sets, EligibilitySets):
        if eligibility_sets.names != current.names:
            raise ValueError(
                f"The served version has sets {list(current.names)}; the new sets are "
                f"{list(eligibility_sets.names)} (names and order must match)"
            )
        if eligibility_sets.catalogue.fingerprint != current.catalogue.fingerprint:
            raise ValueError(
                "The new sets are over another catalogue (member -> item id map) than "
                "the served index: build them over the served index"
            )
        return eligibility_sets
    if not isinstance(eligibility_sets, Mapping) or not eligibility_sets:
        raise ValueError(
            "`eligibility_sets` must be an EligibilitySets or a non-empty mapping "
            f"{{name: item ids}}. Received: {type(eligibility_sets).__name__}"
        )
    sets = current
    for name, item_ids in eligibility_sets.items():
        sets = sets.replace(name, item_ids)  # ValueError names an unknown set
    return sets


def _rewrite_checkpoint(
    source_dir: str, saved_model_dir: str, keys: Mapping[str, str], sets, dense=None
) -> dict[str, np.ndarray]:
    """Writes the checkpoint of `saved_model_dir`: that of `source_dir` with
    the eligibility words and directory replaced, and the dense-step masks
    derived from them (`dense`: their metadata, or None). Only those bytes
    are written (`checkpoint_patch`); returns what was replaced, by key."""
    source = checkpoint_prefix(source_dir)
    arrays = sets.device_arrays()
    if dense is not None:
        names = {
            name: checkpoint_key(MODEL_VARIABLES, keys[name])
            for name in ("eligibility_words", DENSE_MASKS, DENSE_BOUNDARIES)
        }
        held = checkpoint_patch.read_tensors(source, names.values())
        held = {name: held[key] for name, key in names.items()}
        arrays[DENSE_MASKS] = dense_eligibility.dense_eligibility_masks(
            dense["vocab_size"],
            dense["dense_levels"],
            held[DENSE_BOUNDARIES],
            sets,
            (held["eligibility_words"], held[DENSE_MASKS]),  # unchanged sets keep theirs
            stored_levels=dense.get("stored_levels"),  # absent before derived rows: all
        )
    replaced = {
        checkpoint_key(MODEL_VARIABLES, keys[name]): array for name, array in arrays.items()
    }
    os.makedirs(os.path.join(saved_model_dir, "variables"))
    checkpoint_patch.replace_tensors(source, checkpoint_prefix(saved_model_dir), replaced)
    return replaced


def _verify_checkpoint(source_dir: str, saved_model_dir: str, replaced) -> None:
    """Reads the new checkpoint back as TensorFlow's reader does (the
    restore of `LoadSavedModel` checks each tensor's CRC-32C the same way):
    the same tensors, dtypes and shapes as the source's, the replaced values
    as written. ValueError otherwise."""
    new = checkpoint_prefix(saved_model_dir)
    if checkpoint_patch.tensor_specs(new) != checkpoint_patch.tensor_specs(
        checkpoint_prefix(source_dir)
    ):
        raise ValueError("The refreshed checkpoint does not hold the source's tensors")
    for key, value in checkpoint_patch.read_tensors(new, replaced).items():
        if not np.array_equal(value, replaced[key]):
            raise ValueError(f"The refreshed checkpoint reads back {key} differently")
