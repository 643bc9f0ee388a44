"""A bad version on disk never becomes an outage (issue 28, part 4).

TF Serving's `latest` policy serves nothing when the newest integer version
fails to load, so `publish` moves every rejected version it finds out of the
integer namespace, and the development server serves the newest version that
loads when it starts.
"""

import importlib
import json
import logging
import os
import shutil
import time

import numpy as np
import pytest
from conftest import histories

from static_keras.export import list_versions
from static_keras.export import publish
from static_keras.export.leftovers import remove_leftovers
from static_keras.export.publish import newest_good_version
from static_keras.export.version_checks import VERIFIED_FILENAME
from static_keras.serving import GrpcClient
from static_keras.serving import ServedModel
from static_keras.serving.dev_server import DevServer

WARMUP = {"warmup_batch_sizes": (1,)}


def truncated_copy(base, good: int, version: int) -> None:
    """A copy of version `good` with half its variables, renamed in as `version`."""
    staging = base / f"staging-{version}"
    shutil.copytree(base / str(good), staging)
    data = next((staging / "variables").glob("variables.data-*"))
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    os.rename(staging, base / str(version))


def quarantined(base) -> list[str]:
    return sorted(name for name in os.listdir(base) if name.startswith("rejected-"))


def test_a_restarted_dev_server_serves_the_newest_version_that_loads(small_model, tmp_path, caplog):
    index, model = small_model
    base = tmp_path / "recs"
    publish(model, base, **WARMUP)
    publish(model, base, **WARMUP)
    truncated_copy(base, 2, 3)
    with caplog.at_level(logging.WARNING, logger="static_keras.serving"):
        with DevServer([ServedModel("recs", str(base))], poll_seconds=0.05) as server:
            with GrpcClient(server.grpc_address) as client:
                answer = client.predict("recs", {"history": histories(1)})
                assert answer["model_version"] == 2
                assert index.contains(answer["tokens"].reshape(-1, 4)).all()
                time.sleep(0.5)  # ten polls: version 3 is not loaded again
                status = {s["version"]: s for s in client.model_status("recs")}
    assert status[2]["state"] == "AVAILABLE"
    assert status[3]["state"] == "END" and status[3]["error"]
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert sum("version 3 rejected" in m for m in messages) == 1, messages
    assert any("serving version 2" in m and "[3]" in m for m in messages), messages


def test_publish_moves_rejected_versions_out_of_the_integer_namespace(
    small_model, tmp_path, caplog
):
    _, model = small_model
    base = tmp_path / "recs"
    publish(model, base, **WARMUP)
    publish(model, base, **WARMUP)
    truncated_copy(base, 2, 3)
    # A publish that fails still moves the bad version out first: the base
    # path never keeps a newest version that does not load.
    with caplog.at_level(logging.WARNING, logger="static_keras.export"):
        with pytest.raises(ValueError, match="fails to load or warm up"):
            publish(model, base, warmup_inputs={"history": np.zeros((1, 5), "float32")})
    assert list_versions(base) == [1, 2]
    (moved,) = quarantined(base)
    assert moved.startswith("rejected-3-")
    assert any("version 3" in r.getMessage() and moved in r.getMessage() for r in caplog.records)
    assert remove_leftovers(base, stale_after_seconds=0) == []  # not a leftover
    assert os.path.isdir(base / moved)
    # A version number is never reused: 3 was taken by the rejected copy.
    with pytest.raises(ValueError, match="version 3 was rejected"):
        publish(model, base, version=3, **WARMUP)
    info = publish(model, base, keep=None, **WARMUP)
    assert info.version == 4 and info.quarantined_versions == ()
    # A broken newest version found by a later publish (keep=None included).
    truncated_copy(base, 4, 5)
    info = publish(model, base, keep=None, **WARMUP)
    assert info.version == 6
    assert info.quarantined_versions == info.rejected_versions == (5,)
    (path,) = info.quarantined_paths
    assert os.path.basename(path).startswith("rejected-5-") and os.path.isdir(path)
    assert list_versions(base) == [1, 2, 4, 6]
    with DevServer([ServedModel("recs", str(base))]) as server:
        assert [s[1] for s in server.manager("recs").status(None, None)] == ["AVAILABLE"]


