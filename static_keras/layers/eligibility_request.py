"""A request's eligibility, checked and set out once per decode.

A request restricts each row to an eligibility set and excludes some
members (`static_keras.index.eligibility`). `prepare` checks it (a clear
error for a bad id, dtype or shape) and sets it out for the steps: the
excluded members sorted and deduplicated, with a running count of those
that count, so the excluded members inside a candidate's range are two
searches in the row (`eligibility_kernels.counted_below`), never an
`[R, K, E]` compare; a kind may add what its dense steps read
(`dense_excluded`).
"""

from __future__ import annotations

from typing import NamedTuple

import keras
import numpy as np
from keras import ops

from static_keras.layers import eligibility_kernels


class RequestEligibility(NamedTuple):
    """A request's eligibility per row, checked and set out once per decode
    (`prepare`), so a step only reads it.

    Fields (int32 tensors, or None for no such restriction):
        set_ids: `[R]`, each row's set; -1 no set; -2 an id out of range
            (the row keeps nothing).
        excluded: `[R, E + 1]` the row's excluded members, sorted, and a
            sentinel for `count_below`.
        excluded_before: `[R, E + 1]`, the excluded members the eligible counts
            include (real ones; eligible ones where the row has a set)
            before each slot, so a range's share is two reads.
        dense_excluded: kind-specific, read at dense steps (semantic IDs:
            int32 `[R, d, E + 1]`, `blocked_dense_codes`).
        entered: Python bool: every state passed with this was entered under
            it (a beam search), so a step whose states each have one child
            need not filter (that child has the same members).
        group: Python int: `dense_excluded` has a row per `group` rows (a
            batch row's beams, `repeat_rows`), whose states at a dense step
            are distinct (distinct prefixes of one length).
    """

    set_ids: object = None
    excluded: object = None
    excluded_before: object = None
    dense_excluded: object = None
    entered: bool = False
    group: int = 1


def check_eligibility(eligibility, num_sets: int, rows=None):
    """`(set_ids int32 [R] or None, excluded int32 [R, E] or None)`, checked.

    Set ids must lie in `[-1, num_sets)` (-1: no set restriction); both must
    hold integers (a float id would be truncated to another set, a float
    member to another item: TypeError) and have one row per row (`rows`, an
    int, when it is known: ValueError). Concrete values (eager) are checked
    here; symbolic ones (a TF graph, `jax.jit`) cannot be, and an
    out-of-range id there keeps nothing (its row gets no candidates).
    """
    if not isinstance(eligibility, (tuple, list)) or len(eligibility) != 2:
        raise ValueError(
            "`eligibility` must be a pair (set_ids [R], excluded [R, E]); either may be None"
        )
    set_ids, excluded = eligibility
    if set_ids is not None:
        if num_sets == 0:
            raise ValueError(
                "This layer holds no eligibility sets: build it with `eligibility=` "
                "(an EligibilitySets) or `eligibility_sets=S`, or pass set_ids=None"
            )
        set_ids = _integers(set_ids, "set_ids", "set ids, -1: no set")
        if len(ops.shape(set_ids)) != 1:
            raise ValueError(f"`set_ids` must be int [R]. Received shape {ops.shape(set_ids)}")
        check_rows("set_ids", ops.shape(set_ids), rows)
        values = _concrete(set_ids)
        if values is not None and values.size and (values.min() < -1 or values.max() >= num_sets):
            raise ValueError(
                f"`set_ids` must lie in [-1, {num_sets}) (-1: no set). "
                f"Received values in [{values.min()}, {values.max()}]"
            )
    if excluded is not None:
        excluded = _integers(excluded, "excluded", "member numbers, `exclusion_members`")
        if len(ops.shape(excluded)) != 2:
            raise ValueError(
                f"`excluded` must be int [R, E] member numbers (`exclusion_members`). "
                f"Received shape {ops.shape(excluded)}"
            )
        check_rows("excluded", ops.shape(excluded), rows)
    return set_ids, excluded


