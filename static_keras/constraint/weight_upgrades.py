"""Loading weights that files of earlier versions saved: one explicit step.

A `ConstrainedDecoding` layer saves its weights by position (Keras keeps a
layer's own variables as "0", "1", ...). Weights added since a file was
written are missing from it, always the last ones of their kind; each
follows from weights the file did save, so `upgraded_store` computes them
and returns the store as this version writes it. The versions, oldest first
(tests/test_release_files.py, tests/test_eligibility_decoding.py and
tests/test_dense_edge_rows.py load each):

1. no `dense_member_codes` (each member's depth-d code, for a request's
   exclusions): derived from `dense_boundaries`;
2. no dense edge rows (`dense_edge_rows`): derived from `dense_states`;
3. release 0.1 (this layout).
"""

from __future__ import annotations

import numpy as np

from static_keras.constraint import dense_edge_rows
from static_keras.index import dense_eligibility


def upgraded_store(layer, store):
    """`store` (a `load_own_variables` store) with the weights its version
    lacks filled in, in this version's order; `store` itself if complete."""
    codes = layer.member_range_weights.get("dense_member_codes")
    later = [w for w in (codes, *layer.derived_index_weights.values()) if w is not None]
    own = list(layer.weights)
    missing = len(own) - len(store.keys())
    if not 0 < missing <= len(later):
        return store  # this version's file (or a mismatch Keras itself reports)
    absent = {id(w) for w in later[len(later) - missing :]}
    saved = [w for w in own if id(w) not in absent]
    value = {id(w): np.asarray(store[str(i)]) for i, w in enumerate(saved)}
    if id(codes) in absent:  # version 1
        table = value[id(layer.member_range_weights["dense_boundaries"])]
        value[id(codes)] = dense_eligibility.dense_member_codes(layer.layout, table)
    if layer.derived_index_weights:  # versions 1 and 2
        states = value[id(layer.index_weights["dense_states"])]
        derived = dense_edge_rows.arrays(layer.layout, states)
        for name, weight in layer.derived_index_weights.items():
            value.setdefault(id(weight), derived[name])
    return {str(i): value[id(w)] for i, w in enumerate(own)}
