"""A request's eligibility: as a caller gives it, and checked and set out once per decode.

A request restricts each row to an eligibility set and excludes some
members (`static_keras.index.eligibility`). A caller passes an `Eligibility`
(the served signature, `ConstrainedBeamSearch`, `beam_search`, a
constraint's step methods); `prepare` checks it (a clear error for a bad id,
dtype or shape) and sets it out for the steps as a `RequestEligibility`: the
excluded members sorted and deduplicated, with a running count of those
that count, so the excluded members inside a candidate's range are two
searches in the row (`eligibility_kernels.counted_below`), never an
`[R, K, E]` compare. A kind whose steps read more (the semantic-ID dense
head) extends it with a subclass of its own
(`dense_step_eligibility.DenseRequestEligibility`).
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any
from typing import NamedTuple

import keras
import numpy as np
from keras import ops

from static_keras.kernels import eligibility_kernels


class Eligibility(NamedTuple):
    """A request's eligibility, per row, as a caller gives it.

    A named tuple, so it travels through Keras calls and functional models
    as a nest of tensors (`keras.Input`s included).

    Fields (either may be None: no such restriction):
        set_ids: int `[R]`, each row's eligibility set; -1: no set.
        excluded: int `[R, E]`, each row's excluded member numbers
            (`MemberCatalogue.exclusion_members`), any order, repeats and
            padding (any value outside `[0, num_members)`) allowed.
    """

    set_ids: Any = None
    excluded: Any = None


@dataclasses.dataclass(frozen=True)
class RequestEligibility:
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
        entered: Python bool: every state passed with this was entered under
            it (a beam search), so a step whose states each have one child
            need not filter (that child has the same members).
        group: Python int: a kind's per-request tables have a row per
            `group` rows (a batch row's beams, `repeat_rows`).
        num_members: Python int, the members of the index it was set out
            for (member numbers mean nothing under another index).
    """

    set_ids: Any = None
    excluded: Any = None
    excluded_before: Any = None
    entered: bool = False
    group: int = 1
    num_members: int | None = None


def as_eligibility(eligibility) -> Eligibility:
    """`eligibility` as an `Eligibility`; the `(set_ids, excluded)` pair of
    release 0.1 still works, with a DeprecationWarning."""
    if isinstance(eligibility, Eligibility):
        return eligibility
    if isinstance(eligibility, (tuple, list)) and len(eligibility) == 2:
        warnings.warn(
            "Pass a request's eligibility as static_keras.Eligibility(set_ids=..., "
            "excluded=...); the (set_ids, excluded) pair is deprecated",
            DeprecationWarning,
            stacklevel=3,
        )
        return Eligibility(*eligibility)
    raise ValueError(
        "`eligibility` must be a static_keras.Eligibility(set_ids=[R] or None, "
        f"excluded=[R, E] or None). Received: {type(eligibility).__name__}"
    )


def check_eligibility(eligibility, num_sets: int, rows=None) -> Eligibility:
    """`Eligibility(set_ids int32 [R] or None, excluded int32 [R, E] or None)`, checked.

    Set ids must lie in `[-1, num_sets)` (-1: no set restriction); both must
    hold integers (a float id would be truncated to another set, a float
    member to another item: TypeError) and have one row per row (`rows`, an
    int, when it is known: ValueError). Concrete values (eager) are checked
    here; symbolic ones (a TF graph, `jax.jit`) cannot be, and an
    out-of-range id there keeps nothing (its row gets no candidates).
    """
    set_ids, excluded = as_eligibility(eligibility)
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
    return Eligibility(set_ids, excluded)


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
    words, num_members: int, eligibility, num_sets: int, extend=None, rows=None
) -> RequestEligibility:
    """A `RequestEligibility` from an `Eligibility` (checked by
    `check_eligibility`; a `RequestEligibility` is returned as is).
    `extend`: None, or the kind's function of the `RequestEligibility` that
    returns what its steps read (a subclass with more fields). `rows`: the
    rows the request must have, where known.

    Excluded entries may come in any order, repeat, or be padding (any value
    outside `[0, num_members)`): they are sorted, and each member counts once.
    """
    if isinstance(eligibility, RequestEligibility):
        if eligibility.num_members not in (None, num_members):
            raise ValueError(
                f"`eligibility` was set out for an index of {eligibility.num_members} members; "
                f"this layer's has {num_members}: check the request against this layer"
            )
        return eligibility
    set_ids, excluded = check_eligibility(eligibility, num_sets, rows)
    if set_ids is not None:
        known = ops.logical_and(ops.greater_equal(set_ids, -1), ops.less(set_ids, num_sets))
        set_ids = ops.where(known, set_ids, -2)
    if excluded is None or excluded.shape[1] == 0:
        request = RequestEligibility(set_ids, num_members=num_members)
        return request if extend is None else extend(request)

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
    request = RequestEligibility(set_ids, searched, before, num_members=num_members)
    return request if extend is None else extend(request)


def repeat_rows(request: RequestEligibility, times: int, entered: bool) -> RequestEligibility:
    """Each row `times` times in a row (batch rows to beams, whose states
    are distinct at every step). A kind's own tables stay one row per batch
    row (`group`): a dense step finds the beam each emptied code is below,
    instead of testing every code against every beam's state."""
    repeated = {
        name: None if value is None else ops.repeat(value, times, axis=0)
        for name in ("set_ids", "excluded", "excluded_before")
        for value in [getattr(request, name)]
    }
    return dataclasses.replace(request, **repeated, entered=entered, group=request.group * times)
