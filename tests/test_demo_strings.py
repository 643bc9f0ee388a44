"""`static-keras demo --strings`: its data split, and the invariants of a quick run."""

import os

import numpy as np
import pytest

pytest.importorskip("botocore", reason="the strings demo reads botocore's service models")
pytest.importorskip("tokenizers", reason="the strings demo trains a BPE with `tokenizers`")

from static_keras import cli  # noqa: E402
from static_keras.demo import string_answers  # noqa: E402
from static_keras.demo.string_answers import run_strings_demo  # noqa: E402
from static_keras.demo.tool_questions import first_sentence  # noqa: E402
from static_keras.demo.tool_questions import make_tool_questions  # noqa: E402


def _check_split(data):
    """Disjoint questions, one answer a question, every answer in the constraint set."""
    train_questions = [q for q, _ in data.train]
    held_out_questions = [q for q, _ in data.held_out]
    assert not set(train_questions) & set(held_out_questions)
    assert len(set(train_questions + held_out_questions)) == len(data.train) + len(data.held_out)
    answers = set(data.answers)
    assert len(answers) == len(data.answers)  # distinct: item id = position
    assert {a for _, a in data.held_out} <= answers and {a for _, a in data.train} <= answers


def _recount(row, gold, members, unseen):
    valid = [answer in members for answer in row["answers"]]
    correct = [answer == truth for answer, truth in zip(row["answers"], gold)]
    return dict(
        validity=float(np.mean(valid)),
        accuracy=float(np.mean(correct)),
        accuracy_unseen=float(np.mean([c for c, u in zip(correct, unseen) if u])),
        no_answer=float(np.mean([answer == "" for answer in row["answers"]])),
    )


def _check_run(results):
    data, gold = results["data"], results["gold"]
    _check_split(data)
    assert gold == [answer for _, answer in data.held_out]
    members = set(data.answers)
    trained = {answer for _, answer in data.train}
    unseen = [answer not in trained for answer in gold]
    assert results["unseen_share"] == float(np.mean(unseen))
    assert [(r["beam"], r["constrained"]) for r in results["decoding"]] == [
        (1, False), (1, True), (4, False), (4, True)
    ]  # fmt: skip
    for row in results["decoding"]:
        assert len(row["answers"]) == len(gold)
        recount = _recount(row, gold, members, unseen)
        assert {key: row[key] for key in recount} == recount
        if row["constrained"]:
            # Every answer is a member; a beam that ran out of steps gives none.
            assert all(answer in members for answer in row["answers"] if answer)
            assert row["validity"] == 1.0 - row["no_answer"]


def test_first_sentence_is_plain_text_up_to_the_first_full_stop():
    doc = "<p>Creates a <code>Bucket</code>, e.g. for logs. Then more.</p>"
    assert first_sentence(doc) == "Creates a Bucket , e.g. for logs."
    assert first_sentence("<p>Deletes it &amp; its tags</p>") == "Deletes it & its tags"


def test_split_is_disjoint_and_the_answer_set_holds_every_answer():
    data = make_tool_questions(held_out=500, seed=3)
    _check_split(data)
    assert len(data.held_out) == 500 and len(data.train) > 10_000
    # Some held-out answers never occur in training: only generalising reaches them.
    assert {a for _, a in data.held_out} - {a for _, a in data.train}
    limited = make_tool_questions(held_out=500, train_limit=1_000, seed=3)
    assert limited.held_out == data.held_out and limited.answers == data.answers
    assert len(limited.train) == 1_000


def test_cli_runs_the_strings_demo(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(string_answers, "run_strings_demo", lambda *a, **k: calls.append((a, k)))
    assert cli.main(["demo", "--strings", "--quick", "--out", str(tmp_path)]) == 0
    assert calls == [((str(tmp_path),), dict(quick=True, seed=0))]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("strings_demo")
    return out, run_strings_demo(str(out), quick=True, print_fn=lambda *_: None)


def test_quick_run_answers_are_members_and_the_numbers_recount(quick_run):
    _, results = quick_run
    _check_run(results)


def test_quick_run_report_has_the_table_and_the_plot(quick_run):
    out, results = quick_run
    report = (out / "report.md").read_text()
    for row in results["decoding"]:
        line = f"| {row['name']} | {row['beam']} | {row['validity']:.1%} | {row['accuracy']:.1%} |"
        assert line in report
    assert "![validity and accuracy](accuracy.png)" in report
    assert os.path.getsize(out / "accuracy.png") > 0


@pytest.mark.slow  # about 3 minutes on 2 cores: the run the docs report
def test_full_run(tmp_path):
    results = run_strings_demo(str(tmp_path), print_fn=lambda *_: None)
    _check_run(results)
    assert len(results["gold"]) == 1_000
    for free, constrained in zip(results["decoding"][::2], results["decoding"][1::2]):
        assert constrained["validity"] >= free["validity"]
