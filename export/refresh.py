"""Index-only refresh: the same decoder weights over a new valid set."""

from __future__ import annotations

import gc
import json
import logging
import os
import shutil
import tempfile
import zipfile

import keras

from static_keras import saving
from static_keras.constraint import index_weights
from static_keras.decoding.constrained_beam_search import ConstrainedBeamSearch
from static_keras.export import direct_io
from static_keras.export.model_layers import beam_searches
from static_keras.index.automaton import TokenAutomaton
from static_keras.index.eligibility import EligibilitySets

logger = logging.getLogger("static_keras.export")


def replace_index(
    model: keras.Model | str | os.PathLike,
    index: TokenAutomaton,
    *,
    eligibility: EligibilitySets | None = None,
) -> keras.Model:
    """A copy of `model` whose `ConstrainedBeamSearch` decodes over `index`.

    `model` may be the path of a `.keras` file (ValueError naming `model`
    for any other file): the model it holds is loaded without its index
    (the daily catalogue job never holds the old index beside the new one:
    only the member item ids and sets are read, and only when `eligibility`
    is None and the model holds sets, to carry them over).

    Every other layer (the decoder included) is shared with `model`, so the
    copy holds the same decoder weights; only the index tensors are new (and
    may have other shapes: a new catalogue is a new layout). Either kind of
    index (`StaticIndex`, `StringIndex`), of the kind the model holds. The
    search keeps every setting of the old one (beam size, results, tokens
    per beam, distinct items, outputs). Publish the copy as a new version
    for a daily refresh (fresh items, stock, regions).

    Eligibility sets are never dropped: when the model's constraint holds
    sets, the copy holds them too (so its export keeps `serving_eligible`),
    carried over to the new index by item id (`EligibilitySets.carried_over`:
    items no longer in the catalogue drop out of every set, new items are in
    none; the counts are logged), or the sets given as `eligibility`.

    Args:
        model: a functional Keras model holding one `ConstrainedBeamSearch`.
        index: the new `TokenAutomaton`.
        eligibility: `EligibilitySets` over `index`, or None to carry the
            model's sets over (ValueError, saying to pass this, where they
            cannot be: an index without item ids). Needs a model with sets.

    Returns:
        The new model.
    """
    if not isinstance(index, TokenAutomaton):
        raise ValueError(
            "`index` must be a TokenAutomaton (StaticIndex, StringIndex). "
            f"Received: {type(index).__name__}"
        )
    if isinstance(model, (str, os.PathLike)):
        loaded = load_model_without_index(model, carry_sets=eligibility is None)
        new = replace_index(loaded, index, eligibility=eligibility)
        del loaded
        gc.collect()  # the old constraint's weights (Keras layers hold cycles)
        return new
    searches = beam_searches(model)
    if len(searches) != 1:
        raise ValueError(
            f"The model must hold exactly one ConstrainedBeamSearch; found {len(searches)}"
        )
    (old,) = searches
    if old.constraint is None:
        raise ValueError("The model's search is unconstrained; it has no index to replace")
    if not isinstance(index, old.constraint.index_class):
        raise ValueError(
            f"The model decodes over a {old.constraint.index_class.__name__}; the new index "
            f"is a {type(index).__name__}"
        )
    for name, new_value, old_value in (
        ("vocab_size", index.vocab_size, old.constraint.vocab_size),
        ("length", index.length, old.constraint.length),
        ("eos_token_id", index.eos_token_id, old.constraint.eos_token_id),
        # The outputs differ (`item_ids` or not): the model's graph would not fit.
        ("has_item_ids", index.has_item_ids, old.constraint.has_item_ids),
    ):
        if new_value != old_value:
            raise ValueError(
                f"The new index does not match the model: {name} is {new_value} in the "
                f"index and {old_value} in the model"
            )
    sets = _sets_for_new_index(old.constraint, index, eligibility)
    config = old.get_config()
    constraint = type(old.constraint)(index, eligibility=sets, name=old.constraint.name)
    new = ConstrainedBeamSearch(
        decoder=old.decoder,
        constraint=constraint,
        beam_size=old.beam_size,
        num_results=old.num_results,
        dense_top_k=old.dense_top_k,
        distinct_items=old.distinct_items,
        outputs=old.outputs,
        name=config["name"],
    )
    return _copy_with(model, old, new)


