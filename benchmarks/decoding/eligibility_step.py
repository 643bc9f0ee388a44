"""What per-request eligibility costs a whole 8-step decode (TensorFlow).

    python -m benchmarks.decoding.eligibility_step [--sizes 1e5,1e6,1e7,2e7]
        [--rounds 15] [--large-rounds 5] [--modes graph,xla]

Random semantic IDs `[N, 8]` over V = 2048 codes, dense_levels = 2, item
ids a random permutation of 0..N-1 (as `benchmarks/eligibility_refresh.py`).
One `ConstrainedDecoding` layer holds the index and 3 eligibility sets, each
a random 50% of the items. Every configuration decodes the same logits
(`versus_reference._ours`: a fixed random table indexed by a hash of step,
last token and batch row, so the model costs about nothing) two ways:

- plain: `beam_search` without `eligibility`;
- eligible: each batch row a random set id, plus 100 excluded item ids per
  row (random, from the catalogue; `MemberCatalogue.exclusion_members`).

Rounds are interleaved (plain, eligible) in one process, with the
"serving loop" protocol of `versus_reference` (64 MiB written before each
timed call); the table reports both medians and the median over rounds of
the per-round ratio eligible / plain. Before timing, every eligible result
is checked to be in its row's set and not excluded.

Memory columns: bits per member per set (`EligibilitySets.bits_per_member`),
the bytes of the layer's eligibility weights (set bits, rank directory and
the dense-step mask rows, all sets; also per member per set) and
member-range weights (`dense_boundaries`, `dense_member_codes` and, where
rows are derived, their per-code fields), and the host
`StaticIndex.member_range_nbytes`, each against the index `nbytes`.

`--breakdown` also times the set alone (no exclusions) and the exclusions
alone (no set), to see which part costs what.

Each N runs in a fresh subprocess (its peak RSS is its own). Writes
`benchmarks/results/eligibility_step.csv`.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time

from benchmarks.decoding.common import child_main
from benchmarks.decoding.common import machine_line
from benchmarks.decoding.common import size_sweep
from benchmarks.decoding.common import write_csv
from benchmarks.decoding.versus_reference import CONFIGS
from benchmarks.decoding.versus_reference import DENSE
from benchmarks.decoding.versus_reference import LENGTH
from benchmarks.decoding.versus_reference import REPO
from benchmarks.decoding.versus_reference import TABLE_ROWS
from benchmarks.decoding.versus_reference import VOCAB
from benchmarks.decoding.versus_reference import _ours
from benchmarks.strings.protocol import evict

NUM_SETS, EXCLUDED = 3, 100
MODES = {"graph": "TF graph, no XLA", "xla": "TF jit_compile"}
LARGE = 10**6  # sizes above this run `--large-rounds` rounds


def _parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1e5,1e6,1e7,2e7")
    parser.add_argument("--configs", default="2x70 exact,128x20")
    parser.add_argument("--modes", default="graph,xla", help="graph and/or xla")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--large-rounds", type=int, default=5, help=f"rounds when N > {LARGE}")
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="also time the set alone (no exclusions) and the exclusions alone (no set)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results",
                                                      "eligibility_step.csv"))  # fmt: skip
    return parser.parse_args(argv)


def _world(n: int, seed: int):
    """`(index, sets, catalogue, rng)`: the index with item ids and 3 sets."""
    import numpy as np

    from static_keras import StaticIndex
    from static_keras.index.eligibility import EligibilitySets
    from static_keras.index.eligibility import MemberCatalogue

    rng = np.random.default_rng(seed)
    ids = rng.integers(0, VOCAB, size=(n, LENGTH), dtype=np.uint16)
    item_ids = rng.permutation(n)
    index = StaticIndex.build(
        ids, VOCAB, item_ids=item_ids, dense_levels=DENSE, on_duplicate_item="first"
    )
    del ids
    catalogue = MemberCatalogue.from_index(index)
    sets = EligibilitySets.build(
        catalogue,
        {f"set_{s}": item_ids[rng.permutation(n)[: n // 2]] for s in range(NUM_SETS)},
    )
    return index, sets, catalogue, rng


def _requests(sets, catalogue, batch: int, rng):
    """`(set_ids [B], excluded members [B, E], excluded item ids [B, E])`."""
    import numpy as np

    set_ids = rng.integers(0, sets.num_sets, batch).astype(np.int32)
    excluded_ids = catalogue.item_ids[rng.integers(0, catalogue.num_members, (batch, EXCLUDED))]
    return set_ids, catalogue.exclusion_members(excluded_ids), excluded_ids


def _check(sets, catalogue, items, set_ids, excluded_ids, name: str) -> None:
    """Every row has results, each in its row's set and not excluded."""
    if (items < 0).any():
        raise AssertionError(f"{name}: {int((items < 0).sum())} padded results")
    members = catalogue.members(items.reshape(-1)).reshape(items.shape)
    in_set = sets.contains(set_ids[:, None], members)
    hit = (items[:, :, None] == excluded_ids[:, None, :]).any(axis=-1)
    if not in_set.all() or hit.any():
        raise AssertionError(
            f"{name}: {int((~in_set).sum())} ineligible, {int(hit.sum())} excluded"
        )


