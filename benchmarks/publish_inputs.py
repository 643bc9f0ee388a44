"""Inputs of the publish-memory benchmark (`job_memory -- publish ...`) at N.

Writes, under OUT: `recs/1`, a version of the lifecycle's catalogue (8
tokens over 2048, random distinct rows, sparse item ids, headroom 0.1, one
set `in_stock` of a random half) published with `publish`; `model.keras`,
the model that version serves (what the daily catalogue job starts from);
`new_index.npz`, the same catalogue with 1 % of the items replaced (new
rows, new ids), built exact. Then:

    python benchmarks/publish_inputs.py --n 1e8 --out OUT
    python -m benchmarks.job_memory --runs 1 -- publish OUT/model.keras \\
        --index OUT/new_index.npz --model-base-path OUT/recs \\
        --warmup-batch-sizes 1 32 --progress

At 10^8 it takes about 6 minutes and 15 GB: run it alone.
"""

from __future__ import annotations

import argparse
import os
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.lifecycle import CHANGE  # noqa: E402
from benchmarks.lifecycle import MODEL  # noqa: E402
from benchmarks.lifecycle import SET  # noqa: E402
from benchmarks.lifecycle import VOCAB  # noqa: E402
from benchmarks.lifecycle import WARMUP_BATCHES  # noqa: E402
from benchmarks.lifecycle import distinct_ids  # noqa: E402
from benchmarks.lifecycle import served_model  # noqa: E402


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", default="2e7")
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    from static_keras.tensorflow_allocator import return_freed_memory

    return_freed_memory()
    import numpy as np

    from static_keras import StaticIndex
    from static_keras.export import publish
    from static_keras.index.eligibility import EligibilitySets

    n = int(float(args.n))
    os.makedirs(args.out, exist_ok=True)
    rng = np.random.default_rng([args.seed, n])
    rows, keys = distinct_ids(n, args.seed)
    item_ids = 10**9 + 2 * rng.permutation(n).astype(np.int64)
    index = StaticIndex.build(rows, VOCAB, item_ids=item_ids, headroom=0.1)
    in_stock = np.sort(item_ids[rng.permutation(n)[: n // 2]])
    sets = EligibilitySets.build(index, {SET: in_stock})
    model = served_model(index, sets, args.seed)
    v1 = publish(
        model, os.path.join(args.out, MODEL), warmup_batch_sizes=WARMUP_BATCHES, model_name=MODEL
    )
    print(f"published {v1.path} in {v1.seconds:.1f} s", flush=True)
    model.save(os.path.join(args.out, "model.keras"))
    del model, sets, index

    change = max(1, int(CHANGE * n))
    kept = np.setdiff1d(np.arange(n), rng.choice(n, change, replace=False))
    added_rows, _ = distinct_ids(change, args.seed + 2, taken=np.sort(keys[kept]))
    new_rows = np.concatenate([rows[kept], added_rows])
    new_ids = item_ids.max() + 1 + 2 * np.arange(change, dtype=np.int64)
    del rows
    new_index = StaticIndex.build(
        new_rows, VOCAB, item_ids=np.concatenate([item_ids[kept], new_ids])
    )
    new_index.save(os.path.join(args.out, "new_index.npz"))
    print(f"wrote {args.out}/model.keras and new_index.npz", flush=True)


if __name__ == "__main__":
    main()
