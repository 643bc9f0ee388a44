"""Every execution plan gives the same answers: each formulation a plan can
choose is pinned here on the CPU, in every mode of this backend, and checked
against an exhaustive ranking (and a stored-rows decode with eligibility).
The backend primitives (`kernels/backends/`) give the same answers as NumPy
in every module, and the plan is the only way a kernel reaches them: no
kernel names a backend."""

import ast
import importlib.util
import pathlib
import textwrap

import keras
import numpy as np
import pytest
from backend_subprocess import run_under
from decoding_oracles import compiled_modes
from decoding_oracles import exhaustive_ranking
from decoding_oracles import prefix_logits
from decoding_oracles import random_table
from keras import ops

from static_keras import ConstrainedDecoding
from static_keras import Eligibility
from static_keras import StaticIndex
from static_keras import beam_search
from static_keras import constraint_for
from static_keras.index.eligibility import EligibilitySets
from static_keras.index.member_catalogue import MemberCatalogue
from static_keras.kernels import backends
from static_keras.kernels import execution_plan
from static_keras.kernels import gather

PLANS = pytest.mark.parametrize("plan", execution_plan.PLANS, ids=lambda p: p.name)


def test_plans_per_backend_device_and_compilation():
    plan_for = execution_plan.plan_for
    assert plan_for("jax", "cpu", True) is execution_plan.XLA_CPU_JAX
    assert plan_for("tensorflow", "cpu", True) is execution_plan.XLA_CPU_TF
    assert plan_for("tensorflow", "cpu", False) is execution_plan.TF_OP_BY_OP
    assert plan_for("torch", "gpu", False) is execution_plan.OP_BY_OP
    assert plan_for("jax", "cpu", False) is execution_plan.OP_BY_OP  # JAX eager
    assert plan_for("jax", "gpu", True) is execution_plan.XLA_GPU
    assert plan_for("tensorflow", "tpu", True) is execution_plan.XLA_TPU
    assert len({p.name for p in execution_plan.PLANS}) == len(execution_plan.PLANS)


@PLANS
def test_gathers_are_the_same_under_every_plan(plan):
    rng = np.random.default_rng(0)
    table = rng.integers(-9, 9, (7, 5)).astype("int32")
    rows, columns = rng.integers(0, 7, 11).astype("int32"), rng.integers(0, 5, 11).astype("int32")
    tokens = np.arange(40, dtype="int32") * 3
    start = np.array([6], "int32")
    edges = start[:, None] + np.arange(4, dtype="int32")[None]
    for mode, wrap in compiled_modes():
        with execution_plan.using(plan):
            cells = wrap(lambda: gather.take_cells(ops.convert_to_tensor(table), rows, columns))()
            runs = wrap(lambda: gather.take_runs(ops.convert_to_tensor(tokens), edges, start))()
        np.testing.assert_array_equal(ops.convert_to_numpy(cells), table[rows, columns], mode)
        np.testing.assert_array_equal(ops.convert_to_numpy(runs), tokens[edges], mode)


@PLANS
def test_beam_search_is_exact_under_every_plan(plan):
    rng = np.random.default_rng(3)
    index = StaticIndex.build(rng.integers(0, 6, (40, 3)), 6, dense_levels=2)
    layer = constraint_for(index)  # built outside any tf.function
    table = random_table(6, seed=2)
    logits_of = prefix_logits(ops.convert_to_tensor(table))
    expected, scores = exhaustive_ranking(index.sequences(), table)
    beam = index.num_sequences
    for mode, wrap in compiled_modes():
        for per_beam in (None, 2):
            with execution_plan.using(plan):
                out = wrap(
                    lambda: beam_search(
                        layer, lambda p, s: (logits_of(p), s), 2, beam, dense_top_k=per_beam
                    )
                )()
            tokens = ops.convert_to_numpy(out["tokens"])
            if per_beam is None:
                np.testing.assert_array_equal(tokens[0], expected, f"{mode}")
                np.testing.assert_allclose(
                    ops.convert_to_numpy(out["scores"])[1], scores, rtol=1e-5, atol=1e-5
                )
            else:  # a binding cap: the same beams whichever way it is applied
                with execution_plan.using(execution_plan.OP_BY_OP):
                    reference = beam_search(
                        layer, lambda p, s: (logits_of(p), s), 2, beam, dense_top_k=per_beam
                    )
                np.testing.assert_array_equal(
                    tokens, ops.convert_to_numpy(reference["tokens"]), f"{mode}"
                )


