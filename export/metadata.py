"""Which index a served version holds: `assets/static_keras_index.json`."""

from __future__ import annotations

import json
import os

import numpy as np

from static_keras import __version__
from static_keras.index import archive
from static_keras.index.static_index import StaticIndex

METADATA_FILENAME = "static_keras_index.json"


def index_from_layer(layer) -> StaticIndex:
    """The `StaticIndex` whose arrays a semantic-ID constraint layer holds.

    (A string layer holds only the device arrays, not the member strings, so
    its `index_metadata()` describes it instead.)
    """
    # Keras is imported here: `read_metadata` serves jobs without it.
    from static_keras.layers.constrained_decoding import ConstrainedDecoding

    if not isinstance(layer, ConstrainedDecoding):
        raise ValueError(
            f"`layer` must be a ConstrainedDecoding layer. Received: {type(layer).__name__}"
        )
    return StaticIndex(layer.layout, layer.index_arrays())


def model_metadata(model) -> dict:
    """Metadata of every index inside `model` (usually exactly one)."""
    from static_keras.export.model_layers import constraints

    indexes = []
    for layer in constraints(model):
        entry = layer.index_metadata()
        entry["layer"] = layer.path
        indexes.append(entry)
    return {
        "static_keras_version": __version__,
        "index_format_version": archive.FORMAT_VERSION,
        "indexes": indexes,
        "num_variables": len(model.variables),
        "variable_bytes": int(
            sum(np.prod(v.shape) * np.dtype(v.dtype).itemsize for v in model.variables)
        ),
    }


def read_metadata(saved_model_dir: str | os.PathLike) -> dict:
    """Reads the metadata of an exported version directory."""
    path = os.path.join(os.fspath(saved_model_dir), "assets", METADATA_FILENAME)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"No static-keras metadata at {path!r}")
    with open(path) as file:
        return json.load(file)


def catalogue_update_metadata(model, variable_keys) -> dict | None:
    """What `update_catalogue` needs to write a new catalogue into an
    exported version: the checkpoint key of every weight the semantic-ID
    constraint derives from its index (`variable_keys`: by `id` of each
    variable), and its eligibility windows. None unless exactly one
    constraint's index has headroom (an exact layout takes no other
    catalogue without a new graph)."""
    from static_keras.export.model_layers import constraints

    roomy = [c for c in constraints(model) if getattr(c.layout, "has_headroom", False)]
    if len(roomy) != 1:
        return None
    (layer,) = roomy
    groups = (layer.index_weights, layer.derived_index_weights, layer.member_range_weights)
    return {
        "layer": layer.path,
        "eligibility_windows": list(getattr(layer, "eligibility_windows", ())),
        "catalogue_fingerprint": layer.catalogue_fingerprint(),
        "variables": {
            name: variable_keys[id(weight.value)]
            for group in groups
            for name, weight in group.items()
        },
    }
