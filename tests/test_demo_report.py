"""The demo's report and plots, from fixed numbers (the demo itself: test_demo.py)."""

import os

import pytest

from static_keras.demo.generative_retrieval import _interleaved_times
from static_keras.demo.report import write_report


def _results() -> dict:
    rows = [
        dict(name="unconstrained", valid=0.996, eligible=0.165, recall_at_10=0.12,
             recall_at_10_fresh_targets=0.10, ms_per_step=22.6, ms_per_step_p25=21.0,
             ms_per_step_p75=25.1),
        dict(name="constrained: catalogue", valid=1.0, eligible=0.17, recall_at_10=0.125,
             recall_at_10_fresh_targets=0.11, ms_per_step=28.3, ms_per_step_p25=27.0,
             ms_per_step_p75=30.1),
        dict(name="constrained: fresh < 60 d", valid=1.0, eligible=1.0, recall_at_10=0.059,
             recall_at_10_fresh_targets=0.448, ms_per_step=29.0, ms_per_step_p25=28.0,
             ms_per_step_p75=31.0),
    ]  # fmt: skip
    cold = dict(items=2000, users=2048, unconstrained_recall_at_1=0.0, constrained_recall_at_1=0.02)
    return dict(
        num_items=50_000, length=4, vocab_size=128, index_bytes=1_000, build_ms=9.0,
        decoder_parameters=200_000, train_seconds=30.0, epochs=4, test_users=512, beam_size=20,
        timed_users=128, timing_rounds=9, decoding=rows, cold_start=cold,
    )  # fmt: skip


def test_report_names_the_spread_and_the_setup(tmp_path):
    files = write_report(str(tmp_path), _results())
    assert files == ["report.md", "validity.png", "recall.png", "latency.png"]
    for name in files:
        assert os.path.getsize(tmp_path / name) > 0
    report = (tmp_path / "report.md").read_text()
    row = "| constrained: fresh < 60 d | 100.0% | 100.0% | 5.9% | 44.8% | 29.00 (28.00-31.00) |"
    assert row in report
    assert "128 users x beam 20, 9 rounds that each time the three decodings in turn" in report


def test_all_zero_panels_still_plot(tmp_path):
    results = _results()
    for row in results["decoding"]:
        row.update(valid=1.0, eligible=1.0)
    write_report(str(tmp_path), results)
    assert os.path.getsize(tmp_path / "validity.png") > 0


class _Model:
    def __init__(self, name, calls):
        self.name, self.calls = name, calls

    def predict_on_batch(self, inputs):
        self.calls.append(self.name)


@pytest.mark.parametrize("rounds", [1, 3, 4])
def test_decodings_are_timed_interleaved(rounds):
    calls = []
    models = [_Model(name, calls) for name in "abc"]
    times = _interleaved_times(models, None, rounds=rounds)
    assert [len(t) for t in times] == [rounds] * 3
    warmup, timed = calls[:3], calls[3:]
    assert warmup == ["a", "b", "c"]
    expected = ["a", "b", "c", "b", "c", "a", "c", "a", "b", "a", "b", "c"]
    assert timed == expected[: 3 * rounds]


def test_validity_panels_share_one_labelled_scale(tmp_path, monkeypatch):
    """A 0.4% bar beside an 83.5% one: both panels on one y scale, each
    with its y label, so a small share looks small."""
    from static_keras.demo import report

    figures = {}
    real_save = report._save

    def keep(figure, out_dir, filename):
        figures[filename] = [
            (axis.get_ylabel(), axis.get_ylim(), axis.yaxis.get_tick_params()["labelleft"])
            for axis in figure.axes
        ]
        return real_save(figure, out_dir, filename)

    monkeypatch.setattr(report, "_save", keep)
    write_report(str(tmp_path), _results())
    (left, right) = figures["validity.png"]
    assert left[0] == right[0] == "% of returned results"
    assert left[1] == right[1] and left[1][1] >= 83.5  # one scale, up to the tallest bar
    assert left[2] and right[2]
