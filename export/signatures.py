"""The served signatures of an exported model, declared as data.

Every exported model answers `serving_default`: the model's own inputs, its
outputs. A request form that a model's constraint supports adds a
signature: its name, the inputs a request adds to the model's, how the graph
turns them into the search's `Eligibility` (checked, outside any XLA
cluster), the variables that takes, one example row for the warmup records,
and what the version's metadata records for the jobs that rewrite it.
`export_saved_model` builds one serving function per declaration that
applies, the same way for each; `serving/` serves whatever signatures a
version has. A new served signature is one more `ServedSignature` in
`SIGNATURES`, and its test.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import keras
import numpy as np

from static_keras.constraint.eligibility_request import Eligibility
from static_keras.export import eligibility as eligible
from static_keras.export.served_tensors import TABLES_ATTRIBUTE


@dataclasses.dataclass(frozen=True)
class RequestInput:
    """An input a request form adds to the model's own."""

    name: str
    dtype: str
    row_shape: tuple  # per batch row: () or (None,) (any width)
    warmup_row: np.ndarray  # what the warmup records send, one row


@dataclasses.dataclass(frozen=True)
class ServedSignature:
    """One served signature.

    Attributes:
        name: the signature's name in the SavedModel.
        request_inputs: inputs beyond the model's own (none: the model as it is).
        search_of: `model -> ConstrainedBeamSearch or None`, the search a
            request form restricts (None: the signature does not apply).
        tables: `search -> {name: tf.Variable}`, variables the request
            mapping reads, kept on the serving module under
            `tables_attribute` (where the rewriting jobs find them).
        eligibility: `(search, tables, request, batch) -> Eligibility`: the
            graph from the checked request tensors (by name) to the search's
            eligibility, run outside any XLA cluster.
        metadata: `(search, variable_keys, tables) -> dict` (`tables`: this form's
            variables by name, empty without any), merged into the version's
            metadata.
    """

    name: str
    request_inputs: tuple[RequestInput, ...] = ()
    search_of: Callable | None = None
    tables: Callable | None = None
    tables_attribute: str | None = None
    eligibility: Callable | None = None
    metadata: Callable | None = None

    def warmup_inputs(self, model_examples: dict) -> dict:
        """A warmup request's inputs: the model's example row and this form's."""
        rows = {i.name: np.asarray(i.warmup_row)[None] for i in self.request_inputs}
        return {**model_examples, **rows}


def _eligible_metadata(search, variable_keys, tables) -> dict:
    return {
        "eligibility_sets": list(search.constraint.eligibility_names or ()),
        "eligibility": eligible.signature_metadata(search, variable_keys, tables),
    }


PLAIN = ServedSignature(name="serving_default")
ELIGIBLE = ServedSignature(
    name=eligible.ELIGIBLE_SIGNATURE,
    request_inputs=(
        RequestInput(eligible.SET_ID_INPUT, "int32", (), np.zeros([], np.int32)),
        RequestInput(eligible.EXCLUDED_INPUT, "int64", (None,), np.full([1], -1, np.int64)),
    ),
    search_of=eligible.eligible_search,
    tables=eligible.exclusion_tables,
    tables_attribute=TABLES_ATTRIBUTE,
    eligibility=eligible.request_eligibility,
    metadata=_eligible_metadata,
)
#: Every signature an export considers, in the order they are written.
SIGNATURES = (PLAIN, ELIGIBLE)


def model_with_eligibility(model: keras.Model, search) -> keras.Model | None:
    """`model` with an `Eligibility` as two more inputs (set ids int32 `[B]`,
    excluded member numbers int32 `[B, E]`) that its call of `search` receives,
    as the same layers and weights (`keras.models.clone_model` with a
    `call_function`: public Keras API, no state set on any layer). None where
    the model already passes `search` an eligibility of its own (from its
    inputs): it has no request form to add."""
    set_ids = keras.Input((), dtype="int32", name="request_set_ids")
    excluded = keras.Input((None,), dtype="int32", name="request_excluded")
    # A model with the two inputs unused, so that its copy may use them.
    widened = keras.Model([*model.inputs, set_ids, excluded], model.output)
    fresh = [keras.Input(batch_shape=x.shape, dtype=x.dtype, name=x.name) for x in widened.inputs]
    own = []

    def call(layer, *args, **kwargs):
        if layer is search:
            if len(args) > 1 or any(kwargs.get(k) is not None for k in _ELIGIBILITY_ARGUMENTS):
                own.append(layer)
            else:
                kwargs["eligibility"] = Eligibility(fresh[-2], fresh[-1])
        return layer(*args, **kwargs)

    copy = keras.models.clone_model(
        widened, input_tensors=fresh, clone_function=lambda layer: layer, call_function=call
    )
    return None if own else copy


_ELIGIBILITY_ARGUMENTS = ("eligibility", "set_ids", "excluded")