def test_newest_good_version_uses_the_verified_record(small_model, tmp_path):
    _, model = small_model
    base = tmp_path / "recs"
    assert newest_good_version(base) is None
    publish(model, base, keep=None, **WARMUP)
    truncated_copy(base, 1, 2)
    assert newest_good_version(base) == 1
    record = json.loads((base / VERIFIED_FILENAME).read_text())
    assert record["1"]["error"] == "" and record["2"]["error"]
    assert list_versions(base) == [1, 2]  # it only looks
    # The verdicts are cached by size and modification time: version 1 is
    # not loaded again (flipped bytes with the old mtime would fail a load).
    data = next((base / "1" / "variables").glob("variables.data-*"))
    stat = data.stat()
    data.write_bytes(bytes(b ^ 0xFF for b in data.read_bytes()))
    os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert newest_good_version(base) == 1
    os.utime(data)  # a changed file is checked again
    assert newest_good_version(base) is None


def test_refresh_starts_from_the_newest_good_version_and_loads_nothing_new(tmp_path, monkeypatch):
    """A truncated newest version is moved out, not copied; the refresh is
    read back, and the server's load of it is the only one."""
    import keras
    from conftest import CONTEXT_VOCAB
    from conftest import HISTORY
    from conftest import make_index

    from static_keras import CachedTransformerDecoder
    from static_keras import ConstrainedBeamSearch
    from static_keras import ConstrainedDecoding
    from static_keras.export import read_eligibility
    from static_keras.export import refresh_eligibility
    from static_keras.index.eligibility import EligibilitySets
    from static_keras.index.member_catalogue import MemberCatalogue
    from static_keras.serving.servable import load_servable

    checks_module = importlib.import_module("static_keras.export.version_checks")
    index = make_index(2)
    ids = MemberCatalogue.from_index(index).item_ids
    keras.utils.set_random_seed(0)
    decoder = CachedTransformerDecoder(
        index.vocab_size, index.length, context_vocab_size=CONTEXT_VOCAB, hidden_dim=16
    )
    layer = ConstrainedDecoding(
        index, eligibility=EligibilitySets.build(index, {"in_stock": ids[::2]}), name="constraint"
    )
    search = ConstrainedBeamSearch(constraint=layer, decoder=decoder, beam_size=4)
    history = keras.Input((HISTORY,), dtype="int32", name="history")
    model = keras.Model(history, search(history))
    base = tmp_path / "recs"
    publish(model, base, **WARMUP)
    truncated_copy(base, 1, 2)

    loaded = []
    real_load_error = checks_module.load_error
    monkeypatch.setattr(
        checks_module,
        "load_error",
        lambda path, version, xla: loaded.append(version) or real_load_error(path, version, xla),
    )
    info = refresh_eligibility(base, {"in_stock": ids[:7]})
    assert info.source_version == 1 and info.version == 3 and info.quarantined_versions == (2,)
    assert os.path.basename(info.quarantined_paths[0]).startswith("rejected-2-")
    assert list_versions(base) == [1, 3] and [q.split("-")[1] for q in quarantined(base)] == ["2"]
    assert 3 not in loaded  # version 2 was loaded (and rejected); the refresh was read back
    assert read_eligibility(info.path).sizes() == {"in_stock": 7}
    assert newest_good_version(base) == 3  # recorded good without a load
    assert 3 not in loaded
    servable = load_servable(info.path, 3)  # what the server does: it loads and warms up
    out = servable.run(
        "serving_eligible",
        {"history": histories(2), "set_id": np.zeros(2, np.int32),
         "excluded_item_ids": np.full((2, 1), -1, np.int64)},
    )  # fmt: skip
    found = out["item_ids"]
    assert np.isin(found[found >= 0], ids[:7]).all()