#: The members of a `.keras` file (Keras 3's layout) this loader reads itself.
_CONFIG, _METADATA, _WEIGHTS = "config.json", "metadata.json", "model.weights.h5"


def load_model_without_index(path: str | os.PathLike, *, carry_sets: bool) -> keras.Model:
    """The model of a `.keras` file whose constraint's index is left unread,
    for `replace_index` to put a new one in its place at once (the index
    weights hold zeros that were never resident: not a model to decode with).
    With `carry_sets`, its member item ids and sets are read (what carries
    the sets over to the new index by item id).

    Keras reads a file's weights into memory whole when memory allows, a
    transient of up to twice the file (9 GB over a 4.9 GB `.keras` at 10^8
    items, measured), though most of it is the index this load skips. Here
    the weights file is copied out of the archive with direct I/O (no page
    cache, no memory: 0.4-0.5 s a GB on the benchmark machine) beside the
    model, and `load_weights` reads only what it loads. A file with assets or
    another layout goes through `keras.saving.load_model`.
    """
    path = os.fspath(path)
    if not zipfile.is_zipfile(path):  # False for a missing file too
        raise ValueError(
            f"`model` must be a Keras model or the path of a .keras file; {path!r} is not "
            "one (no such file, or not a zip archive: save one with model.save('m.keras'))"
        )
    with zipfile.ZipFile(path) as archive:
        names = set(archive.namelist())
        if _CONFIG not in names:
            raise ValueError(
                f"`model` {path!r} is a zip without Keras's {_CONFIG}: not a .keras file"
            )
        plain = _WEIGHTS in names and _CONFIG in names and names <= {_CONFIG, _METADATA, _WEIGHTS}
        with index_weights.replacing_index(carry_sets=carry_sets):
            if not plain:
                return saving.load_model(path)
            saving.register_layers()
            config = json.loads(archive.read(_CONFIG))
            config["compile_config"] = None  # a model to export: never trained here
            model = keras.saving.deserialize_keras_object(config)
            directory = _scratch_directory(path)
            try:
                weights = os.path.join(directory, _WEIGHTS)
                with archive.open(_WEIGHTS) as source, direct_io.SequentialWriter(weights) as out:
                    for chunk in iter(lambda: source.read(1 << 24), b""):
                        out.write(chunk)
                model.load_weights(weights)
            finally:
                shutil.rmtree(directory, ignore_errors=True)
    return model


def _scratch_directory(path: str) -> str:
    """A new directory beside `path` (its filesystem, as Keras extracts),
    else in the system's temporary directory."""
    try:
        return tempfile.mkdtemp(prefix=".static_keras_weights_", dir=os.path.dirname(path) or ".")
    except OSError:  # a read-only model directory
        return tempfile.mkdtemp(prefix="static_keras_weights_")


def _copy_with(model: keras.Model, old: ConstrainedBeamSearch, new: ConstrainedBeamSearch):
    """`model` with `new` in place of `old`, every other layer shared. The
    copy does not trace the beam search again: a built search knows its
    output specs from its settings (`ConstrainedBeamSearch.compute_output_spec`)."""
    return keras.models.clone_model(
        model, clone_function=lambda layer: new if layer is old else layer
    )


def _sets_for_new_index(constraint, index, eligibility) -> EligibilitySets | None:
    """The sets the new constraint holds: given, carried over, or none."""
    if eligibility is not None:  # the new layer checks its type and its index
        if not constraint.num_eligibility_sets:
            raise ValueError(
                "The model's constraint holds no eligibility sets; `eligibility` would add "
                "a signature the model was not built with: build the model with them"
            )
        return eligibility
    if not constraint.num_eligibility_sets:
        return None
    old_sets = constraint.eligibility_sets()
    sets = old_sets.carried_over(index)
    before, after = old_sets.sizes(), sets.sizes()
    logger.info(
        "eligibility sets carried over to the new index by item id: %s",
        ", ".join(f"{name} {before[name]:,} -> {after[name]:,}" for name in sets.names),
    )
    return sets
