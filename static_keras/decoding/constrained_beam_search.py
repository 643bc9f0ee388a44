"""`ConstrainedBeamSearch`: constrained beam search as a Keras 3 layer."""

from __future__ import annotations

import warnings

import keras
from keras import ops

from static_keras.api_export import static_keras_export
from static_keras.constraint.eligibility_request import Eligibility
from static_keras.decoding.beam_search import beam_search
from static_keras.index.automaton import TokenAutomaton
from static_keras.layers.automaton_constraint import AutomatonConstraint
from static_keras.layers.layer_classes import constraint_for
from static_keras.layers.layer_classes import layer_classes

#: What `call` returns, by the `outputs` argument.
OUTPUTS = ("dict", "scores_and_item_ids", "item_ids")


@static_keras_export
class ConstrainedBeamSearch(keras.layers.Layer):
    """Decodes the best valid sequences for each input row, inside a model.

    Wraps `beam_search` around a decoder layer so that a functional model
    maps context features (a user's history, a prompt) straight to the top
    valid sequences. The decoder follows the step contract:
    `decoder(prefix, state) -> (logits, state)`, with `prefix` int32
    `[rows, t]` and `state` a nest of tensors with leading dimension `rows`:
    `B` at the first step (one live beam per input row), `R = B * beam_size`
    after it (`beam_search` reorders the state by parent beam). If the
    decoder has a method `initial_state(context)`, it turns the context
    (`[B, ...]`) into the first state (for example: encode the history once
    and allocate a KV cache); otherwise the context itself is the state.

    Args:
        index: a `TokenAutomaton` (`StaticIndex`, `StringIndex`) or None.
            The valid set. None when `constraint` is given (as `from_config`
            does), or for an unconstrained search of `length` steps (the
            baseline the constraint is measured against).
        decoder: Keras layer or model following the step contract.
        beam_size: int. Beams kept per input row. Defaults to 10.
        num_results: int or None. Results per row, at most `beam_size`.
            Defaults to `beam_size`.
        dense_top_k: int or None. Tokens per beam at the steps after the
            first whose rows come from the vocabulary (`beam_search`).
            Defaults to `beam_size`.
        constraint: an `AutomatonConstraint` (`ConstrainedDecoding`,
            `StringConstrainedDecoding`) or None: the layer that holds the
            index weights; built from `index` when None.
        length: int or None. Steps of an unconstrained search (no index and
            no constraint); None otherwise.
        distinct_items: bool. Each member of a string set once, with its
            best tokenization (see `beam_search`). Defaults to True.
        outputs: `"dict"` (tokens, scores, item ids), `"scores_and_item_ids"`
            (the tuple `(scores, item_ids)` that keras-rs retrieval layers
            return) or `"item_ids"`. The last two need an index with item
            ids. Defaults to `"dict"`.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        context: tensor or nest of tensors with leading dimension B.
        eligibility: optional `static_keras.Eligibility`: `set_ids` int
            `[B]`, the eligibility set of each row (-1: none; needs a
            constraint with eligibility sets), and `excluded` int `[B, E]`,
            each row's excluded member numbers padded with `num_members`
            (`exclusion_members`); either may be None. Without it the search
            is the plain one (see `beam_search`'s `eligibility`). The served
            signature `serving_eligible` passes each request's here
            (`static_keras.export.eligibility`). `set_ids=` and `excluded=`
            (release 0.1) still work, with a DeprecationWarning.

    Returns:
        `outputs="dict"`: `tokens` int32 `[B, K, L]`, `scores` float32
        `[B, K]`, and `item_ids` `[B, K]` when the index has item ids (see
        `beam_search`). `"scores_and_item_ids"`: `(scores, item_ids)`.
        `"item_ids"`: `item_ids`. Rows are sorted by score; padding has
        score `-inf` and item id -1.

    Example:

    >>> import numpy as np
    >>> from static_keras import StaticIndex
    >>> index = StaticIndex.build([[1, 2], [1, 3], [0, 2]], vocab_size=4)
    >>> class Uniform(keras.layers.Layer):
    ...     def call(self, prefix, state):
    ...         return keras.ops.zeros((keras.ops.shape(state)[0], 4)), state
    >>> search = ConstrainedBeamSearch(index, Uniform(), beam_size=3)
    >>> out = search(np.zeros((2, 1), "float32"))
    >>> np.asarray(out["tokens"]).shape
    (2, 3, 2)
    >>> rows = [[1, 2], [1, 3], [0, 2]]
    >>> with_ids = StaticIndex.build(rows, vocab_size=4, item_ids=[10, 11, 12])
    >>> search = ConstrainedBeamSearch(with_ids, Uniform(), beam_size=3,
    ...                                outputs="scores_and_item_ids")
    >>> scores, ids = search(np.zeros((1, 1), "float32"))
    >>> sorted(np.asarray(ids)[0].tolist())
    [10, 11, 12]
    """

    def __init__(
        self,
        index: TokenAutomaton | None = None,
        decoder: keras.layers.Layer | None = None,
        beam_size: int = 10,
        num_results: int | None = None,
        dense_top_k: int | None = None,
        constraint: AutomatonConstraint | None = None,
        length: int | None = None,
        distinct_items: bool = True,
        outputs: str = "dict",
        **kwargs,
    ):
        super().__init__(**kwargs)
        if decoder is None:
            raise ValueError("ConstrainedBeamSearch needs a `decoder` layer")
        if not isinstance(beam_size, int) or isinstance(beam_size, bool) or beam_size < 1:
            raise ValueError(
                f"`beam_size` must be a positive integer. Received: beam_size={beam_size!r}"
            )
        if num_results is not None and not 1 <= num_results <= beam_size:
            raise ValueError(
                f"`num_results` must lie in [1, beam_size={beam_size}]. "
                f"Received: num_results={num_results!r}"
            )
        if constraint is None and index is not None:
            constraint = constraint_for(index, name="constraint")
        elif constraint is not None:
            if not isinstance(constraint, AutomatonConstraint):
                raise ValueError(
                    "`constraint` must be an AutomatonConstraint layer. "
                    f"Received: {type(constraint).__name__}"
                )
            if index is not None:
                constraint.set_index(index)
        if (constraint is None) == (length is None):
            raise ValueError(
                "ConstrainedBeamSearch needs an `index` (constrained) or a "
                "`length` (unconstrained), not both"
            )
        if outputs not in OUTPUTS:
            raise ValueError(f"`outputs` must be one of {OUTPUTS}. Received: outputs={outputs!r}")
        if outputs != "dict" and (constraint is None or not constraint.has_item_ids):
            raise ValueError(
                f"outputs={outputs!r} needs an index with item ids; this search has "
                + ("no index" if constraint is None else "an index built without `item_ids`")
            )
        self.decoder = decoder
        self.constraint = constraint
        self.beam_size = beam_size
        self.num_results = num_results
        self.dense_top_k = dense_top_k
        self.length = length
        self.distinct_items = bool(distinct_items)
        self.outputs = outputs

    def build(self, input_shape=None):
        self.built = True

    def compute_output_spec(self, context, set_ids=None, excluded=None, *, eligibility=None):
        """The outputs of a symbolic call, from the settings alone.

        They are fixed by the batch size, `num_results`, the constraint's
        length and item-id dtype, so building a functional model (or the
        served signature's copy of one) does not trace the whole search a
        second time. Until the decoder and the constraint are built, the
        search is traced as Keras does (that trace builds them).
        """
        parts = [self.decoder] + ([] if self.constraint is None else [self.constraint])
        if not all(part.built for part in parts):
            return super().compute_output_spec(context, set_ids, excluded, eligibility=eligibility)
        batch = keras.tree.flatten(context)[0].shape[0]
        results = self.num_results or self.beam_size
        length = self.length if self.constraint is None else self.constraint.length
        spec = {
            "tokens": keras.KerasTensor((batch, results, length), dtype="int32"),
            "scores": keras.KerasTensor((batch, results), dtype="float32"),
        }
        if self.constraint is not None and self.constraint.has_item_ids:
            ids = self.constraint.index_weights[self.constraint.layout.member_ids_array]
            spec["item_ids"] = keras.KerasTensor((batch, results), dtype=ids.dtype)
        if self.outputs == "scores_and_item_ids":
            return spec["scores"], spec["item_ids"]
        if self.outputs == "item_ids":
            return spec["item_ids"]
        return spec

    def call(self, context, set_ids=None, excluded=None, *, eligibility=None):
        if set_ids is not None or excluded is not None:
            if eligibility is not None:
                raise ValueError("Pass `eligibility` or `set_ids`/`excluded`, not both")
            warnings.warn(
                "ConstrainedBeamSearch(...)(context, set_ids=..., excluded=...) is deprecated: "
                "pass eligibility=static_keras.Eligibility(set_ids=..., excluded=...)",
                DeprecationWarning,
                stacklevel=2,
            )
            eligibility = Eligibility(set_ids, excluded)
        batch_size = ops.shape(keras.tree.flatten(context)[0])[0]
        # One row per input row: the first step has one live beam each, and
        # `beam_search` repeats the state by parent beam after it.
        if hasattr(self.decoder, "initial_state"):
            state = self.decoder.initial_state(context)
        else:
            state = context
        found = beam_search(
            self.constraint,
            self.decoder,
            batch_size,
            self.beam_size,
            initial_state=state,
            num_results=self.num_results,
            dense_top_k=self.dense_top_k,
            length=self.length,
            distinct_items=self.distinct_items,
            eligibility=eligibility,
        )
        if self.outputs == "scores_and_item_ids":
            return found["scores"], found["item_ids"]
        if self.outputs == "item_ids":
            return found["item_ids"]
        return found

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "decoder": keras.saving.serialize_keras_object(self.decoder),
                "constraint": (
                    None
                    if self.constraint is None
                    else keras.saving.serialize_keras_object(self.constraint)
                ),
                "length": self.length,
                "beam_size": self.beam_size,
                "num_results": self.num_results,
                "dense_top_k": self.dense_top_k,
                "distinct_items": self.distinct_items,
                "outputs": self.outputs,
            }
        )
        return config

    @classmethod
    def from_config(cls, config):
        # Its parts may be layers of modules this process has not imported
        # yet (a string constraint, the reference decoder): `keras.saving.
        # load_model` alone must work, so importing them registers them.
        from static_keras.layers import cached_transformer_decoder  # noqa: F401

        layer_classes()
        config = dict(config)
        config["decoder"] = keras.saving.deserialize_keras_object(config["decoder"])
        if config.get("constraint") is not None:
            config["constraint"] = keras.saving.deserialize_keras_object(config["constraint"])
        return cls(**config)
