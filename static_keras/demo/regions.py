"""Step 6 of `static-keras demo`: one index and one model for every region.

Each region is an eligibility set of the same layer and each user excludes
its own history (per-request exclusions): every result must lie in the
user's region and none may repeat the history.
"""

from __future__ import annotations

import numpy as np

from static_keras.decoding.constrained_beam_search import ConstrainedBeamSearch
from static_keras.demo.demo_failure import DemoFailure
from static_keras.demo.world import REGIONS
from static_keras.index.eligibility import EligibilitySets
from static_keras.layers.constrained_decoding import ConstrainedDecoding

REGION_USERS = 32  # users decoded per region


def regions_and_histories(
    world, index, catalogue_ids, decoder, beam, histories, history_items, print_fn
) -> list[dict]:
    """Decodes `REGION_USERS` users per region in one batch with one layer:
    each row names its region's eligibility set and excludes its history.
    Returns per region the share of results in the region and the history
    hits, with and without the per-request constraints."""
    in_region = {
        name: (world.regions[catalogue_ids - 1] >> bit) & 1 == 1 for bit, name in enumerate(REGIONS)
    }
    sets = EligibilitySets.build(index, {n: catalogue_ids[m] for n, m in in_region.items()})
    layer = ConstrainedDecoding(index, eligibility=sets)
    search = ConstrainedBeamSearch(constraint=layer, decoder=decoder, beam_size=beam,
                                   num_results=10)  # fmt: skip
    users = np.arange(len(REGIONS) * REGION_USERS)
    set_ids = (users // REGION_USERS).astype(np.int32)  # region r: users r*32 ... r*32+31
    excluded = sets.catalogue.exclusion_members(history_items[users])
    plain = search(histories[users])["item_ids"]
    constrained = search(histories[users], set_ids, excluded)["item_ids"]
    rows = []
    for region, name in enumerate(REGIONS):
        row = dict(region=name, users=REGION_USERS)
        for label, out in (("plain", plain), ("constrained", constrained)):
            items = np.asarray(out)[set_ids == region]
            history = history_items[users[set_ids == region]]
            returned = items >= 0
            eligible = np.isin(items, catalogue_ids[in_region[name]]) & returned
            repeats = (items[:, :, None] == history[:, None, :]).any(-1) & returned
            row[f"{label}_results"] = int(returned.sum())
            row[f"{label}_eligible"] = float(eligible.sum() / max(returned.sum(), 1))
            row[f"{label}_history_hits"] = int(repeats.sum())
        rows.append(row)
    print_fn(f"\nregions and histories: one index, {len(REGIONS)} eligibility sets "
             f"({sets.bits_per_member:.2f} bits per member each), {REGION_USERS} users per "
             f"region, each excluding its {history_items.shape[1]}-item history")  # fmt: skip
    for row in rows:
        without = f"{row['plain_eligible']:.0%}, {row['plain_history_hits']}"
        print_fn(f"  {row['region']:<5} in region {row['constrained_eligible']:.0%}, history "
                 f"hits {row['constrained_history_hits']} (without the per-request "
                 f"constraints: {without})")  # fmt: skip
    for row in rows:
        if (
            row["constrained_eligible"] != 1.0
            or row["constrained_history_hits"]
            or row["constrained_results"] != 10 * REGION_USERS
        ):
            raise DemoFailure(f"region {row['region']}: a result outside the region or a repeat")
    return rows
