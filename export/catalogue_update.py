"""A catalogue change published like a rules refresh, without TensorFlow.

New items must reach answers in seconds. A version whose index was laid out
with headroom (`StaticIndex.build(..., headroom=0.1)`) takes any catalogue
within its capacities as new tensor values for the same graph, so
`update_catalogue` publishes a delta (items added with their semantic IDs,
item ids removed) the way `refresh_eligibility` publishes sets:

1. read the served version's index tensors and eligibility sets from its
   checkpoint (NumPy; the exclusion table gives the catalogue unsorted);
2. `apply_delta`: the new index in the same capacities (a level-by-level
   merge, no full sort); each set's kept members moved to their new places
   by the merge's member map (removed items drop out; new items are in no
   set unless `add_to_sets` names them);
3. every tensor the layer derives from the index (dense edge rows, member
   ranges, the sets' dense masks, the exclusion table) computed on the host
   by the functions the layer itself uses;
4. the graph and warmup records copied, the checkpoint's other shards
   hard-linked and only these tensors written (`checkpoint_patch`), read
   back against their checksums, and the version renamed into place by
   `publish_staged`, the one rule every publishing path follows (a job
   that finds a newer version rebases onto it before its own is visible).

A delta that does not fit (members, prefixes or a fan-out above a cap) is
refused before anything is written (`CapacityError`, naming the capacity);
a full `publish` with more headroom is the remedy.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import shutil
import time
from typing import Mapping

import numpy as np

from static_keras.constraint import dense_edge_rows
from static_keras.export import checkpoint_patch
from static_keras.export.leftovers import DEFAULT_STALE_AFTER_SECONDS
from static_keras.export.metadata import METADATA_FILENAME
from static_keras.export.metadata import read_metadata
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
from static_keras.index import archive
from static_keras.index import dense_eligibility
from static_keras.index import dense_fields
from static_keras.index import eligibility_bits
from static_keras.index.catalogue_delta import apply_delta_with_member_map
from static_keras.index.catalogue_delta import catalogue_after_delta
from static_keras.index.eligibility import EligibilitySets
from static_keras.index.headroom import CapacityError
from static_keras.index.layout import IndexLayout
from static_keras.index.member_catalogue import MemberCatalogue
from static_keras.index.member_catalogue import exclusion_table_digest
from static_keras.index.static_index import StaticIndex
from static_keras.progress import stage

#: The metadata entry `export_saved_model` writes for an index with headroom.
UPDATE_ENTRY = "catalogue_update"


@dataclasses.dataclass(frozen=True)
class CatalogueUpdateInfo:
    """What `update_catalogue` wrote."""

    version: int
    path: str
    source_version: int
    num_items: int
    added: int
    removed: int
    sizes: dict
    #: The new catalogue's fingerprint: the `base_fingerprint` of the next delta.
    catalogue_fingerprint: str
    removed_versions: tuple[int, ...]
    rejected_versions: tuple[int, ...]
    seconds: float
    rebased_onto: tuple[int, ...] = ()
    quarantined_versions: tuple[int, ...] = ()
    quarantined_paths: tuple[str, ...] = ()


def read_served_index(saved_model_dir: str | os.PathLike) -> StaticIndex:
    """The `StaticIndex` an exported version with headroom holds (from its
    checkpoint, NumPy only). ValueError for a version without headroom."""
    path = os.fspath(saved_model_dir)
    metadata = read_metadata(path)
    return _read_served(path, metadata, _update_entry(metadata, path), sets=False)[0]


def _read_served(path: str, metadata: dict, info: dict, sets: bool = True):
    """`(StaticIndex, EligibilitySets or None)` of a version, in one pass
    over its checkpoint; the sets' catalogue takes the index's item ids (no
    scatter of the exclusion table)."""
    layout = IndexLayout.from_config(_index_entry(metadata, info)["layout"])
    shapes = layout.array_shapes()
    keys = {name: checkpoint_key(MODEL_VARIABLES, info["variables"][name]) for name in shapes}
    eligibility = metadata.get("eligibility") if sets else None
    if eligibility:
        roles = eligibility["variables"]
        keys["words"] = checkpoint_key(MODEL_VARIABLES, roles["eligibility_words"])
        keys["directory"] = checkpoint_key(MODEL_VARIABLES, roles["eligibility_directory"])
        keys["ids"] = checkpoint_key(TABLES_ATTRIBUTE, TABLE_IDS)
        keys["members"] = checkpoint_key(TABLES_ATTRIBUTE, TABLE_MEMBERS)
    # Each array in the layout's dtype, converted as it is read (tokens are
    # stored as int32 where TensorFlow gathers them).
    dtypes = {keys[name]: shapes[name][1] for name in shapes}
    tensors = checkpoint_patch.read_tensors(checkpoint_prefix(path), keys.values(), dtypes)
    arrays = {name: tensors.pop(keys[name]) for name in shapes}
    index = StaticIndex(layout, arrays)
    if not eligibility:
        return index, None
    catalogue = MemberCatalogue.from_sorted(
        tensors[keys["ids"]], tensors[keys["members"]], layout.num_members,
        member_item_ids=arrays[layout.member_ids_array],
    )  # fmt: skip
    if catalogue.fingerprint != eligibility["catalogue_fingerprint"]:
        raise ValueError(f"{path!r}: the exclusion table does not match its metadata")
    words = tensors[keys["words"]].view(np.uint32)
    directory = tensors[keys["directory"]].view(np.uint32)
    return index, EligibilitySets(metadata["eligibility_sets"], words, directory, catalogue)


def update_catalogue(
    model_base_path: str | os.PathLike,
    *,
    add_sequences=None,
    add_item_ids=None,
    remove_item_ids=None,
    add_to_sets: Mapping[str, object] | None = None,
    on_duplicate_item: str = "error",
    base_fingerprint: str | None = None,
    source_version: int | None = None,
    version: int | None = None,
    keep: int | None = 3,
    check: bool = True,
    stale_after_seconds: float = DEFAULT_STALE_AFTER_SECONDS,
) -> CatalogueUpdateInfo:
    """Publishes a new version whose catalogue is the served one's plus a delta.

    Args:
        model_base_path: the directory TF Serving polls.
        add_sequences, add_item_ids, remove_item_ids, on_duplicate_item:
            the delta, as in `static_keras.index.catalogue_delta.apply_delta`.
        add_to_sets: optional `{set name: item ids}`: added items that join
            each set (every other added item is in no set; served items keep
            their sets).
        base_fingerprint: optional: the catalogue fingerprint of the version
            the delta was computed against (`catalogue_fingerprint(version
            dir)`, `CatalogueUpdateInfo.catalogue_fingerprint`); a served
            catalogue with another one is refused (a job that finds it
            published meanwhile refuses rather than rebases).
        source_version: the version to change; defaults to the newest that
            loads. A job given one refuses, rather than rebases, when a
            version lands meanwhile.
        version, keep, check, stale_after_seconds: as in `refresh_eligibility`.

    Returns:
        `CatalogueUpdateInfo`.

    Raises:
        ValueError: a bad delta (naming the argument and the first ids), a
            version without headroom; `CapacityError` (a ValueError) when
            the new catalogue exceeds the capacities. Nothing is written.
    """
    start = time.perf_counter()
    base = os.fspath(model_base_path)
    given_source = source_version is not None
    source_version, existing = source_version_for(
        base, source_version, version, keep, "update its catalogue"
    )
    delta = dict(
        add_sequences=add_sequences,
        add_item_ids=add_item_ids,
        remove_item_ids=remove_item_ids,
        on_duplicate_item=on_duplicate_item,
        base_fingerprint=base_fingerprint,
    )
    state = {"source": source_version}
    # The new tensors are computed before anything is staged: a bad delta
    # or one beyond the capacities writes nothing.
    source = os.path.join(base, str(source_version))
    with stage(f"merging the delta into the index of version {source_version}"):
        with removed_source_is_a_conflict(source, source_version):
            state["tensors"] = _new_tensors(source, delta, add_to_sets)

    def write(staging):
        source = os.path.join(base, str(state["source"]))
        with removed_source_is_a_conflict(source, state["source"]):
            with stage("writing and verifying the new index tensors"):
                _stage(source, staging, state["tensors"], state["source"], check)

    def rebase(staging, head):
        shutil.rmtree(staging, ignore_errors=True)
        if given_source:
            raise PublishConflict(
                f"version {head} was published while this job updated version "
                f"{source_version} (--source-version): nothing was published; rerun it over "
                f"version {head}, or without a source version"
            )
        # Another job's catalogue or rules: apply this delta to its result.
        try:
            state["tensors"] = _new_tensors(os.path.join(base, str(head)), delta, add_to_sets)
        except ValueError as error:
            raise PublishConflict(
                f"version {head}, published while this job ran, does not take this delta "
                f"({error}): nothing was published"
            ) from None
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
        what="The updated version",
    )
    summary = state["tensors"]["summary"]
    return CatalogueUpdateInfo(
        version=staged.version,
        path=staged.path,
        source_version=state["source"],
        num_items=summary["num_items"],
        added=summary["added"],
        removed=summary["removed"],
        sizes=summary["sizes"],
        catalogue_fingerprint=summary["catalogue_fingerprint"],
        removed_versions=staged.removed_versions,
        rejected_versions=staged.rejected_versions,
        seconds=time.perf_counter() - start,
        rebased_onto=staged.rebased_onto,
        quarantined_versions=staged.quarantined_versions,
        quarantined_paths=staged.quarantined_paths,
    )


def _new_tensors(source: str, delta: dict, add_to_sets) -> dict:
    """`{"replaced": {checkpoint key: array}, "metadata": ..., "summary": ...}`
    of the version at `source` with `delta` applied."""
    metadata = read_metadata(source)
    info = _update_entry(metadata, source)
    delta = dict(delta)
    expected = delta.pop("base_fingerprint", None)
    if expected is not None and expected != info.get("catalogue_fingerprint"):
        raise ValueError(
            f"`base_fingerprint` {expected[:16]} is not the catalogue of the served version "
            f"{os.path.basename(source)} ({str(info.get('catalogue_fingerprint'))[:16]}): the "
            "delta was computed against another catalogue; compute it against this one"
        )
    served, sets = _read_served(source, metadata, info)
    # The served arrays are freed once the merge has read them, before the
    # new ones are built (the catalogue keeps the item ids it needs).
    index, old_members, new_members = apply_delta_with_member_map(
        served, catalogue=None if sets is None else sets.catalogue, release_served=True, **delta
    )
    del served
    layout, arrays = index.layout, index.arrays
    # The metadata's SHA-256 of the new arrays, beside the work below
    # (hashlib releases the GIL on large buffers).
    checksum = concurrent.futures.ThreadPoolExecutor(1)
    index_metadata = checksum.submit(archive.metadata, StaticIndex.kind, layout, dict(arrays))
    checksum.shutdown(wait=False)
    held = info["variables"]
    values = {name: arrays[name] for name in layout.array_shapes()}
    if dense_edge_rows.POINTERS in held:
        values.update(dense_edge_rows.arrays(layout, arrays["dense_states"]))
    windows = tuple(info.get("eligibility_windows") or ())
    if "dense_boundaries" in held:
        try:
            values.update(dense_fields.member_range_arrays(layout, arrays, windows))
        except ValueError as error:
            raise CapacityError(f"{error}. Publish it in full with more headroom") from None
    replaced = {checkpoint_key(MODEL_VARIABLES, held[name]): value
                for name, value in values.items()}  # fmt: skip
    new_metadata = dict(metadata)
    entry = _index_entry(metadata, info)
    entry.update(index_metadata.result())
    sizes = {}
    added, removed = _count(delta["add_item_ids"]), _count(delta["remove_item_ids"])
    if sets is not None:
        # Each set's kept members at their new places; the served sets are
        # dropped before the new table is built (one at a time in memory).
        names = sets.names
        moved = [new_members[sets.contains(row, old_members)] for row in range(sets.num_sets)]
        del sets
        # The new table by a merge of the served one (no sort), read again
        # now rather than held through the merge (the job's peak).
        keys = [checkpoint_key(TABLES_ATTRIBUTE, name) for name in (TABLE_IDS, TABLE_MEMBERS)]
        table = checkpoint_patch.read_tensors(checkpoint_prefix(source), keys)
        served_table = tuple(table.pop(key) for key in keys)
        catalogue = catalogue_after_delta(
            served_table, old_members, new_members, arrays[layout.member_ids_array]
        )
        del old_members, new_members, served_table
        words, directory = eligibility_bits.pack_sets(moved, catalogue.num_members)
        sets = EligibilitySets(names, words, directory, catalogue)
        del moved
        for name, ids in (add_to_sets or {}).items():
            sets = _joined(sets, name, ids, delta["add_item_ids"])
        set_tensors = _set_tensors(metadata, sets, values.get("dense_boundaries"))
        replaced.update(set_tensors)
        eligibility = dict(metadata["eligibility"])
        eligibility["catalogue_fingerprint"] = fingerprint = sets.catalogue.fingerprint
        eligibility["table_digest"] = exclusion_table_digest(
            fingerprint,
            set_tensors[checkpoint_key(TABLES_ATTRIBUTE, TABLE_IDS)],
            set_tensors[checkpoint_key(TABLES_ATTRIBUTE, TABLE_MEMBERS)],
        )
        new_metadata["eligibility"] = eligibility
        sizes = sets.sizes()
    elif add_to_sets:
        raise ValueError("`add_to_sets`: the served version holds no eligibility sets")
    else:
        catalogue = MemberCatalogue.from_index(index)
    new_metadata[UPDATE_ENTRY] = {**info, "catalogue_fingerprint": catalogue.fingerprint}
    new_metadata["catalogue_delta"] = {
        "added": added,
        "removed": removed,
        "num_items": index.num_sequences,
    }
    summary = {**new_metadata["catalogue_delta"], "sizes": sizes,
               "catalogue_fingerprint": catalogue.fingerprint}  # fmt: skip
    return {"replaced": replaced, "metadata": new_metadata, "summary": summary}


def _count(ids) -> int:
    return 0 if ids is None else int(np.asarray(ids).size)


def _joined(sets, name: str, ids, added_ids):
    """`sets` with the added items `ids` joining set `name` (ValueError
    naming ids that the delta does not add)."""
    ids = np.unique(np.asarray(ids, np.int64).reshape(-1))
    added = np.zeros(0, np.int64) if added_ids is None else np.asarray(added_ids, np.int64)
    stray = np.setdiff1d(ids, added)
    if stray.size:
        raise ValueError(
            f"`add_to_sets[{name!r}]` names {stray.size} item id(s) the delta does not add: "
            f"{stray[:5].tolist()} (served items keep their sets; refresh_eligibility "
            "changes those)"
        )
    row = sets.set_id(name)  # ValueError naming an unknown set
    members = np.flatnonzero(sets.contains(row, np.arange(sets.num_members)))
    return sets.replace(name, np.union1d(sets.catalogue.item_ids[members], ids))


def _set_tensors(metadata: dict, sets, boundaries) -> dict:
    """The checkpoint values of the sets over the new catalogue: set words
    and directory, their dense masks, and the exclusion table."""
    info = metadata["eligibility"]
    keys = info["variables"]
    arrays = sets.device_arrays()
    dense = info.get("dense_masks")
    if dense is not None:
        arrays[DENSE_MASKS] = dense_eligibility.dense_eligibility_masks(
            dense["vocab_size"], dense["dense_levels"], boundaries, sets,
            stored_levels=dense.get("stored_levels"),
        )  # fmt: skip
    out = {checkpoint_key(MODEL_VARIABLES, keys[name]): array
           for name, array in arrays.items()}  # fmt: skip
    ids, members = sets.catalogue.exclusion_table()
    out[checkpoint_key(TABLES_ATTRIBUTE, TABLE_IDS)] = ids
    out[checkpoint_key(TABLES_ATTRIBUTE, TABLE_MEMBERS)] = members.astype(np.int32)
    return out


def _stage(source: str, staging: str, tensors: dict, source_version: int, check: bool) -> None:
    """Stages at `staging` the version at `source` with `tensors` in place."""
    prefix = checkpoint_prefix(source)
    specs = checkpoint_patch.tensor_specs(prefix)
    replaced = {}
    for key, value in tensors["replaced"].items():
        dtype = checkpoint_patch.numpy_dtype(key, specs[key][0])
        value = np.asarray(value)
        if tuple(value.shape) != tuple(specs[key][1]):
            raise ValueError(f"{key}: the new catalogue's tensor has shape {value.shape}, the "
                             f"served graph {specs[key][1]}")  # fmt: skip
        if not np.can_cast(value.dtype, dtype, "safe"):
            raise ValueError(f"{key}: the new value is {value.dtype}, the tensor {dtype}")
        replaced[key] = value  # cast a chunk at a time as it is written
    shutil.copytree(source, staging, ignore=top_level_only("variables", FINGERPRINT))
    os.makedirs(os.path.join(staging, "variables"))
    checkpoint_patch.replace_tensors(prefix, checkpoint_prefix(staging), replaced)
    metadata = dict(tensors["metadata"])
    metadata["catalogue_delta"] = {
        **metadata["catalogue_delta"],
        "source_version": source_version,
        "updated_unix": time.time(),
    }
    metadata.pop("eligibility_refresh", None)
    with open(os.path.join(staging, "assets", METADATA_FILENAME), "w") as file:
        json.dump(metadata, file, indent=2, sort_keys=True)
    if check:  # every written tensor read back against the CRC taken as it was written
        new = checkpoint_prefix(staging)
        if checkpoint_patch.tensor_specs(new) != specs:
            raise ValueError("The updated checkpoint does not hold the source's tensors")
        checkpoint_patch.verify_tensors(new, replaced)


def _update_entry(metadata: dict, path: str) -> dict:
    info = metadata.get(UPDATE_ENTRY)
    if not info:
        raise ValueError(
            f"{path!r} holds an index without headroom: a catalogue change needs a new graph. "
            "Publish the model once with an index built with headroom "
            "(StaticIndex.build(..., headroom=0.1)); later changes within it publish in seconds"
        )
    return info


def _index_entry(metadata: dict, info: dict) -> dict:
    for entry in metadata["indexes"]:
        if entry.get("layer") == info["layer"]:
            return entry
    raise ValueError(f"The metadata lists no index of layer {info['layer']!r}")


def catalogue_fingerprint(saved_model_dir: str | os.PathLike) -> str:
    """The fingerprint of the catalogue an exported version with headroom
    serves (what `update_catalogue(..., base_fingerprint=...)` checks)."""
    path = os.fspath(saved_model_dir)
    return _update_entry(read_metadata(path), path)["catalogue_fingerprint"]
