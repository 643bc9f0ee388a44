"""Constrained beam search over a fixed number of steps, in `keras.ops`."""

from __future__ import annotations

import dataclasses
from typing import Any
from typing import Callable

import keras
import numpy as np
from keras import ops

from static_keras.constraint import eligibility_request
from static_keras.constraint.decoding_constraint import DecodingConstraint
from static_keras.decoding import beam_steps
from static_keras.decoding.unconstrained import Unconstrained
from static_keras.index.automaton import TokenAutomaton
from static_keras.kernels import execution_plan
from static_keras.kernels import gather
from static_keras.layers.automaton_constraint import AutomatonConstraint
from static_keras.layers.layer_classes import constraint_for

StepFn = Callable[[Any, Any], tuple[Any, Any]]


def beam_search(
    index: TokenAutomaton | DecodingConstraint | None,
    step_fn: StepFn,
    batch_size,
    beam_size: int,
    *,
    initial_state=None,
    num_results: int | None = None,
    dense_top_k: int | None = None,
    length: int | None = None,
    distinct_items: bool = True,
    eligibility=None,
) -> dict:
    """Beam search that only returns sequences of the valid set.

    Runs `L = index.length` unrolled steps with static shapes (XLA compiles
    it; the same graph runs without XLA). At step t, for `R = batch_size *
    beam_size` rows: `step_fn` scores the next token, log-softmax in
    float32, the index gives each beam its `K_t` valid candidates, and the
    best `beam_size` of the `beam_size * K_t` extensions survive. The
    decoder state is reordered by parent beam at every step, so a KV cache
    stays aligned with its beam. The first step has one live beam per batch
    row, so `step_fn` scores only those (`B` rows). With `beam_size` at
    least the number of valid sequences the result is exact: every valid
    sequence, ranked by total log-probability. docs/api.md has the details.

    Args:
        index: a `TokenAutomaton` (`StaticIndex`, `StringIndex`: its layer is
            made with `constraint_for`), a `DecodingConstraint`, or None (an
            unconstrained search over `length` steps). A constraint with an
            int `eos_token_id` decodes variable-length sequences: a beam ends
            at that token (later positions are -1); only ended beams return.
        step_fn: `step_fn(prefix, state) -> (logits, state)`: `prefix` int32
            `[rows, t]`, `logits` `[rows, V]`, `state` any nest of tensors
            with leading dimension `rows` (`B` at `t = 0`, `R` after it).
            Rows are independent.
        batch_size: int (or scalar int tensor), B.
        beam_size: int, M, beams kept per batch row.
        initial_state: nest of tensors with leading dimension B, or R (row
            `b * beam_size + m`; the first step reads row `b * beam_size`).
        num_results: int K <= beam_size (the default), results per batch row.
        dense_top_k: int, tokens per beam at the steps after the first whose
            rows come from the vocabulary: the dense head of semantic IDs,
            every step of a string set or of an unconstrained search. The
            constraint's step methods and `capped_top_k` take it under the
            same name. Defaults to `beam_size` (exact).
        length: int, steps of an unconstrained search (None with an index).
        distinct_items: bool. With an EOS constraint, each member once, with
            its best tokenization found (a finished beam whose state a better
            finished beam holds is dropped; lossless). False: every
            tokenization. No effect on fixed-length sets. Defaults to True.
        eligibility: None, or an `Eligibility(set_ids=int [B], excluded=int
            [B, E])` per batch row (set -1: any; excluded member numbers
            padded with `num_members`; either may be None), for a layer with
            eligibility sets: every result is eligible and not excluded, and
            with `beam_size` at least their number, their exhaustive ranking.

    Returns:
        dict with `tokens` int32 `[B, K, L]`, `scores` float32 `[B, K]` (sum of
        the chosen tokens' log-softmax scores), and `item_ids` `[B, K]` when
        the index has item ids; sorted by score, descending. Where fewer valid
        sequences exist than K, the rest is padding: tokens -1, score -inf,
        item id -1.

    Example:

    >>> import numpy as np
    >>> from keras import ops
    >>> from static_keras import StaticIndex
    >>> index = StaticIndex.build([[1, 2], [1, 3], [0, 2]], vocab_size=4)
    >>> def step_fn(prefix, state):
    ...     return ops.zeros((ops.shape(prefix)[0], 4)), state
    >>> out = beam_search(index, step_fn, batch_size=1, beam_size=4)
    >>> np.asarray(out["tokens"])[0, :3].tolist()
    [[0, 2], [1, 2], [1, 3]]
    >>> np.asarray(out["tokens"])[0, 3].tolist()
    [-1, -1]

    References:
        Su et al., "Vectorizing the Trie: Efficient Constrained Decoding for
        LLM-based Generative Retrieval on Accelerators" (arXiv:2602.22647).
    """
    constraint = _constraint_of(index, length)
    beam_size, num_results, dense_top_k, batch_size = _checked_sizes(
        beam_size, num_results, dense_top_k, batch_size
    )
    rows = batch_size * beam_size
    per_batch_row, per_beam_row = _eligibility_rows(constraint, eligibility, batch_size, beam_size)
    search = beam_steps.Search(
        constraint,
        batch_size,
        beam_size,
        dense_top_k,
        bool(distinct_items),
        batch_index=ops.expand_dims(ops.arange(batch_size, dtype="int32"), 1),
        eligibility=per_batch_row,
        beam_eligibility=per_beam_row,
    )
    beams = beam_steps.Beams(
        scores=None,
        states=ops.zeros((rows,), dtype="int32"),
        prefix=ops.zeros((batch_size, 0), dtype="int32"),  # the first step: B rows
        finished=ops.zeros((rows,), dtype="bool"),
        decoder_state=_first_rows(initial_state, batch_size, rows),
    )
    # One plan for the whole trace: every kernel built below asks this one.
    with execution_plan.using(execution_plan.current()):
        for step in range(constraint.length):
            logits, decoder_state = step_fn(beams.prefix, beams.decoder_state)
            beams = dataclasses.replace(beams, decoder_state=decoder_state)
            step_rows = beam_steps.step_rows(search, beams, step)
            extensions = beam_steps.expand(search, beams, step_rows, logits, step)
            ranked = beam_steps.rank(search, step_rows, extensions)
            beams = beam_steps.reorder(search, beams, step_rows, extensions, ranked, step)
        return beam_steps.finish(search, beams, num_results)


