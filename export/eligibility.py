"""Per-request eligibility in a served model, and eligibility-only refresh.

A model whose constraint layer holds eligibility sets gets a second
signature, `serving_eligible`: the context inputs of `serving_default` plus

- `set_id` int32 `[B]`: the eligibility set of each row (-1: no restriction);
- `excluded_item_ids` int64 `[B, E]`: catalogue item ids the row must not
  return (-1 padding; any E, ids outside the catalogue are ignored).

TF Serving signatures have no optional inputs, so `serving_default` stays
exactly as it was (clients that never restrict see no change). The graph maps
the item ids to member numbers itself (a sorted item-id table held as two
variables and a binary search) and checks the set ids, so a client sends the
same item ids the business rules speak in.

`refresh_eligibility` publishes a new version of a served model where only
the eligibility variables differ: the graph and the warmup records are
copied, the checkpoint links the source's data shards and writes only the
new set tensors (`checkpoint_patch`), the result is read back, and the
version is renamed into place like `publish`. That is seconds where a
re-export retraces the whole model and rewrites the whole index.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import shutil
import time
from typing import Mapping

import numpy as np
import tensorflow as tf

from static_keras.export import checkpoint_patch
from static_keras.export.leftovers import DEFAULT_STALE_AFTER_SECONDS
from static_keras.export.metadata import METADATA_FILENAME
from static_keras.export.metadata import read_metadata
from static_keras.export.model_layers import beam_searches
from static_keras.index.eligibility import EligibilitySets
from static_keras.index.member_catalogue import MemberCatalogue
from static_keras.layers import eligibility_step

ELIGIBLE_SIGNATURE = "serving_eligible"
SET_ID_INPUT = "set_id"
EXCLUDED_INPUT = "excluded_item_ids"
#: Weights of a semantic-ID layer derived from the sets, and what they derive from.
DENSE_MASKS, DENSE_BOUNDARIES = "eligibility_dense", "dense_boundaries"
#: The exclusion tables on the serving module: `module.<attribute>[name]`.
TABLES_ATTRIBUTE = "eligibility_tables"
TABLE_IDS = "eligibility_sorted_item_ids"
TABLE_MEMBERS = "eligibility_sorted_members"
_CHECKPOINT_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"


def eligible_search(model):
    """The model's `ConstrainedBeamSearch` whose constraint holds eligibility
    sets, or None (no sets: no eligible signature)."""
    found = [
        search
        for search in beam_searches(model)
        if search.constraint is not None and search.constraint.num_eligibility_sets
    ]
    if len(found) > 1:
        raise ValueError(
            f"The model holds {len(found)} searches with eligibility sets; an eligible "
            "signature needs exactly one"
        )
    return found[0] if found else None


def exclusion_tables(constraint) -> dict[str, tf.Variable]:
    """Sorted item ids and their members, as variables (never graph constants)."""
    ids, members = constraint.catalogue()._ascending()
    return {
        TABLE_IDS: tf.Variable(ids, trainable=False, name=TABLE_IDS),
        TABLE_MEMBERS: tf.Variable(members.astype(np.int32), trainable=False, name=TABLE_MEMBERS),
    }


def excluded_members(item_ids, sorted_ids, sorted_members, num_members: int) -> tf.Tensor:
    """int32 `[B, E]`: each row's excluded members, sorted, repeats and ids
    outside the catalogue replaced by `num_members` (the padding the decode
    step expects: it subtracts each excluded member once).

    An item id that names several members (an index built with duplicate
    ids) excludes the first of them.
    """
    ids = tf.cast(item_ids, tf.int64)
    flat = tf.reshape(ids, [1, -1])
    position = tf.searchsorted(sorted_ids[None], flat, side="left")
    position = tf.minimum(position, tf.shape(sorted_ids, out_type=position.dtype)[0] - 1)
    found = (tf.gather(sorted_ids, position) == flat) & (flat >= 0)
    members = tf.where(found, tf.gather(sorted_members, position), num_members)
    members = tf.sort(tf.reshape(members, tf.shape(ids)), axis=-1)
    previous = tf.concat([tf.fill(tf.shape(members[:, :1]), -1), members], axis=1)[:, :-1]
    return tf.where(members == previous, num_members, members)


def check_batch(name: str, tensor: tf.Tensor, batch: tf.Tensor) -> tf.Tensor:
    """`tensor`, once its leading dimension is known to be `batch`."""
    check = tf.debugging.Assert(
        tf.equal(tf.shape(tensor)[0], batch),
        [f"Input {name!r}: `{name}` must have one row per batch row: expected", batch,
         "rows. Received rows:", tf.shape(tensor)[0]],
    )  # fmt: skip
    with tf.control_dependencies([check]):
        return tf.identity(tensor)


def check_width(name: str, tensor: tf.Tensor, most: int) -> tf.Tensor:
    """`tensor` `[B, E]`, once `E <= most` is known (the step's search of a
    row's exclusions covers that many when E is not static)."""
    check = tf.debugging.Assert(
        tf.less_equal(tf.shape(tensor)[1], most),
        [f"Input {name!r} may hold at most {most} ids per row; received", tf.shape(tensor)[1]],
    )
    with tf.control_dependencies([check]):
        return tf.identity(tensor)


def signature_metadata(search, variable_keys: Mapping[str, str]) -> dict:
    """What `refresh_eligibility` needs to find and check the set variables."""
    constraint = search.constraint
    metadata = {
        "signature": ELIGIBLE_SIGNATURE,
        "inputs": [SET_ID_INPUT, EXCLUDED_INPUT],
        "num_members": constraint.layout.num_members,
        "has_item_ids": constraint.has_item_ids,
        "catalogue_fingerprint": constraint.catalogue_fingerprint(),
        "variables": dict(variable_keys),
    }
    if DENSE_MASKS in variable_keys:  # derived from the sets: a refresh rewrites them too
        layout = constraint.layout
        metadata["dense_masks"] = {
            "vocab_size": layout.vocab_size,
            "dense_levels": layout.dense_levels,
            # Depths past these derive their rows at decode time: not stored.
            "stored_levels": constraint.eligibility_windows.count(0),
        }
    return metadata


# Refresh ---------------------------------------------------------------------


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


def _checkpoint_key(*path: str) -> str:
    """The checkpoint key of `module.<path>` (TF escapes "." and "/" in names)."""
    escaped = (part.replace(".", "..").replace("/", ".S") for part in path)
    return "/".join(escaped) + _CHECKPOINT_SUFFIX


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
    reader = tf.train.load_checkpoint(os.path.join(path, "variables", "variables"))
    ids = reader.get_tensor(_checkpoint_key(TABLES_ATTRIBUTE, TABLE_IDS))
    members = reader.get_tensor(_checkpoint_key(TABLES_ATTRIBUTE, TABLE_MEMBERS))
    catalogue = MemberCatalogue.from_sorted(
        ids, members, info["num_members"], has_item_ids=info.get("has_item_ids", True)
    )
    if catalogue.fingerprint != info["catalogue_fingerprint"]:
        raise ValueError(f"{path!r}: the exclusion table does not match its metadata")
    keys = info["variables"]
    words, directory = (
        reader.get_tensor(_checkpoint_key("model_variables", keys[name])).view(np.uint32)
        for name in ("eligibility_words", "eligibility_directory")
    )
    return EligibilitySets(metadata["eligibility_sets"], words, directory, catalogue)


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

    Args:
        model_base_path: the directory TF Serving polls (versions `1`, `2`, ...).
        eligibility_sets: an `EligibilitySets` over the served index (same
            names, same catalogue), or `{name: item ids}` for the sets to
            rebuild (the others keep their current members).
        source_version: the version to copy; defaults to the newest that
            loads (`newest_good_version`: a rejected newer one is moved out
            of the integer namespace, as `publish` does).
        version: the new version number; defaults to one above every
            version (as in `publish`).
        keep, stale_after_seconds: as in `publish`.
        check: bool. Read the new checkpoint back with TensorFlow's reader
            (every tensor's checksum, the new values) before the version
            becomes visible. The graph, the warmup records and every other
            tensor are the source version's bytes, and the source loaded and
            warmed up, so the job does not load the refreshed version again:
            the server's load is the only one (a server that rejects it
            keeps the old version serving). Defaults to True.

    Returns:
        `EligibilityRefreshInfo`.
    """
    # Imported here: publish imports the export, and `static_keras.export.publish`
    # names the function once the package is imported.
    publish_module = importlib.import_module("static_keras.export.publish")

    start = time.perf_counter()
    base = os.fspath(model_base_path)
    existing = publish_module.list_versions(base)
    if not existing:
        raise ValueError(f"No versions under {base!r} to refresh")
    if source_version is None:
        source_version = publish_module.newest_good_version(base)
        if source_version is None:
            raise ValueError(
                f"No version under {base!r} loads (versions: {existing}): publish a good "
                "version before refreshing its sets"
            )
    if source_version not in existing:
        raise ValueError(f"No version {source_version} under {base!r} (versions: {existing})")
    version = publish_module.new_version(base, existing, version, keep)

    source = os.path.join(base, str(source_version))
    metadata = read_metadata(source)
    current = read_eligibility(source)
    sets = _new_sets(current, eligibility_sets)

    def write(staging):
        # Everything but the checkpoint is copied (small files); the
        # checkpoint links the source's shards and writes only the new sets.
        shutil.copytree(source, staging, ignore=_top_level("variables"))
        info = metadata["eligibility"]
        replaced = _rewrite_checkpoint(
            source, staging, info["variables"], sets, info.get("dense_masks")
        )
        metadata["eligibility_refresh"] = {
            "source_version": source_version,
            "refreshed_unix": time.time(),
            "sizes": sets.sizes(),
        }
        with open(os.path.join(staging, "assets", METADATA_FILENAME), "w") as file:
            json.dump(metadata, file, indent=2, sort_keys=True)
        _refresh_fingerprint(staging)
        if check:
            _verify_checkpoint(source, staging, replaced)

    staged = publish_module.publish_staged(
        base,
        version,
        write,
        keep=keep,
        xla=bool(metadata.get("xla")),
        check=False,
        verified=check,
        stale_after_seconds=stale_after_seconds,
        what="The refreshed version",
    )
    return EligibilityRefreshInfo(
        version=version,
        path=staged.path,
        source_version=source_version,
        sizes=sets.sizes(),
        removed_versions=staged.removed_versions,
        rejected_versions=staged.rejected_versions,
        seconds=time.perf_counter() - start,
    )


def _top_level(name: str):
    """A `copytree` ignore function that skips `name` at the top only."""
    top = []

    def ignore(folder, names):
        if not top:
            top.append(folder)
        return [name] if folder == top[0] and name in names else []

    return ignore


def _refresh_fingerprint(saved_model_dir: str) -> None:
    """Rewrites `fingerprint.pb` (if the copy has one) for the new checkpoint:
    the copied one hashes the source's variables, and a server that logs or
    compares fingerprints would take the refresh for its source."""
    path = os.path.join(saved_model_dir, "fingerprint.pb")
    if not os.path.exists(path):
        return
    # TF's own writer (what `tf.saved_model.save` calls); the staging
    # directory is renamed into place only after this.
    from tensorflow.python.saved_model import fingerprinting_utils

    os.remove(path)
    fingerprinting_utils.write_fingerprint(saved_model_dir)
    if not os.path.exists(path):
        raise RuntimeError(f"Could not rewrite {path} for the refreshed checkpoint")


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
    source = os.path.join(source_dir, "variables", "variables")
    reader = tf.train.load_checkpoint(source)
    arrays = sets.device_arrays()
    if dense is not None:
        held = {
            name: reader.get_tensor(_checkpoint_key("model_variables", keys[name]))
            for name in ("eligibility_words", DENSE_MASKS, DENSE_BOUNDARIES)
        }
        arrays[DENSE_MASKS] = eligibility_step.dense_eligibility_masks(
            dense["vocab_size"],
            dense["dense_levels"],
            held[DENSE_BOUNDARIES],
            sets,
            (held["eligibility_words"], held[DENSE_MASKS]),  # unchanged sets keep theirs
            stored_levels=dense.get("stored_levels"),  # absent before derived rows: all
        )
    replaced = {
        _checkpoint_key("model_variables", keys[name]): array for name, array in arrays.items()
    }
    os.makedirs(os.path.join(saved_model_dir, "variables"))
    checkpoint_patch.replace_tensors(
        source, os.path.join(saved_model_dir, "variables", "variables"), replaced
    )
    return replaced


def _verify_checkpoint(source_dir: str, saved_model_dir: str, replaced) -> None:
    """Reads the new checkpoint back with TensorFlow's own reader (what
    `LoadSavedModel` restores with; it checks every tensor's CRC-32C): the
    same tensors, dtypes and shapes as the source's, the replaced values as
    written. ValueError otherwise."""
    source = tf.train.load_checkpoint(os.path.join(source_dir, "variables", "variables"))
    new = tf.train.load_checkpoint(os.path.join(saved_model_dir, "variables", "variables"))
    if (
        new.get_variable_to_shape_map() != source.get_variable_to_shape_map()
        or new.get_variable_to_dtype_map() != source.get_variable_to_dtype_map()
    ):
        raise ValueError("The refreshed checkpoint does not hold the source's tensors")
    for key, value in replaced.items():
        if not np.array_equal(new.get_tensor(key), value):
            raise ValueError(f"The refreshed checkpoint reads back {key} differently")
