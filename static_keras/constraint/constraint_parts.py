"""`ConstraintParts`: what a kind of constraint supplies to `AutomatonConstraint`.

A kind makes its parts once (`AutomatonConstraint._make_parts`), after the
layout is known and before any weight exists; the parts read the layer's
weight groups, which `build()` fills. docs/concepts.md has the table of
which part owns which weights and decides what.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class ConstraintParts:
    """The parts of one kind of constraint.

    transitions: where a state's CSR row is and where an edge leads:
        `rows`, `edge_targets`, `width`, `same_members`, read by the shared
        sparse kernels (`constraint/sparse_step.py`).
    dense_head: a `DenseHead` (`constraint/dense_head.py`, semantic IDs: a
        bit-packed mask row per state of the first levels, with weights it
        derives from the index), or None: no dense head.
    dense_eligibility: a `DenseStepEligibility`
        (`constraint/dense_step_eligibility.py`: the dense head's steps' masks,
        derived from the sets), or None: no eligibility weights of its own.
    member_ranges: `weight_shapes()`, `weight_arrays(index)`,
        `ranges(states, depth)`, `keep(request, edges, step)`: what
        eligibility sets read of the kind's states
        (`constraint/tree_member_ranges.py`, `strings/string_member_ranges.py`).
    """

    transitions: object
    dense_head: object = None
    dense_eligibility: object = None
    member_ranges: object = None
