"""Atomic publishing of versions and index-only refreshes."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
import weakref

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import make_index
from conftest import make_model

from static_keras.export import list_versions
from static_keras.export import publish
from static_keras.export import read_metadata
from static_keras.export import replace_index
from static_keras.export.leftovers import temporary_prefix
from static_keras.serving.warmup import write_warmup_requests


def _checkpoint(path):
    reader = tf.train.load_checkpoint(os.path.join(path, "variables", "variables"))
    return {
        key: reader.get_tensor(key)
        for key in reader.get_variable_to_shape_map()
        if key.endswith("VARIABLE_VALUE")
    }


@pytest.mark.slow  # four publishes, 28 s: the keep and failure tests publish by default
def test_versions_are_numbered_kept_and_never_overwritten(small_model, tmp_path):
    _, model = small_model
    base = tmp_path / "recs"
    published = [publish(model, base, keep=2).version for _ in range(3)]
    assert published == [1, 2, 3]
    assert list_versions(base) == [2, 3]
    # No temporary directories left; the record of which versions load.
    assert sorted(os.listdir(base)) == [
        ".static_keras.lock",
        ".static_keras_versions.json",
        "2",
        "3",
    ]
    with pytest.raises(ValueError, match="already exists"):
        publish(model, base, version=3)
    assert publish(model, base, version=10, keep=None).version == 10
    assert list_versions(base) == [2, 3, 10]


def test_failed_export_publishes_nothing(small_model, tmp_path):
    _, model = small_model
    inputs = keras.Input((3,), name="x")
    broken = keras.Model(inputs, keras.layers.Dense(2)(inputs))  # no named outputs
    base = tmp_path / "recs"
    with pytest.raises(ValueError, match="dict of named outputs"):
        publish(broken, base)
    assert os.listdir(base) == []
    info = publish(model, base, xla=True, warmup_batch_sizes=(1,))
    assert info.version == 1 and read_metadata(info.path)["xla"] is True


def test_a_handed_over_model_is_freed_before_the_check_load(tmp_path, monkeypatch):
    """`publish(HandedOver(model))`, as `static-keras publish` calls it: the
    model (and the index its weights share) is gone when the export is
    loaded to check it, and the version is the one a plain publish writes."""
    from static_keras.export import HandedOver
    from static_keras.export import version_checks

    index = make_index(4)
    checksum = index.checksum

    def handed_over():  # no reference to the model outlives this call
        model = make_model(index)
        return HandedOver(model), weakref.ref(model)

    model, alive = handed_over()
    model_at_check = []
    load_error = version_checks.load_error

    def checked(*args):
        model_at_check.append(alive())
        return load_error(*args)

    monkeypatch.setattr(version_checks, "load_error", checked)
    info = publish(model, tmp_path / "recs", warmup_batch_sizes=(1,))
    assert model_at_check == [None]
    assert read_metadata(info.path)["indexes"][0]["checksum"] == checksum
    with pytest.raises(ValueError, match="already exported and dropped"):
        publish(model, tmp_path / "recs")
    assert list_versions(tmp_path / "recs") == [1]


def test_index_only_refresh_keeps_decoder_weights(tmp_path):
    old_index, new_index = make_index(4), make_index(5, n=250)
    old_model = make_model(old_index)
    decoder = old_model.layers[1].decoder
    new_model = replace_index(old_model, new_index)
    assert new_model.layers[1].decoder is decoder
    base = tmp_path / "recs"
    first = publish(old_model, base)
    second = publish(new_model, base)
    assert (first.version, second.version) == (1, 2)
    old_meta, new_meta = read_metadata(first.path), read_metadata(second.path)
    assert old_meta["indexes"][0]["checksum"] == old_index.checksum
    assert new_meta["indexes"][0]["checksum"] == new_index.checksum
    old_vars, new_vars = _checkpoint(first.path), _checkpoint(second.path)

    # Whole values (dtype, shape, bytes): a zero bias and an index array
    # that starts with zeros share their first entries.
    def whole(value):
        value = np.asarray(value)
        return value.dtype.str, value.shape, value.tobytes()

    decoder_values = {whole(v) for v in decoder.weights}
    old_decoder = [k for k, v in old_vars.items() if whole(v) in decoder_values]
    assert len(old_decoder) == len(decoder.weights)
    for key in old_decoder:
        np.testing.assert_array_equal(old_vars[key], new_vars[key])


def test_bad_arguments(small_model, tmp_path):
    _, model = small_model
    with pytest.raises(ValueError, match="`version` must be a positive integer"):
        publish(model, tmp_path, version=0)
    with pytest.raises(ValueError, match="`keep` must be"):
        publish(model, tmp_path, keep=0)


def test_replace_index_checks_the_model(small_model):
    _, model = small_model
    with pytest.raises(ValueError, match="vocab_size is 32 in the index and 16 in the model"):
        replace_index(model, make_index(6, vocab=32))


def _rejected_copy(base, good, version, how):
    """A copy of version `good` that a server rejects, renamed in as `version`."""
    staging = base / f"staging-{version}"
    shutil.copytree(base / str(good), staging)
    data = next((staging / "variables").glob("variables.data-*"))
    if how == "truncated":
        data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    elif how == "flipped":
        raw = bytearray(data.read_bytes())
        for i in range(0, len(raw), 97):
            raw[i] ^= 0xFF
        data.write_bytes(bytes(raw))
    else:  # a warmup request the model cannot run
        write_warmup_requests(
            str(staging / "assets.extra" / "tf_serving_warmup_requests"),
            model_name="recs", signature_name="serving_default",
            examples={"history": np.zeros((1, 5), "float32")}, batch_sizes=[1],
        )  # fmt: skip
    os.rename(staging, base / str(version))


def test_keep_never_removes_the_newest_good_version(small_model, tmp_path):
    _, model = small_model
    base = tmp_path / "recs"
    for _ in range(3):
        publish(model, base, keep=None, warmup_batch_sizes=(1,))
    for version, how in ((4, "truncated"), (5, "warmup"), (6, "flipped")):
        _rejected_copy(base, 3, version, how)
    # The case: {1..6} on disk, 3 served, 4-6 rejected; publish 7.
    info = publish(model, base, keep=3, warmup_batch_sizes=(1,))
    assert info.version == 7
    assert info.rejected_versions == info.quarantined_versions == (4, 5, 6)
    assert [os.path.basename(p)[:11] for p in info.quarantined_paths] == [
        "rejected-4-", "rejected-5-", "rejected-6-"
    ]  # fmt: skip
    assert info.removed_versions == (1,)
    assert list_versions(base) == [2, 3, 7]
    # A rejected version between good ones is moved out too.
    _rejected_copy(base, 7, 8, "truncated")
    shutil.copytree(base / "7", base / "9")
    info = publish(model, base, keep=3, warmup_batch_sizes=(1,))
    assert info.version == 10 and info.quarantined_versions == (8,)
    assert info.removed_versions == (2, 3)
    assert list_versions(base) == [7, 9, 10]  # 7 is the third good version


def test_a_version_that_fails_warmup_is_never_published(small_model, tmp_path):
    _, model = small_model
    base = tmp_path / "recs"
    with pytest.raises(ValueError, match="fails to load or warm up.*int32 but float32"):
        publish(model, base, warmup_inputs={"history": np.zeros((1, 5), "float32")})
    assert os.listdir(base) == []


_KILLED_PUBLISH = """
import sys
sys.path.insert(0, {tests!r})
from conftest import make_index, make_model
from static_keras.export import publish
model = make_model(make_index(1))
print("publishing", flush=True)
publish(model, {base!r}, warmup_batch_sizes=tuple(range(1, 200)))
"""


def _kill_mid_publish(base) -> list[str]:
    """Starts a real publish in a child process, kills it mid-export; its leftovers."""
    script = _KILLED_PUBLISH.format(tests=os.path.dirname(__file__), base=str(base))
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)])
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and child.poll() is None:
            if any(name.startswith(".tmp-export-") for name in os.listdir(base)):
                break
            time.sleep(0.01)
        assert child.poll() is None, "the publish ended before it could be killed"
        time.sleep(0.5)  # mid-export
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    killed = sorted(name for name in os.listdir(base) if name.startswith(".tmp-"))
    assert killed and all(f"-{child.pid}@" in name for name in killed)
    return killed


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.mark.parametrize("kill", [pytest.param(True, marks=pytest.mark.slow), False])
def test_leftovers_of_a_killed_publish_are_removed(small_model, tmp_path, kill):
    _, model = small_model
    base = tmp_path / "recs"
    base.mkdir()
    if kill:  # a real publish, killed mid-export
        killed = _kill_mid_publish(base)
    else:  # the same names, left by a process that no longer runs
        host = temporary_prefix("export").split("@")[1]
        killed = [f".tmp-export-{_dead_pid()}@{host}abc", f".tmp-3-{_dead_pid()}@{host}def"]
        for name in killed:
            (base / name).mkdir()
            (base / name / "saved_model.pb").write_bytes(b"x")
    # Leftovers of another host: removed once unchanged for a day; a fresh
    # one stays (its publish may still be running), as does one of a live
    # process here (this one).
    other = socket.gethostname().replace("-", "_") + "x"
    stale, fresh = base / f".tmp-export-1@{other}-abc", base / f".tmp-2-1@{other}-def"
    old_format, live = base / ".tmp-export-k2j4", base / (temporary_prefix("5") + "abc")
    for folder in (stale, fresh, old_format, live):
        folder.mkdir()
        (folder / "saved_model.pb").write_bytes(b"x")
    two_days_ago = time.time() - 2 * 24 * 3600
    for path in (stale, stale / "saved_model.pb", old_format, old_format / "saved_model.pb"):
        os.utime(path, (two_days_ago, two_days_ago))
    info = publish(model, base, warmup_batch_sizes=(1,))
    assert sorted(info.removed_leftovers) == sorted(killed + [stale.name, old_format.name])
    left = sorted(name for name in os.listdir(base) if name.startswith(".tmp-"))
    assert left == sorted([fresh.name, live.name])
    assert list_versions(base) == [info.version]


def test_replace_index_keeps_every_search_setting_and_checks_the_kind():
    from static_keras import ConstrainedBeamSearch
    from static_keras.strings import StringIndex
    from static_keras.strings import TokenVocabulary

    index = make_index(2)
    decoder = make_model(index).layers[-1].decoder
    history = keras.Input((5,), dtype="int32", name="history")
    search = ConstrainedBeamSearch(
        index, decoder, beam_size=4, num_results=3, dense_top_k=2, distinct_items=False,
        outputs="scores_and_item_ids", name="search",
    )  # fmt: skip
    model = keras.Model(history, search(history))
    new = replace_index(model, make_index(3))
    (copy,) = [layer for layer in new.layers if isinstance(layer, ConstrainedBeamSearch)]
    for name in ("beam_size", "num_results", "dense_top_k", "distinct_items", "outputs", "name"):
        assert getattr(copy, name) == getattr(search, name), name
    scores, ids = new.predict(np.zeros((2, 5), "int32"), verbose=0)
    assert scores.shape == ids.shape == (2, 3)
    assert np.isin(ids, make_index(3).lookup_item_ids(make_index(3).sequences())).all()
    vocab = TokenVocabulary.from_token_bytes([bytes([65 + i]) for i in range(16)], special=[15])
    strings = StringIndex.from_strings(["AB", "C"], vocab, eos_token_id=15, max_length=4)
    with pytest.raises(ValueError, match="decodes over a StaticIndex; the new index is a Str"):
        replace_index(model, strings)
    with pytest.raises(ValueError, match="must be a TokenAutomaton"):
        replace_index(model, index.sequences())
