"""Per-request eligibility in a served model: the `serving_eligible` signature.

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

The eligibility-only refresh of a published version is
`eligibility_refresh` (no TensorFlow).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import tensorflow as tf

from static_keras.constraint.eligibility_request import Eligibility
from static_keras.export.input_checks import check_batch
from static_keras.export.input_checks import check_ids
from static_keras.export.input_checks import check_width
from static_keras.export.model_layers import beam_searches
from static_keras.export.served_tensors import TABLE_IDS
from static_keras.export.served_tensors import TABLE_MEMBERS
from static_keras.index.member_catalogue import exclusion_table_digest
from static_keras.kernels import execution_plan
from static_keras.kernels.eligibility_kernels import MAX_DYNAMIC_EXCLUDED

ELIGIBLE_SIGNATURE = "serving_eligible"
SET_ID_INPUT = "set_id"
EXCLUDED_INPUT = "excluded_item_ids"


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


def exclusion_tables(search) -> dict[str, tf.Variable]:
    """Sorted item ids and their members, as variables (never graph
    constants) that take the table's buffers (no conversion copies)."""
    ids, members = search.constraint.catalogue().exclusion_table()
    value = execution_plan.current().primitives.weight_value
    return {
        TABLE_IDS: tf.Variable(value(ids), trainable=False, name=TABLE_IDS),
        TABLE_MEMBERS: tf.Variable(
            value(members.astype(np.int32, copy=False)), trainable=False, name=TABLE_MEMBERS
        ),
    }


def excluded_members(item_ids, sorted_ids, sorted_members, num_members: int) -> tf.Tensor:
    """int32 `[B, E]`: each row's excluded members, sorted, repeats and ids
    outside the catalogue replaced by `num_members` (the padding the decode
    step expects: it subtracts each excluded member once).

    An item id that names several members (an index built with duplicate
    ids) excludes the first of them.
    """
    # Reads first: a gather on the variables themselves would put them in
    # copy-on-read mode, and the search's read would copy the whole table
    # (N int64s) on every request (`gather.take`).
    sorted_ids = tf.convert_to_tensor(sorted_ids)
    sorted_members = tf.convert_to_tensor(sorted_members)
    ids = tf.cast(item_ids, tf.int64)
    flat = tf.reshape(ids, [1, -1])
    position = tf.searchsorted(sorted_ids[None], flat, side="left")
    position = tf.minimum(position, tf.shape(sorted_ids, out_type=position.dtype)[0] - 1)
    found = (tf.gather(sorted_ids, position) == flat) & (flat >= 0)
    members = tf.where(found, tf.gather(sorted_members, position), num_members)
    members = tf.sort(tf.reshape(members, tf.shape(ids)), axis=-1)
    previous = tf.concat([tf.fill(tf.shape(members[:, :1]), -1), members], axis=1)[:, :-1]
    return tf.where(members == previous, num_members, members)


def request_eligibility(search, tables, request: Mapping[str, tf.Tensor], batch) -> Eligibility:
    """The search's `Eligibility` from a request's `set_id` and
    `excluded_item_ids` (checked: set ids in `[-1, num_sets)`, a row per
    batch row, at most `MAX_DYNAMIC_EXCLUDED` ids a row; item ids mapped to
    member numbers with `tables`, those outside the catalogue dropped)."""
    constraint = search.constraint
    set_ids = check_ids(
        SET_ID_INPUT, request[SET_ID_INPUT], -1, constraint.num_eligibility_sets,
        "-1: no set, else a set id",
    )  # fmt: skip
    set_ids = check_batch(SET_ID_INPUT, set_ids, batch)
    excluded_ids = check_batch(EXCLUDED_INPUT, request[EXCLUDED_INPUT], batch)
    excluded_ids = check_width(EXCLUDED_INPUT, excluded_ids, MAX_DYNAMIC_EXCLUDED)
    excluded = excluded_members(
        excluded_ids, tables[TABLE_IDS], tables[TABLE_MEMBERS], constraint.layout.num_members
    )
    return Eligibility(set_ids, excluded)


def signature_metadata(search, variable_keys: Mapping[int, str], tables: Mapping) -> dict:
    """What `refresh_eligibility` needs to find and check the set variables:
    the checkpoint keys (`variable_keys`: by `id` of each variable's value)
    of the variables the constraint says a refresh rewrites or reads
    (`eligibility_refresh_spec`), by role, how derived ones are made, and
    the digest binding the exclusion table (`tables`) to the catalogue's
    fingerprint."""
    constraint = search.constraint
    spec = constraint.eligibility_refresh_spec()
    weights = {**spec["rewrites"], **spec["reads"]}
    fingerprint = constraint.catalogue_fingerprint()
    view = execution_plan.current().primitives.host_array  # no copies of the table
    metadata = {
        "signature": ELIGIBLE_SIGNATURE,
        "inputs": [SET_ID_INPUT, EXCLUDED_INPUT],
        "num_members": constraint.layout.num_members,
        "has_item_ids": constraint.has_item_ids,
        "catalogue_fingerprint": fingerprint,
        "table_digest": exclusion_table_digest(
            fingerprint, view(tables[TABLE_IDS]), view(tables[TABLE_MEMBERS])
        ),
        "variables": {role: variable_keys[id(w.value)] for role, w in weights.items()},
    }
    if spec["derive"] is not None:  # derived from the sets: a refresh rewrites them too
        metadata["dense_masks"] = dict(spec["derive"])
    return metadata
