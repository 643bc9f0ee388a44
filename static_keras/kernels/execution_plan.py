"""`ExecutionPlan`: every backend and device difference of the decoding kernels, in one object.

Several kernels have more than one formulation with the same results: XLA
(JAX under `jax.jit`, TF `jit_compile`) fuses many small ops into a few
loops, while TensorFlow's graph executor (what TF Serving runs by default),
eager mode (JAX's included) and PyTorch dispatch every op on its own. Which
form is faster depends on (backend, device kind, compiled or not), so one
plan per triple names every choice, and the kernels ask the plan instead of
testing the backend themselves. The measurements behind each choice are in
docs/benchmarks.md ("Execution plans").

The few ops that differ by backend (plain in-range gathers, a 2-D cell
gather, popcount, a sorted search, whether int64 tensors are held) are one
module per backend in `kernels/backends/`, all with the same functions; a
plan names the module that serves each backend (`primitive_modules`), and a
kernel reaches it as `execution_plan.current().primitives`. Where a plan
comes from (the device, whether XLA compiles the ops being built) is asked
of the running backend's module too, so no kernel names a backend.

The plan is chosen when the ops are built (a SavedModel exported without XLA
carries the op-by-op forms); `beam_search` chooses it once per trace and
`using(plan)` pins it for what is built inside (tests pin every plan on the
CPU to check that each formulation gives the same answers). A GPU or TPU
formulation changes `XLA_GPU` or `XLA_TPU` here: a choice of formulation,
or, for a primitive of its own, one new module in `kernels/backends/` beside
the CPU one (say `jax_gpu.py`), named in that plan's `primitive_modules`.
"""

from __future__ import annotations

import contextlib
import dataclasses

from static_keras.kernels import backends

#: The module of `kernels/backends/` that serves each backend on a CPU; any
#: other backend gets "portable" (keras.ops only).
CPU_PRIMITIVES = (("jax", "jax"), ("tensorflow", "tensorflow"), ("torch", "torch"))


@dataclasses.dataclass(frozen=True)
class ExecutionPlan:
    """The formulation of each kernel that has more than one, and the
    primitives each backend uses.

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
        sorted_search: "searchsorted" (the backend's own search,
            `primitives.searchsorted`: one TensorFlow kernel) or
            "binary_probes" (log2(P) gathers; `sorted_search.count_below`).
        rank_capped_beams_by_row: apply a binding per-beam cap by rankings
            of whole batch rows (`capped_top_k`) rather than a top-k per beam.
        primitive_modules: `(backend, module)` pairs: the module of
            `kernels/backends/` whose primitives each backend uses under this
            plan (a backend not named: "portable").
    """

    name: str
    compiled: bool
    materialise_derived_words: bool
    recompute_expand_moves: bool
    direct_cell_gather: bool
    slice_single_row_runs: bool
    sorted_search: str
    rank_capped_beams_by_row: bool
    primitive_modules: tuple[tuple[str, str], ...]

    @property
    def primitives(self):
        """The running backend's primitives under this plan: a module of
        `kernels/backends/` (`take`, `take_cells`, `popcount32`, ...)."""
        return _module_of(self.primitive_modules, backends.name())


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
    primitive_modules=CPU_PRIMITIVES,
)
#: TF `jit_compile` on a CPU: as JAX, but a gather reads CSR runs.
XLA_CPU_TF = dataclasses.replace(
    XLA_CPU_JAX, name="xla-cpu/tensorflow", slice_single_row_runs=False
)
#: XLA on a GPU: the compiled CPU choices and primitives (not measured on a
#: GPU yet), less the run slice, which works around XLA:CPU's cost model only.
#: A GPU primitive of JAX's would be `primitive_modules=(("jax", "jax_gpu"),
#: ("tensorflow", "tensorflow"))`, with `kernels/backends/jax_gpu.py`.
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
    primitive_modules=CPU_PRIMITIVES,
)
#: Any other backend op by op (PyTorch, JAX eager): a search by probes.
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
    the one of this backend, device and compilation context (as the
    backend's module of `kernels/backends/` tells them)."""
    if _pinned:
        return _pinned[-1]
    backend = backends.name()
    context = _module_of(CPU_PRIMITIVES, backend)
    return plan_for(backend, context.device_kind(), context.compiling())


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


def _module_of(modules: tuple[tuple[str, str], ...], backend: str):
    for name, module in modules:
        if name == backend:
            return backends.load(module)
    return backends.load("portable")