def _weight_bytes(weights) -> int:
    import numpy as np

    return int(sum(np.prod(w.shape) * 4 for w in weights.values()))  # all int32


def _measure(n: int, args) -> list[dict]:
    os.environ["KERAS_BACKEND"] = "tensorflow"
    import numpy as np

    from static_keras import ConstrainedDecoding
    from static_keras import Eligibility

    start = time.perf_counter()
    index, sets, catalogue, rng = _world(n, args.seed)
    build_s = time.perf_counter() - start
    layer = ConstrainedDecoding(index, eligibility=sets)
    memory = {
        "index_mb": round(index.nbytes / 1e6, 2),
        "bits_per_member_per_set": round(sets.bits_per_member, 4),
        "eligibility_weight_bytes": _weight_bytes(layer.eligibility_weights),
        # with the dense-step mask rows: what the layer holds per member per set
        "layer_bits_per_member_per_set": round(
            8 * _weight_bytes(layer.eligibility_weights) / (NUM_SETS * index.num_members), 3
        ),
        "member_range_weight_bytes": _weight_bytes(layer.member_range_weights),
        "member_range_host_bytes": index.member_range_nbytes,
    }
    memory["member_range_share"] = f"{memory['member_range_weight_bytes'] / index.nbytes:.2e}"
    table = np.random.default_rng(args.seed).normal(size=(TABLE_ROWS, VOCAB)).astype("float32")
    rounds = args.rounds if n <= LARGE else args.large_rounds
    modes = [MODES[m] for m in args.modes.split(",")]
    rows = []
    for name, batch, beam, per_beam in CONFIGS:
        if name not in args.configs.split(","):
            continue
        set_ids, excluded, excluded_ids = _requests(sets, catalogue, batch, rng)
        variants = {"plain": None, "eligible": Eligibility(set_ids, excluded)}
        if args.breakdown:
            variants.update(
                {
                    "set_only": Eligibility(set_ids, None),
                    "excluded_only": Eligibility(None, excluded),
                }
            )
        calls = {
            label: _ours(layer, table, batch, beam, per_beam, "tensorflow", eligibility=request)
            for label, request in variants.items()
        }
        for mode in modes:
            compile_s = {}
            for label in calls:
                begin = time.perf_counter()
                tokens = calls[label][mode]()  # traces and compiles
                compile_s[label] = time.perf_counter() - begin
                if label == "eligible":
                    items = index.lookup_item_ids(tokens.reshape(-1, LENGTH))
                    items = items.reshape(tokens.shape[:2])
                    _check(sets, catalogue, items, set_ids, excluded_ids, f"N={n} {name} {mode}")
            times = {label: [] for label in calls}
            for _ in range(rounds):
                for label in calls:
                    evict()
                    begin = time.perf_counter()
                    calls[label][mode]()
                    times[label].append(time.perf_counter() - begin)

            def ratio(label):
                return round(statistics.median(
                    [e / p for e, p in zip(times[label], times["plain"])]), 3)  # fmt: skip

            rows.append({
                "n": n, "num_members": index.num_members, "config": name, "mode": mode,
                "plain_ms": round(statistics.median(times["plain"]) * 1e3, 2),
                "eligible_ms": round(statistics.median(times["eligible"]) * 1e3, 2),
                "ratio_median": ratio("eligible"),
                "first_call_plain_s": round(compile_s["plain"], 2),
                "first_call_eligible_s": round(compile_s["eligible"], 2),
                "rounds": rounds, **memory, "build_s": round(build_s, 1),
                "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, 2),
                "load_average": round(os.getloadavg()[0], 2),
            })  # fmt: skip
            for label in ("set_only", "excluded_only"):
                if label in times:
                    rows[-1][f"{label}_ms"] = round(statistics.median(times[label]) * 1e3, 2)
                    rows[-1][f"{label}_ratio"] = ratio(label)
    return rows


def _format(row: dict) -> str:
    parts = "".join(
        f"  {label} {row[label + '_ratio']:.2f}"
        for label in ("set_only", "excluded_only")
        if label + "_ratio" in row
    )
    return (
        f"N={row['n']:>10,} {row['config']:<11} {row['mode']:<17} plain {row['plain_ms']:8.2f} ms"
        f"  eligible {row['eligible_ms']:8.2f} ms  ratio {row['ratio_median']:.2f}"
        f"  bits/member/set {row['bits_per_member_per_set']:.3f}"
        f"  ranges +{row['member_range_weight_bytes']:,} B ({row['member_range_share']} of index)"
        + parts
    )


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if child_main(lambda config: _measure(config["n"], argparse.Namespace(**config)), argv):
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    args = _parse(argv)
    sizes = args.sizes.split(",")
    rows = size_sweep("benchmarks.decoding.eligibility_step", sizes, vars(args), _format)
    write_csv(args.out, rows)
    print(machine_line())
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
