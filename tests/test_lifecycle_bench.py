"""The production-lifecycle benchmark runs end to end (correctness, no timing).

`benchmarks/lifecycle.py` at a small N in a subprocess: every stage is in
the CSV, the swaps under load lose no request, answer only from the old or
the new version, never return an item the answering version may not return,
and a catalogue change (the delta published into the served graph, and
the full publish) keeps the eligibility sets. Its data helpers are
checked directly (fast).
"""

import csv
import os
import subprocess
import sys

import numpy as np
import pytest

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from benchmarks import lifecycle  # noqa: E402

STAGES = {
    "data", "index_build", "eligibility_build", "model_build", "publish_v1", "cc_load",
    "server_start", "predict_default_b1", "predict_default_b32", "predict_eligible_b1",
    "predict_eligible_b32", "eligible_cost_b1", "eligible_cost_b32", "server_rss_one_version",
    "rules_change", "rules_change.replace", "rules_change.job_import",
    "rules_change.refresh_eligibility", "rules_change.job", "rules_change.server_load",
    "rules_change.pickup", "rules_change.server_rss_after",
    "catalogue_change", "catalogue_change.job_import", "catalogue_change.read_served_sets",
    "catalogue_change.index_build", "catalogue_change.carry_sets", "catalogue_change.replace_index",
    "catalogue_change.publish", "catalogue_change.job", "catalogue_change.server_load",
    "catalogue_change.pickup", "catalogue_change.eligibility_kept",
    "catalogue_change.server_rss_after",
    "catalogue_delta", "catalogue_delta.job_import", "catalogue_delta.update_catalogue",
    "catalogue_delta.job", "catalogue_delta.server_load", "catalogue_delta.pickup",
    "catalogue_delta.eligibility_kept", "catalogue_delta.server_rss_after",
    "catalogue_add_1000", "catalogue_add_1000.update_catalogue",
    "catalogue_add_1000.eligibility_kept",
}  # fmt: skip
SWAPS = ("rules_change", "catalogue_delta", "catalogue_add_1000", "catalogue_change")


def test_distinct_ids_are_distinct_and_avoid_taken_rows():
    ids, keys = lifecycle.distinct_ids(5000, seed=3)
    assert ids.shape == (5000, lifecycle.LENGTH) and ids.max() < lifecycle.VOCAB
    assert len(np.unique(ids, axis=0)) == 5000
    assert len(np.unique(keys)) == 5000
    # The leading rows do not depend on N (chunked draws, as the other benchmarks).
    np.testing.assert_array_equal(lifecycle.distinct_ids(100, seed=3)[0], ids[:100])
    new, new_keys = lifecycle.distinct_ids(300, seed=4, taken=np.sort(keys))
    assert not np.isin(new_keys, keys).any()
    rows = {tuple(row) for row in ids.tolist()}
    assert not any(tuple(row) in rows for row in new.tolist())


def test_distinct_ids_avoid_every_array_of_taken_keys():
    _, keys = lifecycle.distinct_ids(4000, seed=5)
    first, second = np.sort(keys[:2000]), np.sort(keys[2000:])
    # Seed 5's rows again: every one is taken by one array or the other.
    again, again_keys = lifecycle.distinct_ids(4000, seed=5, taken=(first, second))
    assert not np.isin(again_keys, keys).any()
    assert len(np.unique(again_keys)) == 4000
    assert (lifecycle.row_keys(again, lifecycle.VOCAB) == again_keys).all()


def test_id_set_is_the_base_less_the_removed_plus_the_added():
    rng = np.random.default_rng(2)
    base = np.sort(rng.choice(10_000, 3000, replace=False)).astype(np.int64)
    removed = rng.choice(base, 400, replace=False)
    added = 20_000 + rng.choice(1000, 200, replace=False)
    ids = lifecycle.IdSet(base, removed=removed, added=added)
    expected = np.union1d(np.setdiff1d(base, removed), added)  # the oracle
    values = np.concatenate([rng.integers(-5, 21_100, 5000), base[:50], added[:50]])
    np.testing.assert_array_equal(ids.contains(values), np.isin(values, expected))
    np.testing.assert_array_equal(lifecycle.member(ids, values), np.isin(values, expected))
    # A delta on a delta folds into one set, an added id removed again included.
    later = lifecycle.IdSet(ids, removed=np.concatenate([added[:10], expected[:5]]),
                            added=[30_001, 30_003])  # fmt: skip
    expected = np.union1d(np.setdiff1d(expected, np.concatenate([added[:10], expected[:5]])),
                          [30_001, 30_003])  # fmt: skip
    values = np.concatenate([values, [30_001, 30_002, 30_003]])
    np.testing.assert_array_equal(later.contains(values), np.isin(values, expected))
    assert later.base is base


