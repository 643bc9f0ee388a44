"""`export_saved_model`: a Keras decoding model plus its index as one SavedModel."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import time

import keras
import numpy as np
import tensorflow as tf

from static_keras.export import eligibility as eligible
from static_keras.export import eligibility_refresh
from static_keras.export.leftovers import temporary_prefix
from static_keras.export.metadata import METADATA_FILENAME
from static_keras.export.metadata import catalogue_update_metadata
from static_keras.export.metadata import model_metadata
from static_keras.export.warmup import WARMUP_FILENAME
from static_keras.export.warmup import write_warmup_requests
from static_keras.layers.eligibility_kernels import MAX_DYNAMIC_EXCLUDED
from static_keras.tensorflow_log_lines import notes_hidden

SIGNATURE = "serving_default"


@dataclasses.dataclass(frozen=True)
class ExportInfo:
    """What `export_saved_model` wrote."""

    path: str
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    num_variables: int
    variable_bytes: int
    xla: bool
    seconds: float


class _ServingModule(tf.Module):
    """Holds each model variable exactly once, under its Keras path.

    Keras 3's `model.export` tracks variables through both the model object
    and its own lists, so every variable lands in the checkpoint twice
    (keras-team/keras#23553). This module tracks the underlying
    `tf.Variable`s once and closes over the model in the serving function.
    """

    def __init__(self, model: keras.Model):
        super().__init__(name="static_keras_serving")
        self.model_variables = {
            f"{i:04d}_{v.path.replace('/', '.')}": v.value for i, v in enumerate(model.variables)
        }


def _input_specs(model: keras.Model) -> list[tf.TensorSpec]:
    specs = []
    for tensor in model.inputs:
        name = tensor.name
        shape = (None,) + tuple(tensor.shape[1:])
        if any(d is None for d in shape[1:]):
            raise ValueError(
                f"Model input {name!r} has shape {tensor.shape}: only the batch "
                "dimension may be None in a served signature"
            )
        specs.append(tf.TensorSpec(shape, tf.as_dtype(tensor.dtype), name=name))
    return specs


def context_id_ranges(model: keras.Model) -> dict[str, tuple[int, int]]:
    """The id range `[low, high)` of each input the model embeds, where it is known.

    Known for the reference decoder: a model with one integer input and one
    `ConstrainedBeamSearch` over a `CachedTransformerDecoder` embeds that
    input in `context_vocab_size` rows. Other decoders: pass `input_ranges`
    to `export_saved_model`.
    """
    from static_keras.export.model_layers import beam_searches
    from static_keras.layers.cached_transformer_decoder import CachedTransformerDecoder

    integer = [t for t in model.inputs if tf.as_dtype(t.dtype).is_integer]
    searches = beam_searches(model)
    if len(integer) != 1 or len(searches) != 1:
        return {}
    decoder = searches[0].decoder
    if not isinstance(decoder, CachedTransformerDecoder):
        return {}
    return {integer[0].name: (0, int(decoder.context_vocab_size))}


def _check_shape(name: str, tensor: tf.Tensor, spec: tf.TensorSpec) -> tf.Tensor:
    """`tensor`, once its shape is known to be `spec`'s (any batch), else
    InvalidArgument naming the input and both shapes. TF Serving feeds a
    request's tensors as they come (its `Session::Run` does not hold them
    to the signature's shape), and a history of another length than the
    model was built for would be answered without a word."""
    expected = spec.shape.as_list()[1:]
    if not expected:
        return tensor
    shape = tf.shape(tensor, out_type=tf.int64)
    # Only the dimensions: the rank is the placeholder's to grappler, which
    # folds a rank check away (a request of another rank fails in the model).
    padded = tf.concat([shape[1:], tf.fill([len(expected)], tf.constant(-1, tf.int64))], 0)
    same = tf.reduce_all(tf.equal(padded[: len(expected)], expected))
    dims = ", ".join(str(d) for d in expected)
    check = tf.debugging.Assert(
        same,
        [f"Input {name!r} must have shape [batch, {dims}] (what the model was built for); "
         "received shape", shape],
    )  # fmt: skip
    with tf.control_dependencies([check]):
        return tf.identity(tensor)


def _check_ids(
    name: str, tensor: tf.Tensor, low: int, high: int, what: str = "the rows of its embedding"
) -> tf.Tensor:
    """`tensor`, once every id is known to be in [low, high) (else InvalidArgument).

    On GPU an out-of-range gather returns zeros and Keras' `take` wraps
    negative ids, so the signature checks ids itself. The model reads the
    checked tensor, so the check runs first and its message is the one sent.
    """
    inside = tf.reduce_all(
        (tensor >= tf.cast(low, tensor.dtype)) & (tensor < tf.cast(high, tensor.dtype))
    )
    check = tf.debugging.Assert(
        inside,
        [f"Input {name!r} holds ids outside [{low}, {high}) ({what}); "
         "smallest and largest:", tf.reduce_min(tensor), tf.reduce_max(tensor)],
    )  # fmt: skip
    with tf.control_dependencies([check]):
        return tf.identity(tensor)


def export_saved_model(
    model: keras.Model,
    path: str | os.PathLike,
    *,
    xla: bool = False,
    input_ranges: dict[str, tuple[int, int]] | None = None,
    warmup_batch_sizes: tuple[int, ...] = (1, 8),
    warmup_inputs: dict[str, np.ndarray] | None = None,
    model_name: str = "static_keras",
    extra_metadata: dict | None = None,
) -> ExportInfo:
    """Writes `model` (decoder + index weights) as a SavedModel for TF Serving.

    The model is a functional Keras model whose inputs are the decoder's
    context features (named by their `keras.Input(name=...)`) and whose
    output is a dict of named tensors, e.g. a `ConstrainedBeamSearch`:
    `{"tokens", "scores", "item_ids"}`. The SavedModel has the signature
    `serving_default`, with those names and any batch size. When the
    model's constraint holds eligibility sets it also has `serving_eligible`:
    the same inputs plus `set_id` int32 `[B]` (-1: no restriction) and
    `excluded_item_ids` int64 `[B, E]` (-1 padding), see
    `static_keras.export.eligibility`; the metadata's `eligibility_sets`
    lists the set names by id. Every variable
    (decoder weights and index tensors) is stored once; index tensors are
    variables, never constants, so the graph stays far below protobuf's 2 GB
    limit and the server does not hold two copies.

    With `xla=False` (the default) the function runs on a stock
    `tensorflow_model_server`. With `xla=True` the function is saved with
    `jit_compile=True`: the server must be started with
    `--xla_cpu_compilation_enabled=true` (CPU) or
    `--xla_gpu_compilation_enabled=true` (GPU, TF Serving 2.18+); otherwise
    the version loads and then fails every request with "XLA compilation
    disabled".

    Warmup records (`assets.extra/tf_serving_warmup_requests`, one
    PredictRequest per batch size in `warmup_batch_sizes`, at most 1000) make
    the server trace each new version before it takes traffic, and reject a
    version that cannot run. `assets/static_keras_index.json` records which
    index the version holds (format version, counts, layout, checksum,
    creation time).

    The SavedModel is written to a temporary directory beside `path` and
    renamed into place, so `path` never holds half a model. `path` must not
    exist.

    Args:
        model: functional `keras.Model` with named inputs and a dict output.
        path: directory to create.
        xla: bool. Save a jit-compiled function. Defaults to False.
        input_ranges: optional dict name -> `(low, high)`: the signature
            answers INVALID_ARGUMENT to a request with an id outside
            `[low, high)` in that input (checked outside any XLA cluster, so
            on every device and in both load paths). Defaults to
            `context_id_ranges(model)`; pass `{}` to check nothing.
        warmup_batch_sizes: batch sizes of the warmup requests (the sizes you
            will serve). Defaults to (1, 8).
        warmup_inputs: optional dict name -> array `[1, ...]` used as the
            example row of the warmup requests. Defaults to zeros.
        model_name: name in the warmup requests' model spec.
        extra_metadata: optional JSON-able dict merged into the metadata.

    Returns:
        `ExportInfo`.
    """
    if keras.config.backend() != "tensorflow":
        raise ValueError(
            "SavedModel export needs the TensorFlow backend "
            f"(KERAS_BACKEND=tensorflow); the current backend is {keras.config.backend()!r}"
        )
    if not isinstance(model, keras.Model) or not getattr(model, "inputs", None):
        raise ValueError("`model` must be a functional keras.Model with named inputs")
    path = os.fspath(path)
    if os.path.exists(path):
        raise ValueError(f"Export path {path!r} already exists; export never overwrites")
    if not 1 <= len(warmup_batch_sizes) <= 1000:
        raise ValueError("`warmup_batch_sizes` must hold 1 to 1000 batch sizes")

    start = time.perf_counter()
    specs = _input_specs(model)
    input_names = [spec.name for spec in specs]
    module = _ServingModule(model)

    ranges = context_id_ranges(model) if input_ranges is None else dict(input_ranges)
    unknown = sorted(set(ranges) - set(input_names))
    if unknown:
        raise ValueError(f"`input_ranges` names inputs {unknown}; the model's are {input_names}")
    for name, (low, high) in ranges.items():
        if not (isinstance(low, int) and isinstance(high, int) and low < high):
            raise ValueError(
                f"`input_ranges[{name!r}]` must be integers low < high. Received: {(low, high)}"
            )

    @tf.function(jit_compile=xla or None)
    def run_model(*inputs):
        outputs = model(dict(zip(input_names, inputs)) if len(inputs) > 1 else inputs[0])
        if not isinstance(outputs, dict):
            raise ValueError(
                "The model must return a dict of named outputs (e.g. tokens, scores, "
                f"item_ids); it returned {type(outputs).__name__}"
            )
        return dict(outputs)

    # The id checks stay outside the XLA cluster: XLA drops Assert ops.
    @tf.function(input_signature=specs)
    def serve(*inputs):
        inputs = [_check_shape(n, t, spec) for n, t, spec in zip(input_names, inputs, specs)]
        checked = [
            _check_ids(name, tensor, *ranges[name]) if name in ranges else tensor
            for name, tensor in zip(input_names, inputs)
        ]
        return run_model(*checked)

    concrete = serve.get_concrete_function()
    output_names = tuple(sorted(concrete.structured_outputs))
    # Served through `signatures` only: a tf.function attribute on the module
    # would be listed for serialization, which traced it again (about half
    # the export's time).
    signatures = {SIGNATURE: concrete}
    eligible_search = eligible.eligible_search(model)
    if eligible_search is not None:
        function = _eligible_function(model, module, eligible_search, specs, ranges, xla)
        if function is None:
            eligible_search = None
        else:
            signatures[eligible.ELIGIBLE_SIGNATURE] = function

    metadata = model_metadata(model)
    metadata.update(
        {
            "created_unix": time.time(),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "xla": bool(xla),
            "inputs": {s.name: {"dtype": s.dtype.name, "shape": list(s.shape)} for s in specs},
            "input_ranges": {name: list(bounds) for name, bounds in sorted(ranges.items())},
            "outputs": list(output_names),
        }
    )
    keys = {id(variable): key for key, variable in module.model_variables.items()}
    update = catalogue_update_metadata(model, keys)
    if update is not None:
        metadata["catalogue_update"] = update
    if eligible_search is not None:
        metadata["eligibility_sets"] = list(eligible_search.constraint.eligibility_names or ())
        metadata["eligibility"] = eligible.signature_metadata(eligible_search, keys)
    if extra_metadata:
        metadata.update(extra_metadata)

    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=temporary_prefix("export"), dir=parent)
    try:
        metadata_file = os.path.join(staging, METADATA_FILENAME)
        with open(metadata_file, "w") as file:
            json.dump(metadata, file, indent=2, sort_keys=True)
        module.index_metadata = tf.saved_model.Asset(metadata_file)
        target = os.path.join(staging, "model")
        with notes_hidden():  # "Assets written to: <staging path>" and an input-name note
            tf.saved_model.save(module, target, signatures=signatures)
        os.unlink(metadata_file)
        examples = warmup_inputs or {
            s.name: np.full([1, *s.shape[1:]], ranges.get(s.name, (0,))[0], s.dtype.as_numpy_dtype)
            for s in specs
        }
        more = {}
        if eligible_search is not None:
            more[eligible.ELIGIBLE_SIGNATURE] = {
                **examples,
                eligible.SET_ID_INPUT: np.zeros([1], np.int32),
                eligible.EXCLUDED_INPUT: np.full([1, 1], -1, np.int64),
            }
        write_warmup_requests(
            os.path.join(target, "assets.extra", WARMUP_FILENAME),
            model_name=model_name,
            signature_name=SIGNATURE,
            examples=examples,
            batch_sizes=warmup_batch_sizes,
            more_signatures=more,
        )
        os.replace(target, path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)

    variables = list(module.model_variables.values())
    return ExportInfo(
        path=path,
        input_names=tuple(input_names),
        output_names=output_names,
        num_variables=len(variables),
        variable_bytes=int(sum(v.shape.num_elements() * v.dtype.size for v in variables)),
        xla=bool(xla),
        seconds=time.perf_counter() - start,
    )


def _eligible_function(model, module, search, specs, ranges, xla):
    """The `serving_eligible` concrete function: `serving_default`'s inputs
    plus per-row set ids and excluded item ids (checked, then mapped to
    members outside any XLA cluster); None when the model already passes the
    search its own set ids (they are inputs of `serving_default`)."""
    constraint = search.constraint
    num_sets = constraint.num_eligibility_sets
    num_members = constraint.layout.num_members
    tables = eligible.exclusion_tables(constraint)
    ids, members = tables[eligible.TABLE_IDS], tables[eligible.TABLE_MEMBERS]
    input_names = [spec.name for spec in specs]
    for name in (eligible.SET_ID_INPUT, eligible.EXCLUDED_INPUT):
        if name in input_names:
            raise ValueError(f"Model input {name!r} clashes with the eligible signature's")
    eligible_specs = [
        *specs,
        tf.TensorSpec([None], tf.int32, name=eligible.SET_ID_INPUT),
        tf.TensorSpec([None, None], tf.int64, name=eligible.EXCLUDED_INPUT),
    ]

    @tf.function(jit_compile=xla or None)
    def run_model(set_ids, excluded, *inputs):
        with search.request_eligibility(set_ids, excluded) as used:
            outputs = model(dict(zip(input_names, inputs)) if len(inputs) > 1 else inputs[0])
        taken.extend(used)
        return dict(outputs)

    @tf.function(input_signature=eligible_specs)
    def serve_eligible(*inputs):
        *context, set_ids, excluded_ids = inputs
        context = [_check_shape(n, t, spec) for n, t, spec in zip(input_names, context, specs)]
        checked = [
            _check_ids(name, tensor, *ranges[name]) if name in ranges else tensor
            for name, tensor in zip(input_names, context)
        ]
        batch = tf.shape(context[0])[0]
        set_ids = _check_ids(
            eligible.SET_ID_INPUT, set_ids, -1, num_sets, "-1: no set, else a set id"
        )
        set_ids = eligible.check_batch(eligible.SET_ID_INPUT, set_ids, batch)
        excluded_ids = eligible.check_batch(eligible.EXCLUDED_INPUT, excluded_ids, batch)
        excluded_ids = eligible.check_width(
            eligible.EXCLUDED_INPUT, excluded_ids, MAX_DYNAMIC_EXCLUDED
        )
        excluded = eligible.excluded_members(excluded_ids, ids, members, num_members)
        return run_model(set_ids, excluded, *checked)

    taken = []
    concrete = serve_eligible.get_concrete_function()
    if not taken:
        return None  # the model feeds the search its own set ids (model inputs)
    setattr(module, eligibility_refresh.TABLES_ATTRIBUTE, tables)
    return concrete