def _checked_sizes(beam_size, num_results, dense_top_k, batch_size):
    """`(beam_size, num_results, dense_top_k, batch_size)` checked, defaults filled."""
    beam_size = _positive_int(beam_size, "beam_size")
    num_results = beam_size if num_results is None else _positive_int(num_results, "num_results")
    if num_results > beam_size:
        raise ValueError(
            f"`num_results` must be at most `beam_size`={beam_size}. "
            f"Received: num_results={num_results}"
        )
    dense_top_k = beam_size if dense_top_k is None else _positive_int(dense_top_k, "dense_top_k")
    if isinstance(batch_size, (int, np.integer)):
        batch_size = _positive_int(batch_size, "batch_size")
    return beam_size, num_results, dense_top_k, batch_size


def _eligibility_rows(constraint, eligibility, batch_size, beam_size):
    """A request's eligibility per batch row and per beam row (None, None
    without one), checked and set out once per decode: every later state
    was entered under it."""
    if eligibility is None:
        return None, None
    if not isinstance(constraint, AutomatonConstraint):
        raise ValueError(
            "`eligibility` needs an AutomatonConstraint index (StaticIndex, "
            "StringIndex, or their layers) built with eligibility sets"
        )
    per_batch_row = constraint.check_eligibility(eligibility, rows=batch_size)
    return per_batch_row, eligibility_request.repeat_rows(per_batch_row, beam_size, entered=True)


def _constraint_of(index, length) -> DecodingConstraint:
    """The constraint a search runs: the layer of a `TokenAutomaton`, a
    `DecodingConstraint` as is, or `Unconstrained(length)` for None."""
    if index is None:
        if length is None:
            raise ValueError("An unconstrained beam search (index=None) needs `length`")
        return Unconstrained(_positive_int(length, "length"))
    if length is not None:
        raise ValueError("`length` is given by the index; pass length=None")
    if isinstance(index, TokenAutomaton):
        return constraint_for(index)
    if isinstance(index, DecodingConstraint):
        return index
    raise ValueError(
        "`index` must be a TokenAutomaton (StaticIndex, StringIndex), a "
        "DecodingConstraint (ConstrainedDecoding, StringConstrainedDecoding, a "
        f"baseline), or None. Received: {type(index).__name__}"
    )


def _first_rows(state, batch_size, rows):
    """The state of the first step: each batch row's row of `state`, whose
    leading dimension is B or R = B x beam (batch-major)."""
    if state is None:
        return None

    def first(x):
        have = ops.shape(x)[0]
        if isinstance(have, int) and isinstance(batch_size, int):
            if have == batch_size:
                return x
            if have != rows:
                raise ValueError(
                    f"`initial_state` tensors must have {batch_size} (batch) or {rows} "
                    f"(batch x beam) rows. Received shape {tuple(x.shape)}"
                )
        # Row b * stride: stride 1 for B rows, beam_size for R (also when
        # the batch size is only known at run time, as in a served model).
        stride = have // batch_size
        return gather.take(x, ops.arange(batch_size, dtype="int32") * stride)

    return keras.tree.map_structure(first, state)


def _positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"`{name}` must be a positive integer. Received: {name}={value!r}")
    return int(value)
