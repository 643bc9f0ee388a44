"""The paper's-range driver (`benchmarks/paper_range.py`): its table and plot
from the per-N CSVs, its resume rule, where the reference is left out, and
(slow) a real decode part without the reference. Correctness, no timing."""

import os
import sys

import pytest

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from benchmarks import paper_range  # noqa: E402
from benchmarks.decoding import common  # noqa: E402


def _lifecycle_csv(path, n, build_s, p50, run_failed=False):
    rows = [
        {"n": n, "stage": "index_build", "seconds": build_s, "status": "ok"},
        {"n": n, "stage": "predict_default_b1", "p50_ms": p50, "status": "ok"},
        {"n": n, "stage": "eligible_cost_b1", "ratio": 1.1, "status": "ok"},
    ]
    if run_failed:
        rows.append({"n": n, "stage": "run", "status": "FAIL"})
    common.write_csv(str(path), rows)


def _decode_csv(path, n, graph, floor, reference, note=""):
    rows = [
        {"n": n, "mode": "TF graph, no XLA", "ours_ms": graph, "reference_ms": reference,
         "ratio_median": None if reference is None else graph / reference, "reference_note": note},
        {"n": n, "mode": "floor: TF graph, no XLA", "ours_ms": floor, "reference_ms": reference,
         "reference_note": note},
    ]  # fmt: skip
    common.write_csv(str(path), rows)


def test_the_table_reads_each_n_and_the_plot_is_written(tmp_path):
    _lifecycle_csv(tmp_path / "lifecycle_100000.csv", 100_000, 0.02, 4.5)
    _decode_csv(tmp_path / "decode_100000.csv", 100_000, 10.0, 6.0, 8.0)
    _decode_csv(tmp_path / "decode_100000000.csv", 100_000_000, 12.0, 6.4, None, "too big")
    figure = tmp_path / "img" / "range.png"
    rows = paper_range.report([100_000, 1_000_000, 100_000_000], str(tmp_path), str(figure))
    assert [row["n"] for row in rows] == [100_000, 100_000_000]  # 10^6 never ran
    small, large = rows
    assert small["build_s"] == 0.02 and small["p50_plain_b1_ms"] == 4.5
    assert small["eligible_cost_b1"] == 1.1 and small["publish_s"] is None
    assert small["index_step_graph_ms"] == pytest.approx((10.0 - 6.0) / 8)
    assert small["ratio_graph"] == pytest.approx(10.0 / 8.0)
    assert small["paper_step_ms"] == 0.023 and large["paper_step_ms"] == 0.039
    assert large["reference_ms"] is None and large["reference_note"] == "too big"
    assert "build_s" not in large  # no lifecycle CSV at 10^8
    written = common.read_csv(str(tmp_path / "paper_range.csv"))
    assert [int(row["n"]) for row in written] == [100_000, 100_000_000]
    assert figure.stat().st_size > 10_000
    assert not list(figure.parent.glob("*.part*"))


def test_a_failed_lifecycle_run_is_run_again(tmp_path):
    ok, failed = tmp_path / "ok.csv", tmp_path / "failed.csv"
    _lifecycle_csv(ok, 10, 0.1, 1.0)
    _lifecycle_csv(failed, 10, 0.1, 1.0, run_failed=True)
    assert paper_range.done(str(ok))
    assert not paper_range.done(str(failed))
    assert not paper_range.done(str(tmp_path / "missing.csv"))


def test_the_reference_is_left_out_where_its_build_cannot_fit():
    assert paper_range.reference_fits(20_000_000, total_gb=24)[0]
    fits, why = paper_range.reference_fits(100_000_000, total_gb=24)
    assert not fits and "44 GB" in why and "24 GB" in why


@pytest.mark.slow
def test_the_decode_part_runs_ours_alone_without_a_peer(tmp_path):
    paper_range.run_decode(3000, str(tmp_path), None, rounds=1)
    rows = common.read_csv(str(tmp_path / "decode_3000.csv"))
    modes = {row["mode"] for row in rows}
    assert modes == set(paper_range.DECODE.values())
    assert all(float(row["ours_ms"]) > 0 and not row["reference_ms"] for row in rows)
    assert all(row["reference_note"] == "no --peer given" for row in rows)
    assert os.listdir(tmp_path) == ["decode_3000.csv"]  # the scratch directory is gone
    paper_range.run_decode(3000, str(tmp_path), None, rounds=1)  # resumed: nothing re-run
    assert common.read_csv(str(tmp_path / "decode_3000.csv")) == rows
