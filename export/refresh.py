"""Index-only refresh: the same decoder weights over a new valid set."""

from __future__ import annotations

import keras

from static_keras.decoding.constrained_beam_search import ConstrainedBeamSearch
from static_keras.index.static_index import StaticIndex


def replace_index(model: keras.Model, index: StaticIndex) -> keras.Model:
    """A copy of `model` whose `ConstrainedBeamSearch` decodes over `index`.

    Every other layer (the decoder included) is shared with `model`, so the
    copy holds the same decoder weights; only the index tensors are new (and
    may have other shapes: a new catalogue is a new layout). Publish the copy
    as a new version for a daily refresh (fresh items, stock, regions).
    """
    layers = model._flatten_layers()
    searches = [layer for layer in layers if isinstance(layer, ConstrainedBeamSearch)]
    if len(searches) != 1:
        raise ValueError(
            f"The model must hold exactly one ConstrainedBeamSearch; found {len(searches)}"
        )
    (old,) = searches
    if old.constraint is None:
        raise ValueError("The model's search is unconstrained; it has no index to replace")
    for name in ("vocab_size", "length"):
        if getattr(index, name) != getattr(old.constraint, name):
            raise ValueError(
                f"The new index does not match the model: {name} is "
                f"{getattr(index, name)} in the index and {getattr(old.constraint, name)} "
                "in the model"
            )
    new = ConstrainedBeamSearch(
        index,
        old.decoder,
        beam_size=old.beam_size,
        num_results=old.num_results,
        dense_top_k=old.dense_top_k,
        name=old.name,
    )
    return keras.models.clone_model(
        model, clone_function=lambda layer: new if layer is old else layer
    )
