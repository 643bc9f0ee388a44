"""Which index a served version holds: `assets/static_keras_index.json`."""

from __future__ import annotations

import json
import os

import numpy as np

from static_keras import __version__
from static_keras.index import serialization
from static_keras.index.static_index import StaticIndex
from static_keras.layers.constrained_decoding import ConstrainedDecoding

METADATA_FILENAME = "static_keras_index.json"


def index_from_layer(layer: ConstrainedDecoding) -> StaticIndex:
    """The `StaticIndex` whose arrays a constraint layer holds."""
    arrays = {
        name: np.asarray(weight.numpy() if hasattr(weight, "numpy") else weight)
        for name, weight in layer.index_weights.items()
    }
    shapes = layer.layout.array_shapes()
    arrays = {name: arrays[name].astype(shapes[name][1], copy=False) for name in shapes}
    return StaticIndex(layer.layout, arrays)


def model_metadata(model) -> dict:
    """Metadata of every index inside `model` (usually exactly one)."""
    indexes = []
    for layer in model._flatten_layers():
        if isinstance(layer, ConstrainedDecoding):
            index = index_from_layer(layer)
            entry = serialization.metadata(index.layout, index.arrays)
        elif hasattr(layer, "index_metadata"):  # e.g. StringConstrainedDecoding
            entry = layer.index_metadata()
        else:
            continue
        entry["layer"] = layer.path if hasattr(layer, "path") else layer.name
        indexes.append(entry)
    return {
        "static_keras_version": __version__,
        "index_format_version": serialization.FORMAT_VERSION,
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
