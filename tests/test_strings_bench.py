"""The string-set benchmark harness runs end to end (no peers, tiny sizes).

A smoke test of the measuring code, not of speed: it checks the tables hold
every protocol and batch size, with the floor beside ours.
"""

import csv

import pytest

pytest.importorskip("tokenizers", reason="the vocabulary is a trained tokenizer.json")
from string_oracles import byte_level_tokenizer_json

from benchmarks.strings import protocol
from benchmarks.strings import run as strings_run


def test_mask_benchmark_reports_every_protocol_against_the_floor(tmp_path):
    vocab = tmp_path / "tokenizer.json"
    vocab.write_text(byte_level_tokenizer_json())
    out = tmp_path / "results"
    strings_run.main(
        [
            "--vocab", str(vocab),
            "--ks", "40",
            "--mask-ks", "40",
            "--real-sets", "",
            "--peers", "",
            "--batch", "16",
            "--batches", "3",
            "--repeats", "1",
            "--out-dir", str(out),
            "--cache-dir", str(tmp_path / "cache"),
        ]
    )  # fmt: skip
    with open(out / "strings_mask.csv") as file:
        rows = list(csv.DictReader(file))
    seen = {(r["protocol"], int(r["batch"]), r["engine"]) for r in rows}
    for name in protocol.PROTOCOLS:
        for batch in (1, 16):
            assert (name, batch, "floor (write the rows)") in seen
            assert (name, batch, "static-keras") in seen
    ours = [r for r in rows if r["engine"] == "static-keras"]
    assert all(float(r["per_row_us_median"]) > 0 and float(r["vs_floor"]) > 0 for r in ours)
    with open(out / "strings_compile.csv") as file:
        (compiled,) = list(csv.DictReader(file))
    assert compiled["engine"] == "static-keras" and compiled["status"] == "ok"


def test_time_batches_rejects_an_unknown_protocol():
    with pytest.raises(ValueError, match="unknown protocol"):
        protocol.time_batches(lambda b: None, 1, "kindest")
