"""Eligibility refresh benchmark: replacing one set vs rebuilding the index.

Random semantic IDs as in the STATIC paper (L=8, V=2048, d=2), item ids a
random permutation of 0..N-1. Per N, in a fresh subprocess (its peak RSS is
its own), it measures:

- the index build (`StaticIndex.build`), for comparison;
- the item id -> member map (`MemberCatalogue.from_index`, host only, once
  per index) and its bytes;
- `EligibilitySets.replace` of one set (of 3) from a random 50% subset of
  the item ids: median of 5 (the subsets are drawn before the clock starts);
- the stored dense-step mask rows a layer (`set_eligibility`) and a served
  refresh recompute for the replaced set (`dense_eligibility_masks`, the
  depths `eligibility_windows` does not derive at decode time), so the
  refresh is `replace` plus those;
- bits per member per set (words plus rank directory), and with the stored
  dense masks;
- the bytes `member_ranges` adds to the index (its dense-head table) and
  what the derived depths read of the index (`code_fields`, `mask_fields`,
  per index) against the index `nbytes`, and the host time of
  `member_ranges` and `count` for
  65,536 random tail states (candidate next states).

    python -m benchmarks.eligibility_refresh --sizes 1e5 1e6 1e7 2e7

Prints a table and writes benchmarks/results/eligibility_refresh.csv.
"""

from __future__ import annotations

import resource
import statistics
import time

from benchmarks.decoding.common import index_size_sweep

QUERIES = 65_536
REPEATS = 5