def test_rows_replaced_drops_the_gone_rows_and_appends_the_new(tmp_path):
    rng = np.random.default_rng(4)
    rows = rng.integers(0, 50, (10_000, 3)).astype(np.uint16)
    np.save(tmp_path / "rows.npy", rows)
    mapped = np.load(tmp_path / "rows.npy", mmap_mode="r")
    gone = np.sort(rng.choice(10_000, 700, replace=False))
    new = rng.integers(0, 50, (700, 3)).astype(np.uint16)
    expected = np.concatenate([np.delete(rows, gone, axis=0), new])
    for step in (333, 4096, 1 << 22):  # many slices, and one
        np.testing.assert_array_equal(lifecycle._rows_replaced(mapped, gone, new, step), expected)
    ids = np.arange(10_000, dtype=np.int64) * 3
    np.testing.assert_array_equal(
        lifecycle._rows_replaced(ids, gone[:0], ids[:2]), np.concatenate([ids, ids[:2]])
    )


def test_row_keys_distinguish_rows_that_fit_in_64_bits():
    ids = np.array([[1, 2, 3], [1, 2, 4], [1, 2, 3]], np.uint16)
    keys = lifecycle.row_keys(ids, 16)  # 3 x 4 bits: the key is the whole row
    assert keys[0] == keys[2] != keys[1]


def test_wrong_items_counts_what_the_version_may_not_return():
    rng = np.random.default_rng(0)
    catalogue = np.arange(100, 200, dtype=np.int64)
    in_stock = catalogue[::2]
    requests = lifecycle.Requests(rng, in_stock)
    requests.allowed[7] = (catalogue, in_stock)
    excluded = requests.excluded[0, 0]
    answer = np.array([[in_stock[1] if in_stock[1] != excluded else in_stock[2], 101, 999,
                        excluded, -1]])  # fmt: skip
    assert requests.wrong_items(7, "serving_default", answer) == 1  # 999: not in the catalogue
    # 101 is out of stock, 999 unknown, `excluded` excluded; -1 is padding.
    assert requests.wrong_items(7, "serving_eligible", answer) == 3
    assert requests.wrong_items(8, "serving_default", answer) == 0  # unknown version: not checked


def test_sizes_parse_commas_and_exponents():
    assert lifecycle.parse_sizes(["1e5,1e6", "2e7"]) == [100_000, 1_000_000, 20_000_000]


@pytest.mark.slow  # about two minutes: a server, four jobs, three publishes
def test_lifecycle_benchmark_runs_clean(tmp_path):
    out = tmp_path / "lifecycle.csv"
    command = [sys.executable, os.path.join(_REPO, "benchmarks", "lifecycle.py"),
               "--sizes", "1e5", "--no-cc", "--requests", "5", "--csv", str(out),
               "--workdir", str(tmp_path)]  # fmt: skip
    env = dict(os.environ, KERAS_BACKEND="tensorflow")
    result = subprocess.run(command, capture_output=True, text=True, cwd=_REPO, env=env,
                            timeout=900)  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    with open(out, newline="") as file:
        rows = {row["stage"]: row for row in csv.DictReader(file)}
    assert STAGES <= set(rows), sorted(STAGES - set(rows))
    failed = {stage: row["notes"] for stage, row in rows.items() if row["status"] == "FAIL"}
    assert failed == {}
    for stage in SWAPS:
        row = rows[stage]
        assert int(row["requests"]) > 0, row
        assert int(row["failed"]) == 0, row["notes"]
        assert int(row["unexpected_versions"]) == 0, row["notes"]
        assert int(row["wrong_items"]) == 0, row["notes"]
        assert float(row["seconds"]) > 0  # the new version answered
        assert float(rows[f"{stage}.server_rss_after"]["peak_rss_mib"]) > 0
    assert rows["catalogue_change.eligibility_kept"]["status"] == "ok"
    assert rows["catalogue_delta.eligibility_kept"]["status"] == "ok"
    # The rules and delta jobs run without TensorFlow (importing it costs seconds).
    for job in ("rules_change.job", "catalogue_delta.job", "catalogue_add_1000.job"):
        assert "TensorFlow not imported" in rows[job]["notes"], job
    for stage in ("predict_default_b1", "predict_eligible_b32"):
        assert float(rows[stage]["p90_ms"]) >= float(rows[stage]["p50_ms"]) > 0
    for batch in (1, 32):  # interleaved: one ratio per batch size, from the two p50s
        ratio = float(rows[f"eligible_cost_b{batch}"]["ratio"])
        p50s = [
            float(rows[f"predict_{kind}_b{batch}"]["p50_ms"]) for kind in ("eligible", "default")
        ]
        assert ratio == pytest.approx(p50s[0] / p50s[1], rel=0.02)
    assert rows["cc_load"]["status"] == "skipped"


def test_the_paper_range_table_reads_stages_the_lifecycle_writes():
    from benchmarks import paper_range

    class Names:
        def __init__(self):
            self.names = set()

        def add(self, stage, **row):
            self.names.add(stage)

    cc = Names()  # the C++ runner's rows, named as the lifecycle names them
    for batch in (1, 32):
        lifecycle._eligible_cost(cc, "C++ Session::Run", batch, [1.0], [1.1])
    read = {stage for stage, _ in paper_range.LIFECYCLE.values()}
    assert read <= STAGES | cc.names, read - STAGES - cc.names
