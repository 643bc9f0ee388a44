"""Headroom: an index laid out with capacities above its catalogue.

A decoding graph is traced from the layout's integers (level sizes, offsets,
per-step widths `B_t`), so an exact index makes every catalogue change a new
graph: re-trace, export, check load. An index with headroom has arrays sized
by capacities instead: each level holds `ceil(n_t * (1 + headroom))` slots,
each step's width cap is `B_t + ceil(headroom * B_t)` (at least 2 in the
tail, so every tail level keeps row pointers and any state may branch). The
used slots are the exact index's, renumbered into the capacity offsets; the
others are unreachable padding (no row points at a padded edge, padded rows
are empty, padded leaves have item id -1), so the search answers exactly as
over the exact index. Any catalogue within the capacities (`fits`) is then
new array values for the same graph: a catalogue delta publishes like a
rules refresh (`static_keras.export.catalogue_update`).

Cost: bytes grow by about the headroom share plus the row pointers of
levels that had none (4 bytes per state of each such level); steps of those
levels read a row pointer pair and a wider slice (docs/benchmarks.md).

NumPy only.
"""

from __future__ import annotations

import math

import numpy as np

from static_keras.index import aligned_arrays
from static_keras.index.layout import IndexLayout


class CapacityError(ValueError):
    """A catalogue does not fit the capacities of a layout with headroom."""


def check_headroom(headroom) -> float:
    """`headroom` as a float in `[0, 10]`; ValueError naming it otherwise."""
    if isinstance(headroom, bool) or not isinstance(headroom, (int, float, np.floating)):
        raise ValueError(f"`headroom` must be a number >= 0. Received: headroom={headroom!r}")
    value = float(headroom)
    if not 0 <= value <= 10 or math.isnan(value):
        raise ValueError(f"`headroom` must lie in [0, 10]. Received: headroom={headroom!r}")
    return value


def capacity_layout(layout: IndexLayout, headroom: float) -> IndexLayout:
    """The layout with capacities `headroom` above the used sizes of `layout`."""
    headroom = check_headroom(headroom)
    used = layout.filled_level_sizes
    vocab, d = layout.vocab_size, layout.dense_levels
    sizes = [1] + [
        min(vocab**t, n + max(1, math.ceil(headroom * n))) for t, n in enumerate(used) if t
    ]
    widths = []
    for t, width in enumerate(layout.step_widths):
        cap = width + max(1, math.ceil(headroom * width))
        widths.append(min(vocab, max(cap, 2) if t >= d else cap))
    return IndexLayout.create(
        vocab_size=vocab,
        length=layout.length,
        dense_levels=d,
        level_sizes=sizes,
        step_widths=widths,
        has_item_ids=layout.has_item_ids,
        used_level_sizes=used,
    )


def misfits(capacity: IndexLayout, exact: IndexLayout) -> list[str]:
    """What of `exact` (an index without headroom) exceeds `capacity`, one
    phrase each; empty when it fits."""
    problems = []
    for name in ("vocab_size", "length", "dense_levels", "has_item_ids"):
        if getattr(capacity, name) != getattr(exact, name):
            problems.append(f"{name} {getattr(exact, name)} (the layout has "
                            f"{getattr(capacity, name)})")  # fmt: skip
    if problems:
        return problems
    for t, (n, cap) in enumerate(zip(exact.level_sizes, capacity.level_sizes)):
        if n > cap:
            what = "members" if t == exact.length else f"prefixes of length {t}"
            problems.append(f"{n:,} {what} (capacity {cap:,})")
    for t, (width, cap) in enumerate(zip(exact.step_widths, capacity.step_widths)):
        if width > cap:
            problems.append(f"a fan-out of {width} at step {t} (cap B_{t} = {cap})")
    return problems


def fitted_layout(capacity: IndexLayout, exact: IndexLayout) -> IndexLayout:
    """`capacity` holding the used sizes of `exact` (an index without
    headroom). CapacityError naming every capacity it exceeds."""
    problems = misfits(capacity, exact)
    if problems:
        raise CapacityError(
            "The catalogue does not fit the index's headroom: "
            + "; ".join(problems)
            + ". Publish it in full (`publish`) with more headroom"
        )
    return IndexLayout.create(**{**capacity.to_config(), "used_level_sizes": exact.level_sizes})


def fit(capacity: IndexLayout, exact: IndexLayout, arrays: dict) -> tuple[IndexLayout, dict]:
    """`(layout, arrays)` of the exact index `(exact, arrays)` laid out in the
    capacities of `capacity`. CapacityError naming every capacity it exceeds."""
    if exact.has_headroom:
        raise ValueError("`fit` takes an index without headroom")
    layout = fitted_layout(capacity, exact)
    shapes = layout.array_shapes()
    out = {
        "dense_masks": arrays["dense_masks"],
        "dense_states": arrays["dense_states"],
        "tokens": aligned_arrays.zeros(*shapes["tokens"]),
        "indptr": aligned_arrays.zeros(*shapes["indptr"]),
    }
    used = exact.level_sizes
    for t in range(exact.dense_levels, exact.length):
        source, target = exact.edge_offsets[t], layout.edge_offsets[t]
        edges = used[t + 1]
        out["tokens"][target : target + edges] = arrays["tokens"][source : source + edges]
        if t not in layout.indptr_offsets:
            continue  # a level that no state may branch at (width cap 1)
        row0 = layout.indptr_offsets[t]
        rows = out["indptr"][row0 : row0 + layout.level_sizes[t] + 1]
        if t in exact.indptr_offsets:
            first = exact.indptr_offsets[t]
            starts = arrays["indptr"][first : first + used[t] + 1].astype(np.int64) - source
        else:  # one child per state: state i's edge is edge i
            starts = np.arange(used[t] + 1, dtype=np.int64)
        rows[: used[t] + 1] = starts + target
        rows[used[t] + 1 :] = target + edges  # padded rows: empty, past the used edges
    if exact.has_item_ids:
        ids = aligned_arrays.full(layout.num_members, -1, np.int64)
        ids[: exact.num_members] = arrays["leaf_item_ids"]
        out["leaf_item_ids"] = ids
    return layout, out


def with_headroom(layout: IndexLayout, arrays: dict, headroom: float) -> tuple[IndexLayout, dict]:
    """`(layout, arrays)` of an exact index laid out with `headroom`
    (`headroom=0`: returned as they are)."""
    if check_headroom(headroom) == 0:
        return layout, arrays
    return fit(capacity_layout(layout, headroom), layout, arrays)
