"""`ExecutionPlan`: every formulation choice of the decoding kernels, in one object.

Several kernels have more than one formulation with the same results: XLA
(JAX, TF `jit_compile`) fuses many small ops into a few loops, while
TensorFlow's graph executor (what TF Serving runs by default), eager mode
and PyTorch dispatch every op on its own. Which form is faster depends on
(backend, device kind, compiled or not), so one plan per triple names every
choice, and the kernels ask the plan instead of testing the backend
themselves. The measurements behind each choice are in docs/benchmarks.md
("Execution plans").

The plan is chosen when the ops are built (a SavedModel exported without XLA
carries the op-by-op forms); `beam_search` chooses it once per trace and
`using(plan)` pins it for what is built inside (tests pin every plan on the
CPU to check that each formulation gives the same answers). A GPU or TPU
formulation changes `XLA_GPU` or `XLA_TPU` here, nothing else.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools

import keras


@dataclasses.dataclass(frozen=True)
class ExecutionPlan:
    """The formulation of each kernel that has more than one.

    Attributes:
        name: what the plan is for, e.g. "xla-cpu/jax".
        compiled: whether XLA compiles the ops (fuses producers into consumers).
        materialise_derived_words: write a derived eligibility mask row once
            (`derived_dense_masks.computed_once`) rather than let XLA
            recompute it inside each of its consumers.
        recompute_expand_moves: derive a mask row's 5 `expand` planes from
            the row itself (bit ops) rather than gather them from the table.
        direct_cell_gather: read cells of a 2-D table with a gather on the
            table (`gather.take_cells`) rather than on a flattened view.
        slice_single_row_runs: read a one-row decode's CSR run as a slice
            plus a small gather (`gather.take_runs`) rather than a gather
            from the whole token array.
        sorted_search: "searchsorted" (one TensorFlow kernel) or
            "binary_probes" (log2(P) gathers; `sorted_search.count_below`).
        rank_capped_beams_by_row: apply a binding per-beam cap by rankings
            of whole batch rows (`capped_top_k`) rather than a top-k per beam.
    """

    name: str
    compiled: bool
    materialise_derived_words: bool
    recompute_expand_moves: bool
    direct_cell_gather: bool
    slice_single_row_runs: bool
    sorted_search: str
    rank_capped_beams_by_row: bool


#: XLA on a CPU under JAX: measured (docs/benchmarks.md, "Execution plans").
XLA_CPU_JAX = ExecutionPlan(
    name="xla-cpu/jax",
    compiled=True,
    materialise_derived_words=True,
    recompute_expand_moves=True,
    direct_cell_gather=True,
    slice_single_row_runs=True,
    sorted_search="binary_probes",
    rank_capped_beams_by_row=True,
)
#: TF `jit_compile` on a CPU: as JAX, but a gather reads CSR runs.
XLA_CPU_TF = dataclasses.replace(
    XLA_CPU_JAX, name="xla-cpu/tensorflow", slice_single_row_runs=False
)
#: XLA on a GPU: the compiled CPU choices (not measured on a GPU yet), less
#: the run slice, which works around XLA:CPU's cost model only.
XLA_GPU = dataclasses.replace(XLA_CPU_JAX, name="xla-gpu", slice_single_row_runs=False)
#: XLA on a TPU: as on a GPU until measured there.
XLA_TPU = dataclasses.replace(XLA_GPU, name="xla-tpu")
#: TensorFlow op by op (graph mode, as TF Serving runs by default; eager).
TF_OP_BY_OP = ExecutionPlan(
    name="op-by-op/tensorflow",
    compiled=False,
    materialise_derived_words=False,
    recompute_expand_moves=False,
    direct_cell_gather=False,
    slice_single_row_runs=False,
    sorted_search="searchsorted",
    rank_capped_beams_by_row=False,
)
#: Any other backend op by op (PyTorch, JAX eager): no TensorFlow kernels.
OP_BY_OP = dataclasses.replace(TF_OP_BY_OP, name="op-by-op", sorted_search="binary_probes")

PLANS = (XLA_CPU_JAX, XLA_CPU_TF, XLA_GPU, XLA_TPU, TF_OP_BY_OP, OP_BY_OP)

_pinned: list[ExecutionPlan] = []


def plan_for(backend: str, device: str, compiled: bool) -> ExecutionPlan:
    """The plan of a backend ("jax", "tensorflow", "torch", ...), a device kind
    ("cpu", "gpu", "tpu") and whether XLA compiles the ops."""
    if not compiled:
        return TF_OP_BY_OP if backend == "tensorflow" else OP_BY_OP
    if device == "gpu":
        return XLA_GPU
    if device == "tpu":
        return XLA_TPU
    return XLA_CPU_JAX if backend == "jax" else XLA_CPU_TF


def current() -> ExecutionPlan:
    """The plan of the ops being built now: the pinned one (`using`), else
    the one of this backend, device and compilation context."""
    if _pinned:
        return _pinned[-1]
    backend = keras.config.backend()
    return plan_for(backend, _device_kind(backend), _compiled(backend))


@contextlib.contextmanager
def using(plan: ExecutionPlan):
    """Pins `plan` for the ops built inside the block."""
    if not isinstance(plan, ExecutionPlan):
        raise ValueError(f"`plan` must be an ExecutionPlan. Received: {type(plan).__name__}")
    _pinned.append(plan)
    try:
        yield plan
    finally:
        _pinned.pop()


def _compiled(backend: str) -> bool:
    """Whether ops built now are compiled by XLA (JAX, TF `jit_compile`)."""
    if backend == "jax":
        return True
    if backend != "tensorflow":
        return False
    import tensorflow as tf
    from tensorflow.python.ops import control_flow_util

    if tf.executing_eagerly():
        return False
    return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


@functools.lru_cache(maxsize=None)
def _device_kind(backend: str) -> str:
    """ "cpu", "gpu" or "tpu": where the backend places ops by default."""
    if backend == "jax":
        import jax

        return jax.default_backend() if jax.default_backend() in ("gpu", "tpu") else "cpu"
    if backend == "tensorflow":
        import tensorflow as tf

        for kind in ("tpu", "gpu"):
            if tf.config.list_logical_devices(kind.upper()):
                return kind
    if backend == "torch":
        import torch

        return "gpu" if torch.cuda.is_available() else "cpu"
    return "cpu"
