"""Where a published version keeps the tensors that jobs rewrite without TensorFlow.

A rules refresh and a catalogue delta read and write a SavedModel's tensors
straight from its checkpoint (`checkpoint_patch.py`), by checkpoint key. The
names below are the contract between the export that writes a version
(`saved_model.py`, `eligibility.py`) and the jobs that change it
(`eligibility_refresh.py`, `catalogue_update.py`): kept here, so that neither
imports the other for a name.
"""

from __future__ import annotations

import os

#: Weights of a semantic-ID layer derived from the sets, and what they derive from.
DENSE_MASKS, DENSE_BOUNDARIES = "eligibility_dense", "dense_boundaries"
#: The exclusion tables on the serving module: `module.<attribute>[name]`.
TABLES_ATTRIBUTE = "eligibility_tables"
TABLE_IDS = "eligibility_sorted_item_ids"
TABLE_MEMBERS = "eligibility_sorted_members"
#: The serving module's attribute that holds every model variable by its Keras path.
MODEL_VARIABLES = "model_variables"
_CHECKPOINT_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"
#: TensorFlow's fingerprint of a SavedModel, which hashes its checkpoint index.
FINGERPRINT = "fingerprint.pb"


def checkpoint_key(*path: str) -> str:
    """The checkpoint key of `module.<path>` (TF escapes "." and "/" in names)."""
    escaped = (part.replace(".", "..").replace("/", ".S") for part in path)
    return "/".join(escaped) + _CHECKPOINT_SUFFIX


def checkpoint_prefix(saved_model_dir: str) -> str:
    """The path prefix of a SavedModel's checkpoint (`.index`, `.data-*`)."""
    return os.path.join(saved_model_dir, "variables", "variables")


def top_level_only(*skipped: str):
    """A `copytree` ignore function that skips `skipped` names at the top only."""
    top = []

    def ignore(folder, names):
        if not top:
            top.append(folder)
        return [name for name in skipped if name in names] if folder == top[0] else []

    return ignore
