"""The benchmark suite's quick mode runs end to end (no timing assertions)."""

import csv
import math
import os
import sys

import keras
import pytest

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

pytestmark = [
    pytest.mark.skipif(
        keras.config.backend() != "tensorflow", reason="the benchmarks run on TensorFlow"
    ),
    pytest.mark.slow,  # the quick benchmark suite takes about a minute: CI's slow step
]

DECODE_COLUMNS = {
    "sweep", "device", "n", "vocab_size", "length", "dense_levels", "batch_size", "beam_size",
    "rows", "method", "xla", "measured", "repeats", "compile_s", "run_ms_median", "run_ms_p90",
    "step_ms_median", "overhead_ms_step_median", "overhead_ms_step_p10", "overhead_ms_step_p90",
    "excess_vs_static_ms_step", "step_ratio_vs_static", "overhead_ratio_vs_static",
    "host_ms_step", "valid_frac", "recall_vs_exact", "exact_match", "query_fp_rate", "build_s",
    "structure_mb", "step_widths", "note",
}  # fmt: skip
EXACT = {"static", "cpu_trie", "ppv_exact"}


def _read(path):
    with open(path, newline="") as file:
        reader = csv.DictReader(file)
        return reader.fieldnames, list(reader)


@pytest.fixture(scope="module")
def quick_results(tmp_path_factory):
    from benchmarks import run_all

    results = tmp_path_factory.mktemp("bench")
    skip = [] if _has_matplotlib() else ["plots"]
    assert run_all.main(["--quick", "--results-dir", str(results), "--skip", *skip] if skip
                        else ["--quick", "--results-dir", str(results)]) == 0  # fmt: skip
    return results


def _has_matplotlib():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.parametrize("sweep", ["n", "vocab", "rows"])
def test_decode_sweeps_write_every_column_and_method(quick_results, sweep):
    columns, rows = _read(quick_results / f"decoding_{sweep}.csv")
    assert set(columns) == DECODE_COLUMNS
    methods = {(row["method"], row["xla"]) for row in rows}
    for method in ("unconstrained", "static", "cpu_trie", "ppv_exact", "ppv_approx", "hash_bitmap"):
        assert (method, "False") in methods
    assert ("static", "True") in methods
    for row in rows:
        for column in ("step_ms_median", "overhead_ms_step_median", "overhead_ms_step_p90"):
            assert math.isfinite(float(row[column]))
        assert int(row["repeats"]) >= 1
        if row["method"] in EXACT:  # correctness, not timing
            assert row["exact_match"] == "True" and float(row["valid_frac"]) == 1.0
        if row["method"] == "hash_bitmap":
            assert 0 <= float(row["query_fp_rate"]) < 1
        if row["method"] == "unconstrained":
            assert float(row["overhead_ms_step_median"]) == 0.0


def test_build_kernel_and_goal_tables(quick_results):
    columns, rows = _read(quick_results / "decoding_build.csv")
    assert {"n", "structure", "build_s", "peak_rss_gb", "structure_gb", "paper_model_gb"} <= set(
        columns
    )
    assert {row["structure"] for row in rows} == {"static", "ppv", "hash_bitmap", "cpu_trie"}
    columns, rows = _read(quick_results / "decoding_kernel.csv")
    assert {"kind", "b_t", "xla", "us_median", "us_p90"} <= set(columns)
    assert {row["kind"] for row in rows} == {
        "vntk",
        "dense_step",
        "unconstrained_topk",
        "masked_topk",
    }
    columns, rows = _read(quick_results / "decoding_goals.csv")
    assert {"goal", "mode", "met", "detail"} <= set(columns)
    assert {row["goal"] for row in rows} == {"1", "2", "3"}


def test_plots_are_written(quick_results):
    if not _has_matplotlib():
        pytest.skip("matplotlib is not installed (the bench extra)")
    for name in ("n", "vocab", "rows", "kernel", "build"):
        path = quick_results / f"decoding_{name}.png"
        assert path.stat().st_size > 1000