def _measure(n: int, vocab_size: int, length: int, dense_levels: int, seed: int) -> dict:
    import numpy as np

    from static_keras import StaticIndex
    from static_keras.index.dense_eligibility import dense_boundary_offsets
    from static_keras.index.dense_eligibility import dense_boundary_table
    from static_keras.index.dense_eligibility import dense_eligibility_masks
    from static_keras.index.eligibility import EligibilitySets
    from static_keras.index.eligibility import MemberCatalogue
    from static_keras.kernels.derived_dense_masks import code_fields
    from static_keras.kernels.derived_dense_masks import eligibility_windows
    from static_keras.kernels.derived_dense_masks import mask_fields

    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab_size, size=(n, length), dtype=np.uint16)
    item_ids = rng.permutation(n)
    start = time.perf_counter()
    index = StaticIndex.build(
        ids, vocab_size, item_ids=item_ids, dense_levels=dense_levels, on_duplicate_item="first"
    )
    build_s = time.perf_counter() - start
    del ids

    start = time.perf_counter()
    catalogue = MemberCatalogue.from_index(index)
    catalogue_s = time.perf_counter() - start
    half = n // 2
    subsets = [item_ids[rng.permutation(n)[:half]] for _ in range(REPEATS + 1)]
    start = time.perf_counter()
    sets = EligibilitySets.build(
        catalogue, {"region_a": subsets[0], "region_b": subsets[0], "in_stock": subsets[0]}
    )
    sets_build_s = time.perf_counter() - start
    times = []
    for subset in subsets[1:]:
        start = time.perf_counter()
        refreshed = sets.replace("in_stock", subset)
        times.append(time.perf_counter() - start)
    assert refreshed.sizes()["in_stock"] == half  # a permutation: every id is a member
    replace_s = statistics.median(times)

    # What a layer (`set_eligibility`) and a served refresh also compute: the
    # stored dense-step mask rows of every set (the depths the layer does
    # not derive at decode time), from the (per-index) boundary table. Only
    # the replaced set's masks are recomputed (its bits changed).
    table = dense_boundary_table(index.layout, index.arrays)
    offsets = dense_boundary_offsets(index.layout)
    windows = eligibility_windows(vocab_size, index.dense_levels, index.num_members, table, offsets)
    levels = windows.count(0)
    # What derived depths read of the index (per index, not per set).
    derived_bytes = 0
    for t, window in enumerate(windows):
        if window:
            first = index.layout.dense_mask_offsets[t]
            rows = index.arrays["dense_masks"][first : first + vocab_size**t]
            fields = code_fields(vocab_size, index.num_members, table, offsets, t, window)
            derived_bytes += fields.nbytes + mask_fields(rows).nbytes
    held = (sets.device_arrays()["eligibility_words"],
            dense_eligibility_masks(vocab_size, index.dense_levels, table, sets,
                                    stored_levels=levels))  # fmt: skip
    start = time.perf_counter()
    masks = dense_eligibility_masks(
        vocab_size, index.dense_levels, table, refreshed, held, stored_levels=levels
    )
    masks_s = time.perf_counter() - start
    refresh_s = replace_s + masks_s

    layout = index.layout
    states = rng.integers(layout.dense_head_states, layout.state_space, QUERIES)
    start = time.perf_counter()
    lo, hi = index.member_ranges(states)
    ranges_s = time.perf_counter() - start  # includes the one-time dense table
    start = time.perf_counter()
    lo, hi = index.member_ranges(states)
    ranges_warm_s = time.perf_counter() - start
    start = time.perf_counter()
    refreshed.count(np.zeros(QUERIES, np.int64), lo, hi)
    count_s = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        "n": n,
        "num_members": index.num_members,
        "dense_levels": index.dense_levels,
        "build_s": round(build_s, 3),
        "catalogue_s": round(catalogue_s, 3),
        "catalogue_mb": round(catalogue.nbytes / 1e6, 2),
        "sets_build_3_s": round(sets_build_s, 3),
        "replace_s": round(replace_s, 4),
        "replace_max_s": round(max(times), 4),
        "build_over_replace": round(build_s / replace_s, 1),
        "dense_masks_s": round(masks_s, 4),
        "refresh_s": round(refresh_s, 4),
        "build_over_refresh": round(build_s / refresh_s, 1),
        "bits_per_member_per_set": round(refreshed.bits_per_member, 4),
        "layer_bits_per_member_per_set": round(
            8 * (refreshed.nbytes + masks.nbytes) / (refreshed.num_sets * index.num_members), 4
        ),
        "sets_mb": round(refreshed.nbytes / 1e6, 3),
        "index_mb": round(index.nbytes / 1e6, 2),
        "eligibility_windows": "/".join(map(str, windows)),
        "member_range_bytes": index.member_range_nbytes,
        "derived_field_bytes": derived_bytes,  # per index (not per set), derived depths only
        "member_range_share": f"{(index.member_range_nbytes + derived_bytes) / index.nbytes:.2e}",
        "member_ranges_64k_s": round(ranges_warm_s, 4),
        "member_ranges_first_s": round(ranges_s, 4),
        "count_64k_s": round(count_s, 4),
        "peak_rss_gb": round(peak / 1e9, 3),
    }


def main(argv=None) -> None:
    index_size_sweep(
        "benchmarks.eligibility_refresh",
        __doc__,
        _measure,
        _format,
        (1e5, 1e6, 1e7, 2e7),
        "eligibility_refresh.csv",
        argv,
    )


def _format(row: dict) -> str:
    return (
        f"N={row['n']:>10,}  build {row['build_s']:6.2f} s  replace {row['replace_s']:.3f} s "
        f"+ dense masks {row['dense_masks_s']:.3f} s = refresh {row['refresh_s']:.3f} s "
        f"(x{row['build_over_refresh']:.0f} faster)  {row['bits_per_member_per_set']:.3f} "
        f"bits/member/set ({row['layer_bits_per_member_per_set']:.3f} with stored dense "
        f"masks; windows {row['eligibility_windows']})  member-range table "
        f"{row['member_range_bytes']:,} B + derived-row fields {row['derived_field_bytes']:,} B "
        f"({row['member_range_share']} of {row['index_mb']:.0f} MB)  catalogue "
        f"{row['catalogue_mb']:.0f} MB host  ranges(64k) {row['member_ranges_64k_s']:.3f} s  "
        f"count(64k) {row['count_64k_s']:.4f} s  peak {row['peak_rss_gb']:.2f} GB"
    )


if __name__ == "__main__":
    main()