def check_rows(name: str, shape, rows) -> None:
    """ValueError unless `shape[0]` is `rows` (where both are known ints)."""
    known = isinstance(rows, (int, np.integer)) and isinstance(shape[0], (int, np.integer))
    if known and int(shape[0]) != int(rows):
        raise ValueError(
            f"`{name}` must have one row per batch row: expected {int(rows)} rows. "
            f"Received shape {tuple(shape)}"
        )


def _integers(x, name: str, what: str):
    """`x` as int32, after a TypeError unless it holds integers."""
    dtype = getattr(x, "dtype", None)
    if dtype is None:  # a list or a scalar: NumPy decides what it holds
        x = np.asarray(x)
        dtype = x.dtype
    if isinstance(dtype, np.dtype) and dtype.kind in "USO":
        dtype = "string"
    try:
        dtype = keras.backend.standardize_dtype(dtype)
    except ValueError:
        dtype = str(dtype)
    if not (dtype.startswith("int") or dtype.startswith("uint")):
        raise TypeError(f"`{name}` must hold integers ({what}). Received dtype {dtype}")
    return ops.cast(x, "int32")


def _concrete(x):
    try:
        return np.asarray(ops.convert_to_numpy(x))
    except Exception:  # symbolic: a graph tensor or a tracer
        return None


def prepare(
    words, num_members: int, eligibility, num_sets: int, dense_exclusions=None, rows=None
) -> RequestEligibility:
    """A `RequestEligibility` from `(set_ids [R], excluded [R, E])` (checked
    by `check_eligibility`; a `RequestEligibility` is returned as is).
    `dense_exclusions`: None, or the kind's function of `(set_ids, excluded,
    excluded_before)` giving `dense_excluded`. `rows`: the rows the request
    must have, where known.

    Excluded entries may come in any order, repeat, or be padding (any value
    outside `[0, num_members)`): they are sorted, and each member counts once.
    """
    if isinstance(eligibility, RequestEligibility):
        return eligibility
    set_ids, excluded = check_eligibility(eligibility, num_sets, rows)
    if set_ids is not None:
        known = ops.logical_and(ops.greater_equal(set_ids, -1), ops.less(set_ids, num_sets))
        set_ids = ops.where(known, set_ids, -2)
    if excluded is None or excluded.shape[1] == 0:
        return RequestEligibility(set_ids)

    real = ops.logical_and(ops.greater_equal(excluded, 0), ops.less(excluded, num_members))
    members = ops.sort(ops.where(real, excluded, num_members), axis=1)
    distinct = ops.not_equal(members[:, 1:], members[:, :-1])
    first = ops.concatenate([ops.ones_like(members[:, :1], "bool"), distinct], axis=1)
    counted = ops.logical_and(ops.less(members, num_members), first)
    if set_ids is not None:
        restricted = ops.greater_equal(set_ids, 0)
        safe = ops.where(restricted, set_ids, 0)
        eligible = eligibility_kernels.contains(words, safe[:, None], members)
        counted = ops.logical_and(
            counted, ops.logical_or(ops.logical_not(restricted[:, None]), eligible)
        )
    searched, before = eligibility_kernels.prepare_counted(members, counted)
    dense = None if dense_exclusions is None else dense_exclusions(set_ids, searched, before)
    return RequestEligibility(set_ids, searched, before, dense)


def repeat_rows(request: RequestEligibility, times: int, entered: bool) -> RequestEligibility:
    """Each row `times` times in a row (batch rows to beams, whose states
    are distinct at every step). The dense exclusions stay one row per
    batch row (`group`): a dense step finds the beam each emptied code is
    below, instead of testing every code against every beam's state."""
    fields = [None if x is None else ops.repeat(x, times, axis=0) for x in request[:3]]
    return RequestEligibility(*fields, request.dense_excluded, entered=entered,
                              group=request.group * times)  # fmt: skip


def dense_excluded_rows(request: RequestEligibility):
    """`dense_excluded` with one row per row (repeated if grouped)."""
    if request.group == 1:
        return request.dense_excluded
    return ops.repeat(request.dense_excluded, request.group, axis=0)
