"""Every execution plan gives the same answers: each formulation a plan can
choose is pinned here on the CPU, in every mode of this backend, and checked
against an exhaustive ranking (and a stored-rows decode with eligibility)."""

import numpy as np
import pytest
from decoding_oracles import compiled_modes
from decoding_oracles import exhaustive_ranking
from decoding_oracles import prefix_logits
from decoding_oracles import random_table
from keras import ops

from static_keras import ConstrainedDecoding
from static_keras import StaticIndex
from static_keras import beam_search
from static_keras import constraint_for
from static_keras.index.eligibility import EligibilitySets
from static_keras.index.member_catalogue import MemberCatalogue
from static_keras.layers import execution_plan
from static_keras.layers import gather

PLANS = pytest.mark.parametrize("plan", execution_plan.PLANS, ids=lambda p: p.name)


def test_plans_per_backend_device_and_compilation():
    plan_for = execution_plan.plan_for
    assert plan_for("jax", "cpu", True) is execution_plan.XLA_CPU_JAX
    assert plan_for("tensorflow", "cpu", True) is execution_plan.XLA_CPU_TF
    assert plan_for("tensorflow", "cpu", False) is execution_plan.TF_OP_BY_OP
    assert plan_for("torch", "gpu", False) is execution_plan.OP_BY_OP
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
    request = (np.array([0, -1, 0, 0, -1, 0, 0, 0, 0], "int32"), excluded)
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