@PLANS
def test_eligible_candidates_are_the_same_under_every_plan(plan):
    rng = np.random.default_rng(5)
    rows = rng.integers(0, 16, (600, 4))
    rows[:200, 0] = 1  # one wide first token: its depth is derived, not stored
    index = StaticIndex.build(np.unique(rows, axis=0), 16, dense_levels=2)
    n = index.num_members
    sets = EligibilitySets.build(index, {"third": rng.choice(n, n // 3, replace=False)})
    layer = ConstrainedDecoding(index, eligibility=sets)
    assert max(layer.eligibility_windows) > 0
    states = np.asarray(index.walk(rng.integers(0, 16, (9, 1))), "int32")
    logits = rng.normal(size=(9, 16)).astype("float32")
    excluded = MemberCatalogue.from_index(index).exclusion_members(rng.integers(0, n, (9, 3)))
    request = Eligibility(np.array([0, -1, 0, 0, -1, 0, 0, 0, 0], "int32"), excluded)
    want = [ops.convert_to_numpy(x) for x in layer.candidates(logits, states, 1)]
    for mode, wrap in compiled_modes():
        with execution_plan.using(plan):
            got = wrap(lambda: layer.candidates(logits, states, 1, eligibility=request))()
            free = wrap(lambda: layer.candidates(logits, states, 1))()
        for a, b in zip(free, want):
            np.testing.assert_array_equal(ops.convert_to_numpy(a), b, mode)
        with execution_plan.using(execution_plan.OP_BY_OP):
            reference = layer.candidates(logits, states, 1, eligibility=request)
        for a, b in zip(got, reference):
            np.testing.assert_array_equal(
                ops.convert_to_numpy(a), ops.convert_to_numpy(b), f"{mode}"
            )


KERNELS = pathlib.Path(execution_plan.__file__).parent
FRAMEWORKS = ("tensorflow", "jax", "torch")


def _names_a_backend(tree) -> list[str]:
    """Reads of `keras.config.backend()` (or `keras.backend.backend()`) and
    imports of a framework in a module's syntax tree."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "backend":
            found.append(f"line {node.lineno}: .backend")
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        else:
            continue
        found += [f"line {node.lineno}: import {n}" for n in names
                  if n.split(".")[0] in FRAMEWORKS]  # fmt: skip
    return found


def test_no_kernel_names_a_backend():
    """Backend differences are the plan's: only `kernels/backends/` reads the
    backend or imports a framework."""
    modules = list(KERNELS.glob("*.py"))
    assert {"gather.py", "sorted_search.py", "execution_plan.py"} <= {p.name for p in modules}
    for path in modules:
        found = _names_a_backend(ast.parse(path.read_text()))
        assert not found, f"{path.name}: {found}"
    # The scan sees what it looks for.
    tree = ast.parse("import keras\nimport jax.numpy\nkeras.config.backend()")
    assert len(_names_a_backend(tree)) == 2


def _available(module: str) -> bool:
    framework = {"portable": "keras", "torch": "keras"}.get(module, module)
    return importlib.util.find_spec(framework) is not None


def test_every_plan_names_modules_with_every_primitive():
    names = {"portable"} | {m for p in execution_plan.PLANS for _, m in p.primitive_modules}
    assert names == {"portable", "jax", "tensorflow", "torch"}
    for name in sorted(n for n in names if _available(n)):
        module = backends.load(name)
        missing = [f for f in backends.FUNCTIONS if not callable(getattr(module, f, None))]
        assert not missing, f"{name}: {missing}"
    for plan in execution_plan.PLANS:
        own = dict(plan.primitive_modules)[keras.config.backend()]
        assert plan.primitives is backends.load(own)


def _tensor_of(module: str):
    """How `module`'s primitives take an array: its own framework's tensors."""
    if module == "tensorflow":
        import tensorflow as tf

        return tf.convert_to_tensor
    if module == "jax":
        import jax.numpy as jnp

        return jnp.asarray
    return keras.ops.convert_to_tensor  # keras.ops on this process's backend


@pytest.mark.parametrize("module", ["portable", "tensorflow", "jax"])
def test_every_backend_module_gives_the_same_answers(module):
    if not _available(module):
        pytest.skip(f"{module} is not installed")
    primitives, tensor = backends.load(module), _tensor_of(module)
    rng = np.random.default_rng(7)
    x = rng.integers(-(2**31), 2**31 - 1, (6, 5, 3)).astype("int32")  # any bits
    rows, columns = rng.integers(0, 6, (4, 2)).astype("int32"), rng.integers(0, 5, 2)
    columns = columns.astype("int32")
    sorted_rows = np.sort(rng.integers(0, 40, (5, 9)), axis=1).astype("int32")
    sorted_rows[:, -1] = 2**31 - 1
    values = rng.integers(-2, 45, (5, 7)).astype("int32")
    flat, table = x.reshape(-1), x[:4, :, 0]
    got = {
        "take": primitives.take(tensor(flat), tensor(rows)),
        "take_along_rows": primitives.take_along_rows(tensor(table), tensor(rows[:, :1] % 5)),
        "take_cells": primitives.take_cells(tensor(x), tensor(rows), tensor(columns)),
        "popcount32": primitives.popcount32(tensor(flat)),
        "searchsorted": primitives.searchsorted(tensor(sorted_rows), tensor(values)),
    }
    want = {
        "take": flat[rows],
        "take_along_rows": np.take_along_axis(table, rows[:, :1] % 5, axis=1),
        "take_cells": x[rows, columns],
        "popcount32": np.array([bin(v & 0xFFFFFFFF).count("1") for v in flat.tolist()]),
        "searchsorted": np.stack([np.searchsorted(r, v) for r, v in zip(sorted_rows, values)]),
    }
    for name, value in got.items():
        value = np.asarray(value)
        np.testing.assert_array_equal(value, want[name], err_msg=f"{module}.{name}")
        if name in ("popcount32", "searchsorted"):
            assert value.dtype == np.int32, f"{module}.{name}: {value.dtype}"
    assert primitives.compiling() is False  # eager
    assert primitives.device_kind() == "cpu"
    assert isinstance(primitives.holds_int64(), bool)


def test_the_plan_follows_the_compilation_context():
    """TensorFlow here: eager and a graph op by op, `jit_compile` compiled."""
    if keras.config.backend() != "tensorflow":
        pytest.skip("TF graphs need the TensorFlow backend (JAX: the next test)")
    import tensorflow as tf

    seen = {}
    for jit in (False, True):

        def probe(x, jit=jit):
            seen[jit] = execution_plan.current()
            return x

        tf.function(probe, jit_compile=jit)(tf.constant(1))
    assert seen == {False: execution_plan.TF_OP_BY_OP, True: execution_plan.XLA_CPU_TF}
    assert execution_plan.current() is execution_plan.TF_OP_BY_OP  # eager
    assert execution_plan.current().primitives is backends.load("tensorflow")


_JAX_CONTEXT_SCRIPT = textwrap.dedent(
    """
    import jax
    import numpy as np
    from jax import lax

    from static_keras.constraint.index_weights import device_dtype
    from static_keras.kernels import backends
    from static_keras.kernels import execution_plan as ep

    seen = {}

    def probe(x, where):
        seen[where] = ep.current()
        return x

    probe(1, "eager")
    jax.jit(lambda x: probe(x, "jit"))(1)
    lax.fori_loop(0, 2, lambda i, x: probe(x, "loop"), 1)  # staged: one program
    jax.vmap(lambda x: probe(x, "vmap"))(np.ones(2))  # op by op
    assert seen == {"eager": ep.OP_BY_OP, "jit": ep.XLA_CPU_JAX, "loop": ep.XLA_CPU_JAX,
                    "vmap": ep.OP_BY_OP}, seen
    assert ep.current().primitives is backends.load("jax")
    assert device_dtype(np.dtype("int64")) == ("int64" if jax.config.jax_enable_x64 else "int32")
    print("jax plans ok")
    """
)


def test_the_plan_follows_the_compilation_context_under_jax():
    """JAX: op by op eagerly (and under `vmap` alone), compiled when staged
    by `jax.jit` or a `lax` loop; int64 weights as the backend holds them."""
    pytest.importorskip("jax", reason="JAX is an optional backend (pip install .[jax])")
    run_under("jax", _JAX_CONTEXT_SCRIPT, "jax plans ok")
