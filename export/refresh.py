"""Index-only refresh: the same decoder weights over a new valid set."""

from __future__ import annotations

import logging

import keras

from static_keras.decoding.constrained_beam_search import ConstrainedBeamSearch
from static_keras.export.model_layers import beam_searches
from static_keras.index.automaton import TokenAutomaton
from static_keras.index.eligibility import EligibilitySets

logger = logging.getLogger("static_keras.export")


def replace_index(
    model: keras.Model, index: TokenAutomaton, *, eligibility: EligibilitySets | None = None
) -> keras.Model:
    """A copy of `model` whose `ConstrainedBeamSearch` decodes over `index`.

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


def _copy_with(model: keras.Model, old: ConstrainedBeamSearch, new: ConstrainedBeamSearch):
    """`clone_model(model, clone_function=lambda l: new if l is old else l)`,
    without tracing the beam search again.

    Calling `new` on the copy's symbolic inputs would trace the whole search
    (every decoder step: most of a swap's time) only to find
    the output specs `old` already has: the search's outputs are fixed by
    its settings, its decoder (both the same here), and its constraint's
    length and item ids (checked). So `new` is called as usual (build,
    node, masks), its output spec taken from `old`'s node. Where `old` is
    called more than once, on other input specs, or the constraints'
    weights differ in kind or dtype, `new` is traced as `clone_model` does.
    """
    clone = lambda layer: new if layer is old else layer  # noqa: E731
    nodes = [
        node
        for depth in getattr(model, "_nodes_by_depth", {}).values()
        for node in depth
        if node.operation is old
    ]
    if (
        isinstance(model, keras.Sequential)
        or len(nodes) != 1
        or any(x.sparse or x.ragged for x in nodes[0].outputs)
        or not _same_outputs(old, new)
    ):
        return keras.models.clone_model(model, clone_function=clone)
    (node,) = nodes
    specs = [(x.shape, x.dtype) for x in node.outputs]
    inputs = _specs(node.arguments.keras_tensors)

    def known_outputs(*args, **kwargs):
        outputs = [keras.KerasTensor(shape, dtype=dtype) for shape, dtype in specs]
        return outputs if len(outputs) > 1 else outputs[0]

    def call(layer, *args, **kwargs):
        if layer is not new or _specs(keras.tree.flatten((args, kwargs))) != inputs:
            return layer(*args, **kwargs)
        # Untracked, and only for this call: `Layer.__call__` asks it for
        # the outputs of a symbolic call.
        object.__setattr__(new, "compute_output_spec", known_outputs)
        try:
            return new(*args, **kwargs)
        finally:
            object.__delattr__(new, "compute_output_spec")

    return keras.models.clone_model(model, clone_function=clone, call_function=call)


def _same_outputs(old: ConstrainedBeamSearch, new: ConstrainedBeamSearch) -> bool:
    """Whether `new` returns what `old` does (same settings and decoder,
    and the same index weights, by name and dtype: item ids included)."""
    settings = ("decoder", "beam_size", "num_results", "dense_top_k", "length")
    settings += ("distinct_items", "outputs")
    if type(new) is not type(old) or any(
        getattr(new, name) is not getattr(old, name) and getattr(new, name) != getattr(old, name)
        for name in settings
    ):
        return False
    a, b = old.constraint, new.constraint
    dtypes = lambda c: {name: w.dtype for name, w in c.index_weights.items()}  # noqa: E731
    return (
        type(a) is type(b)
        and (a.length, a.vocab_size, a.eos_token_id) == (b.length, b.vocab_size, b.eos_token_id)
        and a.has_item_ids == b.has_item_ids
        and dtypes(a) == dtypes(b)
    )


def _specs(values) -> list:
    """Shape, dtype, sparse and ragged of each KerasTensor in `values`."""
    return [
        (tuple(x.shape), x.dtype, x.sparse, x.ragged)
        for x in values
        if isinstance(x, keras.KerasTensor)
    ]


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
