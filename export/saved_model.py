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

from static_keras.export import signatures as served
from static_keras.export.input_checks import check_ids
from static_keras.export.input_checks import check_shape
from static_keras.export.leftovers import temporary_prefix
from static_keras.export.metadata import METADATA_FILENAME
from static_keras.export.metadata import catalogue_update_metadata
from static_keras.export.metadata import model_metadata
from static_keras.progress import stage
from static_keras.serving.warmup import WARMUP_FILENAME
from static_keras.serving.warmup import write_warmup_requests
from static_keras.tensorflow_log_lines import notes_hidden

SIGNATURE = served.PLAIN.name


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

    ranges = _checked_ranges(model, input_ranges, input_names)

    # Served through `signatures` only: a tf.function attribute on the module
    # would be listed for serialization, which traced it again (about half
    # the export's time).
    signatures, written = {}, []
    for declared in served.SIGNATURES:
        with stage(f"tracing {declared.name}"):
            function = _serving_function(model, module, declared, specs, ranges, xla)
        if function is not None:
            signatures[declared.name] = function
            written.append(declared)
    output_names = tuple(sorted(signatures[SIGNATURE].structured_outputs))

    metadata = _metadata(model, module, specs, ranges, output_names, xla, written)
    if extra_metadata:
        metadata.update(extra_metadata)
    examples = warmup_inputs or {
        s.name: np.full([1, *s.shape[1:]], ranges.get(s.name, (0,))[0], s.dtype.as_numpy_dtype)
        for s in specs
    }
    warmup = {declared.name: declared.warmup_inputs(examples) for declared in written}
    with stage("saving the SavedModel and its warmup records"):
        _save(module, signatures, path, metadata, warmup, model_name, warmup_batch_sizes)

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


def _checked_ranges(model, input_ranges, input_names) -> dict[str, tuple[int, int]]:
    """`input_ranges` (default: `context_id_ranges(model)`), checked."""
    ranges = context_id_ranges(model) if input_ranges is None else dict(input_ranges)
    unknown = sorted(set(ranges) - set(input_names))
    if unknown:
        raise ValueError(f"`input_ranges` names inputs {unknown}; the model's are {input_names}")
    for name, (low, high) in ranges.items():
        if not (isinstance(low, int) and isinstance(high, int) and low < high):
            raise ValueError(
                f"`input_ranges[{name!r}]` must be integers low < high. Received: {(low, high)}"
            )
    return ranges


def _metadata(model, module, specs, ranges, output_names, xla, written) -> dict:
    """`assets/static_keras_index.json`: the index, the signatures' inputs and
    what each request form and the catalogue jobs need to find."""
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
    for declared in written:
        if declared.metadata is not None:
            tables = getattr(module, declared.tables_attribute, {}) if declared.tables else {}
            metadata.update(declared.metadata(declared.search_of(model), keys, tables))
    return metadata


def _save(module, signatures, path, metadata, warmup, model_name, batch_sizes) -> None:
    """The SavedModel, its metadata asset and warmup records, written beside
    `path` and renamed into place (`path` never holds half a model)."""
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
        write_warmup_requests(
            os.path.join(target, "assets.extra", WARMUP_FILENAME),
            model_name=model_name,
            signature_name=SIGNATURE,
            examples=warmup.pop(SIGNATURE),
            batch_sizes=batch_sizes,
            more_signatures=warmup,
        )
        os.replace(target, path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _serving_function(model, module, declared, specs, ranges, xla):
    """The concrete function of one declared signature (`signatures.py`), or
    None where it does not apply to `model`: the model's inputs checked
    (shape, id ranges), a request form's inputs checked and turned into the
    search's `Eligibility` outside any XLA cluster, then the model (with XLA
    where `xla`)."""
    input_names = [spec.name for spec in specs]
    runner, search, tables = model, None, {}
    if declared.request_inputs:
        search = declared.search_of(model)
        runner = None if search is None else served.model_with_eligibility(model, search)
        if runner is None:  # no such search, or the model feeds it its own inputs
            return None
        clash = sorted(set(input_names) & {i.name for i in declared.request_inputs})
        if clash:
            raise ValueError(f"Model inputs {clash} clash with the {declared.name} signature's")
        tables = declared.tables(search)
        setattr(module, declared.tables_attribute, tables)
    request_specs = [
        tf.TensorSpec([None, *i.row_shape], tf.as_dtype(i.dtype), name=i.name)
        for i in declared.request_inputs
    ]

    @tf.function(jit_compile=xla or None)
    def run_model(*inputs):
        if declared.request_inputs:
            outputs = runner(list(inputs))
        else:
            outputs = runner(dict(zip(input_names, inputs)) if len(inputs) > 1 else inputs[0])
        if not isinstance(outputs, dict):
            raise ValueError(
                "The model must return a dict of named outputs (e.g. tokens, scores, "
                f"item_ids); it returned {type(outputs).__name__}"
            )
        return dict(outputs)

    # The checks stay outside the XLA cluster: XLA drops Assert ops.
    @tf.function(input_signature=[*specs, *request_specs])
    def serve(*inputs):
        context, request = inputs[: len(specs)], inputs[len(specs) :]
        context = [check_shape(n, t, spec) for n, t, spec in zip(input_names, context, specs)]
        checked = [
            check_ids(name, tensor, *ranges[name]) if name in ranges else tensor
            for name, tensor in zip(input_names, context)
        ]
        if not declared.request_inputs:
            return run_model(*checked)
        named = {i.name: tensor for i, tensor in zip(declared.request_inputs, request)}
        batch = tf.shape(context[0])[0]
        eligibility = declared.eligibility(search, tables, named, batch)
        return run_model(*checked, eligibility.set_ids, eligibility.excluded)

    return serve.get_concrete_function()
