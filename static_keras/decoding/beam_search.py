"""Constrained beam search over a fixed number of steps, in `keras.ops`."""

from __future__ import annotations

from typing import Any
from typing import Callable

import keras
import numpy as np
from keras import ops

from static_keras.constants import INVALID_STATE
from static_keras.constants import PAD_TOKEN
from static_keras.index.automaton import TokenAutomaton
from static_keras.layers import capped_top_k
from static_keras.layers import eligibility_step
from static_keras.layers import execution_plan
from static_keras.layers import gather
from static_keras.layers import two_stage_top_k
from static_keras.layers.automaton_constraint import AutomatonConstraint
from static_keras.layers.automaton_constraint import constraint_for
from static_keras.layers.decoding_constraint import DecodingConstraint

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
    decoder state is reordered by parent beam at every step, like the token
    history, so a KV cache stays aligned with its beam. The first step has
    one live beam per batch row, so `step_fn` scores only those: it is
    called with `B` rows (`prefix` `[B, 0]`, the state's row of each batch
    row), and every later step with `R`.

    With `beam_size` at least the number of valid sequences the result is
    exact: every valid sequence, ranked by total log-probability.

    Args:
        index: a `TokenAutomaton` (`StaticIndex`, `StringIndex`), which is
            turned into its layer (`constraint_for`), a `DecodingConstraint`
            (the layers `ConstrainedDecoding`, `StringConstrainedDecoding`,
            or the benchmarks' baselines), or None for an unconstrained
            search (the baseline: plain top-k over the vocabulary, `length`
            steps). Item ids are returned when the constraint
            `has_item_ids`. A constraint with an int `eos_token_id` decodes
            variable-length sequences: a beam ends when it emits that token
            (later positions are -1) and only ended beams are returned.
        step_fn: `step_fn(prefix, state) -> (logits, state)`. `prefix` is
            int32 `[rows, t]` (the tokens so far), `logits` `[rows, V]`,
            `state` any nest of tensors with leading dimension `rows`:
            `B` at the first step (`t = 0`), `R` after it. Rows are
            independent: row i's logits depend on row i alone.
        batch_size: int (or scalar int tensor), B.
        beam_size: int, M, beams kept per batch row.
        initial_state: nest of tensors with leading dimension B (one row
            per batch row, as a prompt's cache) or R (rows ordered
            batch-major, row `b * beam_size + m`; the first step reads row
            `b * beam_size`). Defaults to None.
        num_results: int K <= beam_size, results returned per batch row.
            Defaults to `beam_size`.
        dense_top_k: int. Candidates kept per beam at dense-head steps
            after the first (the reference code's "tokens per beam"; at
            every step after the first for an unconstrained search, which
            has no sparse steps). The first step has one live beam per
            batch row and keeps its best `beam_size` candidates whatever
            this is. Defaults to `beam_size` (exact: a beam never
            contributes more than `beam_size` survivors).
        length: int. Steps of an unconstrained search; must be None (the
            index's length is used) when `index` is given.
        distinct_items: bool. With an EOS constraint, keep one finished beam
            per final state: a string set spells one member by several
            tokenizations (`a|bc`, `ab|c`), all ending in the member's
            accept state, and without this the results would repeat the
            member. At every step, a finished beam whose state a better
            finished beam already holds is dropped, which frees its slot
            for other candidates; each member is returned once, with its
            best tokenization found. Lossless: a finished beam's score never
            changes. No effect on fixed-length sets (every leaf is one
            item). Defaults to True; False returns every tokenization.
        eligibility: None, or `(set_ids, excluded)` per batch row: int32
            `[B]` eligibility set ids (-1: no set) and int32 `[B, E]` excluded
            member numbers padded with `num_members`
            (`MemberCatalogue.exclusion_members`); either may be None. Needs
            an `AutomatonConstraint` with eligibility sets. Every step keeps
            only candidates with an eligible, non-excluded member below, so
            every result is one, and with `beam_size` at least their number
            the results are their exhaustive ranking. A batch row's beams
            never leave it, so each beam reads its batch row's entry.

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
    if index is None:
        if length is None:
            raise ValueError("An unconstrained beam search (index=None) needs `length`")
        constraint = None
        length = _positive_int(length, "length")
    else:
        if length is not None:
            raise ValueError("`length` is given by the index; pass length=None")
        if isinstance(index, TokenAutomaton):
            constraint = constraint_for(index)
        elif isinstance(index, DecodingConstraint):
            constraint = index
        else:
            raise ValueError(
                "`index` must be a TokenAutomaton (StaticIndex, StringIndex), a "
                "DecodingConstraint (ConstrainedDecoding, StringConstrainedDecoding, a "
                f"baseline), or None. Received: {type(index).__name__}"
            )
        length = constraint.length
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
    rows = batch_size * beam_size
    per_batch_row = per_beam_row = None  # eligibility at step 0 and after it
    if eligibility is not None:
        if not isinstance(constraint, AutomatonConstraint):
            raise ValueError(
                "`eligibility` needs an AutomatonConstraint index (StaticIndex, "
                "StringIndex, or their layers) built with eligibility sets"
            )
        # Set out once per decode; every later state was entered under it.
        per_batch_row = constraint.check_eligibility(eligibility, rows=batch_size)
        per_beam_row = eligibility_step.repeat_rows(per_batch_row, beam_size, entered=True)

    beam_scores = None  # set by the first step, which starts from one beam per row
    beam_states = ops.zeros((rows,), dtype="int32")
    prefix = ops.zeros((batch_size, 0), dtype="int32")  # step 0 scores one row per batch row
    batch_base = ops.expand_dims(ops.arange(batch_size, dtype="int32") * beam_size, 1)
    state = _first_rows(initial_state, batch_size, rows)
    # Variable-length sets (strings) end with EOS: a finished beam keeps its
    # score and proposes only itself (token -1) at every later step.
    eos = None if constraint is None else constraint.eos_token_id
    finished = ops.zeros((rows,), dtype="bool")

    batch_index = ops.expand_dims(ops.arange(batch_size, dtype="int32"), 1)
    first_step_parent = ops.repeat(ops.arange(batch_size, dtype="int32"), beam_size)
    for step in range(length):
        logits, state = step_fn(prefix, state)
        if step == 0:
            # One live beam per batch row: only its candidates are scored
            # and ranked ([B, V] logits), and all of its best `beam_size`
            # survive.
            row_states = ops.zeros((batch_size,), dtype="int32")
            row_scores = ops.zeros((batch_size,), dtype="float32")
            beams, per_beam = 1, beam_size
        else:
            row_states, row_scores, beams, per_beam = (
                beam_states,
                beam_scores,
                beam_size,
                dense_top_k,
            )
        # log-softmax = (logits - max) - log(sum(exp(logits - max))), as
        # `jax.nn.log_softmax` computes it. Only the chosen candidates need
        # the second term: candidates are picked on the shifted logits (the
        # same order within a row) and the row's normaliser is subtracted
        # from their scores, so no [R, V] log-prob matrix is written. The
        # shifted logits are the one [R, V] tensor every consumer reads:
        # under XLA a model's output then fuses into a single pass, as in
        # the reference's log-softmax (reading the logits themselves made a
        # gather-model's output materialise twice), and the graph executor
        # computes them for the normaliser anyway.
        logits, normaliser = _shift_and_normaliser(ops.cast(logits, "float32"))
        here = per_batch_row if step == 0 else per_beam_row
        # A beam never gives more than `beam_size` survivors, so a cap of
        # `beam_size` or more never binds: then no per-beam top-k at all.
        cap = None if per_beam >= beam_size and (eos is None or step == 0) else per_beam
        # A binding cap by rankings of whole batch rows (`capped_top_k`),
        # where the plan says so, or by a top-k per beam.
        capped_rows = (
            cap is not None and eos is None and execution_plan.current().rank_capped_beams_by_row
        )
        scores, tokens, next_states, apply_cap = _step_candidates(
            constraint, logits, row_states, step, cap, per_beam, here, eos is None, capped_rows
        )
        scores = scores - normaliser  # -inf (padding, disallowed) stays -inf
        width = ops.shape(scores)[1]
        if eos is not None and step > 0:
            done = ops.expand_dims(finished, 1)
            itself = ops.where(ops.equal(ops.arange(width), 0), 0.0, -np.inf)[None, :]
            scores = ops.where(done, itself, scores)
            tokens = ops.where(done, PAD_TOKEN, tokens)
            next_states = ops.where(done, ops.expand_dims(beam_states, 1), next_states)
        total = ops.reshape(ops.expand_dims(row_scores, 1) + scores, (-1, beams, width))
        if apply_cap:  # whole rows or uncapped candidates, `cap` per beam
            beam_scores, choice = capped_top_k.capped_top_k(total, beam_size, cap)
        else:
            total = ops.reshape(total, (-1, beams * width))
            if beams * width < beam_size:  # step 0 with fewer candidates than beams
                total = ops.pad(
                    total, [[0, 0], [0, beam_size - beams * width]], constant_values=-np.inf
                )
            # [B, M]; rows of every (beam, token) are long: two stages
            beam_scores, choice = two_stage_top_k.top_k(total, beam_size)
        choice = ops.minimum(choice, beams * width - 1)  # padding: dead
        if beams == 1:
            # One candidate row per batch row (the first step, or beam 1):
            # every survivor's parent is its batch row's row, known before
            # ranking, and with beam 1 no row moves at all.
            column = choice
            parent = None if beam_size == 1 else first_step_parent
        else:
            beam = choice // width  # [B, M]: the parent beam within its batch row
            column = choice - beam * width
            parent = ops.reshape(batch_index * beams + beam, (-1,))  # [R]: rows of this step

        def parents_of(x):  # each new beam's parent row of `x`
            return x if parent is None else gather.take(x, parent)

        live = ops.reshape(ops.greater(beam_scores, -np.inf), (-1,))
        beam_scores = ops.reshape(beam_scores, (-1,))
        if tokens is None:  # ranked the whole vocabulary: the column is the token
            token = ops.reshape(column, (-1,))
            if constraint is None:
                next_state = ops.zeros_like(token)
            else:
                next_state = constraint.advance(parents_of(row_states), token, step)
        else:
            flat_choice = ops.reshape(batch_index * (beams * width) + choice, (-1,))
            token = gather.take(ops.reshape(tokens, (-1,)), flat_choice)
            if next_states is None:  # dead rows' padding tokens advance to -1
                next_state = constraint.advance(parents_of(row_states), token, step)
            else:
                next_state = gather.take(ops.reshape(next_states, (-1,)), flat_choice)
        token = ops.where(live, token, PAD_TOKEN)
        beam_states = ops.where(live, next_state, INVALID_STATE)
        prefix = ops.concatenate([parents_of(prefix), ops.expand_dims(token, 1)], axis=1)
        if eos is not None:
            ended = ops.logical_or(parents_of(finished), ops.equal(token, eos))
            finished = ops.logical_and(live, ended)
            if distinct_items:
                repeat = _repeated_finished(beam_states, finished, beam_size)
                beam_scores = ops.where(repeat, -np.inf, beam_scores)
                finished = ops.logical_and(finished, ops.logical_not(repeat))
        if step + 1 < length and state is not None and parent is not None:
            state = keras.tree.map_structure(lambda x: ops.take(x, parent, axis=0), state)

    if eos is not None:
        # Only beams that emitted EOS are members; the others ran out of steps.
        beam_scores = ops.where(finished, beam_scores, -np.inf)
        beam_scores, order = ops.top_k(ops.reshape(beam_scores, (-1, beam_size)), beam_size)
        order = ops.reshape(batch_base + ops.cast(order, "int32"), (-1,))
        beam_scores = ops.reshape(beam_scores, (-1,))
        prefix = ops.take(prefix, order, axis=0)
        beam_states = ops.take(beam_states, order)
    live = ops.greater(beam_scores, -np.inf)
    tokens = ops.where(ops.expand_dims(live, 1), prefix, PAD_TOKEN)
    result = {
        "tokens": ops.reshape(tokens, (-1, beam_size, length))[:, :num_results],
        "scores": ops.reshape(beam_scores, (-1, beam_size))[:, :num_results],
    }
    if constraint is not None and constraint.has_item_ids:
        ids = constraint.item_ids(ops.where(live, beam_states, INVALID_STATE))
        result["item_ids"] = ops.reshape(ids, (-1, beam_size))[:, :num_results]
    return result


def _step_candidates(
    constraint, logits, row_states, step, cap, per_beam, eligibility, fixed, capped_rows
):
    """`(scores, tokens, next_states, apply_cap)` of one step: `[rows, V]`
    scores with tokens and next states None (the column is the token), or
    `[rows, K]` candidates whose next states may be None (`advance` the
    survivors); `apply_cap`: the search still has to cap each beam at `cap`.
    `cap`: tokens per beam, None where no cap can bind; `fixed`: no EOS;
    `capped_rows`: the search applies a binding cap itself where it can
    (`capped_top_k`), on whole rows or uncapped candidates."""

    def ask(method, *args, **kwargs):  # baselines take no `eligibility`
        if eligibility is not None:
            kwargs["eligibility"] = eligibility
        return getattr(constraint, method)(*args, **kwargs)

    if constraint is None:
        if cap is None or capped_rows:
            return logits, None, None, cap is not None
        scores, tokens = ops.top_k(logits, min(per_beam, ops.shape(logits)[1]))
        tokens = ops.cast(tokens, "int32")
        return scores, tokens, ops.zeros_like(tokens), False
    if cap is None or capped_rows:
        # Rank every (beam, token) of a batch row at once where the
        # constraint has the whole matrix (a dense mask).
        scores = ask("vocabulary_scores", logits, row_states, step)
        if scores is not None:
            return scores, None, None, cap is not None
    if capped_rows and constraint.caps(step):
        return (*ask("candidates", logits, row_states, step, top_k=None), True)
    if fixed:
        # Where a candidate's next state is a cold table read (a dense
        # head's state map), take scores and tokens only.
        found = ask("candidate_tokens", logits, row_states, step, top_k=cap)
        if found is not None:
            return (*found, None, False)
    return (*ask("candidates", logits, row_states, step, top_k=cap), False)


def _shift_and_normaliser(logits):
    """`(shifted [R, V], normaliser [R, 1])`, float32: each row minus its max,
    and `log(sum(exp(shifted)))`; `shifted - normaliser` is the log-softmax."""
    shifted = logits - ops.max(logits, axis=1, keepdims=True)
    return shifted, ops.log(ops.sum(ops.exp(shifted), axis=1, keepdims=True))


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


def _repeated_finished(states, finished, beam_size: int):
    """bool `[R]`: finished beams whose state a better finished beam of the
    same batch row holds (beams are sorted by score within a row)."""
    states = ops.reshape(states, (-1, beam_size))
    finished = ops.reshape(finished, (-1, beam_size))
    both = ops.logical_and(ops.expand_dims(finished, 2), ops.expand_dims(finished, 1))
    same = ops.logical_and(ops.equal(ops.expand_dims(states, 2), ops.expand_dims(states, 1)), both)
    before = ops.arange(beam_size)[:, None] > ops.arange(beam_size)[None, :]  # [i, j]: j < i
    return ops.reshape(ops.any(ops.logical_and(same, before[None]), axis=2), (-1,))


def _positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"`{name}` must be a positive integer. Received: {name}={value!r}")
    return int(value)
