"""Per-request eligibility in the SavedModel and eligibility-only refreshes.

- `serving_eligible` answers exactly what the Keras search answers with the
  same set ids and exclusions (item ids mapped to members in the graph),
  `serving_default` is unchanged, bad set ids / dtypes are INVALID_ARGUMENT;
- `refresh_eligibility` writes a new version whose only change is the set
  variables (graph byte-identical, every other tensor value-identical);
- refreshes under load on the development server: no failed request, and
  every answer is eligible under the version that answered it.
"""

from __future__ import annotations

import os
import re
import threading
import time

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import CONTEXT_VOCAB
from conftest import HISTORY
from conftest import histories
from conftest import make_index

from static_keras import CachedTransformerDecoder
from static_keras import ConstrainedBeamSearch
from static_keras import ConstrainedDecoding
from static_keras import Eligibility
from static_keras.export import ELIGIBLE_SIGNATURE
from static_keras.export import export_saved_model
from static_keras.export import publish
from static_keras.export import read_eligibility
from static_keras.export import read_metadata
from static_keras.export import refresh_eligibility
from static_keras.index import dense_eligibility
from static_keras.index.eligibility import EligibilitySets
from static_keras.index.eligibility import MemberCatalogue
from static_keras.kernels import derived_dense_masks
from static_keras.kernels.eligibility_kernels import MAX_DYNAMIC_EXCLUDED
from static_keras.serving import GrpcClient
from static_keras.serving import ServedModel
from static_keras.serving import ServingError
from static_keras.serving.dev_server import DevServer
from static_keras.serving.servable import load_servable
from static_keras.serving.status import ServingFailure

NAMES = ("in_stock", "fr")


def _sets(index, seed: int) -> EligibilitySets:
    ids = MemberCatalogue.from_index(index).item_ids
    rng = np.random.default_rng(seed)
    return EligibilitySets.build(
        index, {name: rng.choice(ids, size=len(ids) // 3, replace=False) for name in NAMES}
    )


@pytest.fixture(scope="module")
def eligible_model():
    index = make_index(1)
    keras.utils.set_random_seed(0)
    decoder = CachedTransformerDecoder(
        index.vocab_size, index.length, context_vocab_size=CONTEXT_VOCAB, hidden_dim=16
    )
    layer = ConstrainedDecoding(index, eligibility=_sets(index, 0), name="constraint")
    search = ConstrainedBeamSearch(constraint=layer, decoder=decoder, beam_size=4)
    history = keras.Input((HISTORY,), dtype="int32", name="history")
    return index, search, keras.Model(history, search(history))


def _request(index, batch: int, seed: int):
    """Histories, set ids (-1 included) and excluded item ids (repeats, ids
    outside the catalogue and -1 padding included)."""
    rng = np.random.default_rng(seed)
    ids = MemberCatalogue.from_index(index).item_ids
    set_ids = rng.integers(-1, len(NAMES), batch).astype(np.int32)
    excluded = rng.choice(ids, (batch, 6)).astype(np.int64)
    excluded[:, 0] = excluded[:, 1]  # a repeat
    excluded[:, 2] = 99_999_999  # not in the catalogue
    excluded[:, -1] = -1
    return histories(batch, seed), set_ids, excluded


def _eligible_ids(sets: EligibilitySets, set_id: int, excluded) -> set:
    ids = sets.catalogue.item_ids
    allowed = np.ones(len(ids), bool) if set_id < 0 else sets.contains(set_id, np.arange(len(ids)))
    return set(ids[allowed].tolist()) - set(np.asarray(excluded).tolist())


def _assert_eligible(item_ids, sets, set_ids, excluded):
    for row, items in enumerate(np.asarray(item_ids)):
        found = set(items[items >= 0].tolist())
        assert found <= _eligible_ids(sets, int(set_ids[row]), excluded[row])


def test_eligible_signature_answers_like_the_keras_search(eligible_model, tmp_path):
    index, search, model = eligible_model
    path = tmp_path / "model"
    export_saved_model(model, path, warmup_batch_sizes=(1, 3))
    metadata = read_metadata(path)
    assert metadata["eligibility_sets"] == list(NAMES)
    assert metadata["eligibility"]["signature"] == ELIGIBLE_SIGNATURE
    loaded = tf.saved_model.load(str(path))
    assert set(loaded.signatures) == {"serving_default", ELIGIBLE_SIGNATURE}
    default_inputs = loaded.signatures["serving_default"].structured_input_signature[1]
    assert set(default_inputs) == {"history"}

    context, set_ids, excluded = _request(index, 8, seed=3)
    members = MemberCatalogue.from_index(index).exclusion_members(excluded)
    expected = search(context, set_ids, members)
    answer = loaded.signatures[ELIGIBLE_SIGNATURE](
        history=tf.constant(context), set_id=tf.constant(set_ids), excluded_item_ids=excluded
    )
    for key in ("tokens", "scores", "item_ids"):
        np.testing.assert_allclose(answer[key].numpy(), np.asarray(expected[key]), rtol=1e-5)
    _assert_eligible(answer["item_ids"].numpy(), read_eligibility(path), set_ids, excluded)
    plain = loaded.signatures["serving_default"](history=tf.constant(context))
    np.testing.assert_array_equal(plain["item_ids"].numpy(), np.asarray(model(context)["item_ids"]))

    # Any exclusion width, and no exclusions at all.
    wide = np.full((8, 40), -1, np.int64)
    wide[:, :6] = excluded
    again = loaded.signatures[ELIGIBLE_SIGNATURE](
        history=tf.constant(context), set_id=tf.constant(set_ids), excluded_item_ids=wide
    )
    np.testing.assert_array_equal(again["item_ids"], answer["item_ids"])
    unrestricted = loaded.signatures[ELIGIBLE_SIGNATURE](
        history=tf.constant(context),
        set_id=tf.fill([8], -1),
        excluded_item_ids=tf.zeros([8, 0], tf.int64),
    )
    np.testing.assert_array_equal(unrestricted["item_ids"], plain["item_ids"])


def test_served_graphs_never_gather_from_a_variable(eligible_model, tmp_path):
    # A gather on a variable (`ResourceGather`) switches it to copy-on-read for
    # the process's life: every later plain read of it (the exclusion table's
    # search, a reshape of the set words) then copies the whole variable on
    # every request. At 2x10^7 items that made `serving_eligible` 2.8x
    # `serving_default` (3.7x through C++ Session::Run), growing with N.
    # Every served gather reads its variable first.
    from tensorflow.core.protobuf import saved_model_pb2

    _, _, model = eligible_model
    path = tmp_path / "model"
    export_saved_model(model, path, warmup_batch_sizes=(1,))
    graph = saved_model_pb2.SavedModel.FromString((path / "saved_model.pb").read_bytes())
    ops = {
        node.op
        for meta_graph in graph.meta_graphs
        for function in meta_graph.graph_def.library.function
        for node in function.node_def
    }
    assert {"ReadVariableOp", "GatherV2"} <= ops
    assert not {op for op in ops if op.startswith("ResourceGather")}


@pytest.mark.slow  # keeps the default run under 15 minutes
def test_xla_eligible_signature_answers_like_the_plain_one(eligible_model, tmp_path):
    index, search, model = eligible_model
    export_saved_model(model, tmp_path / "xla", xla=True, warmup_batch_sizes=(2,))
    servable = load_servable(tmp_path / "xla", 1, xla_enabled=True)  # replays the warmup
    context, set_ids, excluded = _request(index, 5, seed=6)
    inputs = {"history": context, "set_id": set_ids, "excluded_item_ids": excluded}
    members = MemberCatalogue.from_index(index).exclusion_members(excluded)
    expected = search(context, set_ids, members)
    answer = servable.run(ELIGIBLE_SIGNATURE, inputs)
    np.testing.assert_array_equal(answer["item_ids"], np.asarray(expected["item_ids"]))
    with pytest.raises(ServingFailure, match=r"set_id.{1,3}holds ids outside"):
        servable.run(ELIGIBLE_SIGNATURE, {**inputs, "set_id": np.full(5, 9, np.int32)})


@pytest.mark.slow  # keeps the default run under 15 minutes
def test_a_model_with_its_own_eligibility_inputs_keeps_one_signature(eligible_model, tmp_path):
    _, search, _ = eligible_model
    history = keras.Input((HISTORY,), dtype="int32", name="history")
    set_in = keras.Input((), dtype="int32", name="set_ids")
    excluded_in = keras.Input((3,), dtype="int32", name="excluded")
    own = Eligibility(set_in, excluded_in)
    model = keras.Model([history, set_in, excluded_in], search(history, eligibility=own))
    export_saved_model(model, tmp_path / "model", warmup_batch_sizes=(1,))
    assert set(tf.saved_model.load(str(tmp_path / "model")).signatures) == {"serving_default"}
    assert "eligibility_sets" not in read_metadata(tmp_path / "model")


def test_bad_eligibility_inputs_are_invalid_argument(eligible_model, tmp_path):
    _, _, model = eligible_model
    base = tmp_path / "recs"
    publish(model, base, warmup_batch_sizes=(1,))
    servable = load_servable(base / "1", 1)
    context = histories(2)
    good = {"history": context, "set_id": np.array([0, -1], np.int32),
            "excluded_item_ids": np.full((2, 1), -1, np.int64)}  # fmt: skip
    assert servable.run(ELIGIBLE_SIGNATURE, good)["item_ids"].shape == (2, 4)
    # The widest exclusion list a run-time width allows: its last id counts.
    best = servable.run(ELIGIBLE_SIGNATURE, good)["item_ids"][:, 0]
    widest = np.full((2, MAX_DYNAMIC_EXCLUDED), -1, np.int64)
    widest[:, -1] = best
    got = servable.run(ELIGIBLE_SIGNATURE, {**good, "excluded_item_ids": widest})["item_ids"]
    assert not (got == best[:, None]).any()
    for bad, pattern in (
        ({"set_id": np.array([2, 0], np.int32)}, r"set_id.{1,3}holds ids outside \[-1, 2\)"),
        ({"set_id": np.array([-2, 0], np.int32)}, r"set_id.{1,3}holds ids outside \[-1, 2\)"),
        ({"set_id": np.array([0, 0], np.int64)}, r"'set_id'.*int32 but int64"),
        ({"excluded_item_ids": np.full((2, 1), -1, np.int32)}, r"'excluded_item_ids'.*int64"),
        (
            {"excluded_item_ids": np.full((3, 1), -1, np.int64)},
            r"`excluded_item_ids` must have one row per batch row: expected\W+2\W+rows",
        ),
        ({"set_id": np.array([0, 0, 0], np.int32)}, r"`set_id` must have one row per batch row"),
        ({"set_id": np.array([0], np.int32)}, r"`set_id` must have one row per batch row"),
        ({"set_id": np.array([0.7, 1.9], np.float32)}, r"'set_id'.*int32 but float"),
        ({"set_id": np.array(["a", "b"])}, r"'set_id'"),
        (
            {"excluded_item_ids": np.full((2, MAX_DYNAMIC_EXCLUDED + 1), -1, np.int64)},
            rf"excluded_item_ids.{{1,3}}may hold at most {MAX_DYNAMIC_EXCLUDED} ids",
        ),
    ):
        with pytest.raises(ServingFailure, match=pattern) as caught:
            servable.run(ELIGIBLE_SIGNATURE, {**good, **bad})
        assert caught.value.code == "INVALID_ARGUMENT"
    # A history of another length than the model was built for: refused by
    # the graph (TF Serving's Session::Run feeds any shape), in both signatures.
    expected = rf"Input .{{1,2}}history.{{1,2}} must have shape \[batch, {HISTORY}\]"
    for history in (context[:, :3], np.tile(context, (1, 100))):
        for signature, inputs in ((ELIGIBLE_SIGNATURE, good), ("serving_default", {})):
            with pytest.raises(ServingFailure, match=expected) as caught:
                servable.run(signature, {**inputs, "history": history})
            assert caught.value.code == "INVALID_ARGUMENT"
            dims = r"\W+".join(str(d) for d in history.shape)
            assert re.search(rf"received shape\W+{dims}\W", str(caught.value)), caught.value


def test_refresh_changes_only_the_eligibility_variables(eligible_model, tmp_path):
    index, _, model = eligible_model
    base = tmp_path / "recs"
    publish(model, base, warmup_batch_sizes=(1, 2))
    new_sets = _sets(index, 7)
    info = refresh_eligibility(base, new_sets)
    assert (info.version, info.source_version) == (2, 1)
    assert info.sizes == new_sets.sizes()
    old, new = base / "1", base / "2"
    assert read_eligibility(new).sizes() == new_sets.sizes()
    np.testing.assert_array_equal(read_eligibility(new).words, new_sets.words)
    with open(old / "saved_model.pb", "rb") as a, open(new / "saved_model.pb", "rb") as b:
        assert a.read() == b.read()
    old_reader = tf.train.load_checkpoint(str(old / "variables" / "variables"))
    new_reader = tf.train.load_checkpoint(str(new / "variables" / "variables"))
    keys = old_reader.get_variable_to_dtype_map()
    assert set(keys) == set(new_reader.get_variable_to_dtype_map())
    changed = {
        key for key in keys
        if not np.array_equal(old_reader.get_tensor(key), new_reader.get_tensor(key))
    }  # fmt: skip
    assert changed and all(
        "eligibility_words" in k or "eligibility_directory" in k or "eligibility_dense" in k
        for k in changed
    )
    assert read_metadata(new)["eligibility_refresh"]["source_version"] == 1
    # TensorFlow's fingerprint hashes the checkpoint index: the source's
    # would name the source, so the refresh carries none (it is optional).
    assert (old / "fingerprint.pb").exists() and not (new / "fingerprint.pb").exists()
    # The stored dense-step rows derive from the sets: rewritten with them.
    layout = index.layout
    table = dense_eligibility.dense_boundary_table(layout, index.arrays)
    offsets = dense_eligibility.dense_boundary_offsets(layout)
    windows = derived_dense_masks.eligibility_windows(
        layout.vocab_size, layout.dense_levels, layout.num_members, table, offsets
    )
    (dense_key,) = [k for k in keys if "eligibility_dense" in k]
    np.testing.assert_array_equal(
        new_reader.get_tensor(dense_key),
        dense_eligibility.dense_eligibility_masks(
            layout.vocab_size, layout.dense_levels, table, new_sets,
            stored_levels=windows.count(0),
        ),
    )  # fmt: skip

    context, set_ids, excluded = _request(index, 6, seed=4)
    inputs = {"history": context, "set_id": set_ids, "excluded_item_ids": excluded}
    for version, sets in ((1, read_eligibility(old)), (2, new_sets)):
        answer = load_servable(base / str(version), version).run(ELIGIBLE_SIGNATURE, inputs)
        _assert_eligible(answer["item_ids"], sets, set_ids, excluded)

    # A mapping rebuilds the named sets only; unknown names and other
    # catalogues are refused before anything is written.
    ids = MemberCatalogue.from_index(index).item_ids
    info = refresh_eligibility(base, {"fr": ids[:5]}, keep=2)
    refreshed = read_eligibility(info.path)
    assert refreshed.sizes() == {"in_stock": new_sets.sizes()["in_stock"], "fr": 5}
    assert info.removed_versions == (1,)
    with pytest.raises(ValueError, match="No eligibility set 'de'"):
        refresh_eligibility(base, {"de": ids[:5]})
    with pytest.raises(ValueError, match="another catalogue"):
        refresh_eligibility(base, _sets(make_index(2), 0))
    assert sorted(os.listdir(base)) == [
        ".static_keras.lock",
        ".static_keras_versions.json",
        "2",
        "3",
    ]


@pytest.mark.slow  # a publish and a refresh through the CLI: 20 s on 2 cores
def test_refresh_from_the_command_line(eligible_model, tmp_path, capsys):
    from static_keras import cli

    index, _, model = eligible_model
    base = tmp_path / "recs"
    publish(model, base, warmup_batch_sizes=(1,))
    ids = MemberCatalogue.from_index(index).item_ids
    np.save(tmp_path / "fr.npy", ids[:4])
    np.savetxt(tmp_path / "in_stock.csv", ids[2:9], fmt="%d")
    fr, in_stock = f"fr={tmp_path / 'fr.npy'}", f"in_stock={tmp_path / 'in_stock.csv'}"
    command = [
        "refresh-eligibility",
        "--model-base-path",
        str(base),
        "--set",
        fr,
        "--set",
        in_stock,
    ]
    assert cli.main(command) == 0
    assert "published version 2" in capsys.readouterr().out
    assert read_eligibility(base / "2").sizes() == {"in_stock": 7, "fr": 4}
    assert cli.main([*command[:3], "--set", f"de={tmp_path / 'fr.npy'}"]) == 2
    assert "No eligibility set 'de'" in capsys.readouterr().err
    assert cli.main([*command[:3], "--set", "fr"]) == 2
    assert "NAME=FILE" in capsys.readouterr().err
    assert sorted(os.listdir(base)) == [
        ".static_keras.lock",
        ".static_keras_versions.json",
        "1",
        "2",
    ]


def test_refresh_needs_eligibility_sets(small_model, tmp_path):
    _, model = small_model
    base = tmp_path / "recs"
    publish(model, base, warmup_batch_sizes=(1,))
    assert "eligibility_sets" not in read_metadata(base / "1")
    with pytest.raises(ValueError, match="holds no eligibility sets"):
        refresh_eligibility(base, {"in_stock": [1]})
    with pytest.raises(ValueError, match="No versions"):
        refresh_eligibility(tmp_path / "empty", {"in_stock": [1]})


@pytest.mark.slow
def test_served_refreshes_under_load(eligible_model, tmp_path):
    index, _, model = eligible_model
    base = tmp_path / "recs"
    publish(model, base, warmup_batch_sizes=(1, 4))
    sets_by_version = {1: read_eligibility(base / "1")}
    context, set_ids, excluded = _request(index, 4, seed=5)
    set_ids[:] = [0, 1, 0, 1]  # every row restricted
    inputs = {"history": context, "set_id": set_ids, "excluded_item_ids": excluded}
    answers, failures = [], []
    stop = threading.Event()

    def load(client):
        deadline = time.monotonic() + 120
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                answers.append(client.predict("recs", inputs, signature=ELIGIBLE_SIGNATURE))
            except ServingError as error:
                failures.append(str(error))

    with DevServer([ServedModel("recs", str(base))], poll_seconds=0.1) as server:
        with GrpcClient(server.grpc_address, timeout=30) as client:
            worker = threading.Thread(target=load, args=(client,))
            worker.start()
            for version in (2, 3, 4):
                seen = len(answers)
                while len(answers) < seen + 3 and worker.is_alive():
                    time.sleep(0.01)
                sets = _sets(index, 100 + version)
                refresh_eligibility(base, sets, keep=None)
                sets_by_version[version] = sets
                server.wait_for_version("recs", version)
            seen = len(answers)
            while len(answers) < seen + 3 and worker.is_alive():
                time.sleep(0.01)
            stop.set()
            worker.join()
    assert failures == []
    versions = [answer["model_version"] for answer in answers]
    assert versions == sorted(versions) and set(versions) == {1, 2, 3, 4}
    for answer in answers:
        _assert_eligible(answer["item_ids"], sets_by_version[answer["model_version"]],
                         set_ids, excluded)  # fmt: skip


def test_a_refresh_job_imports_neither_tensorflow_nor_keras(eligible_model, tmp_path):
    """The rules job: `static-keras refresh-eligibility` reads the served
    tables, rewrites the set tensors and publishes, NumPy only (importing
    TensorFlow would cost the rules change seconds)."""
    import subprocess
    import sys

    index, _, model = eligible_model
    base = tmp_path / "recs"
    publish(model, base, warmup_batch_sizes=(1,))
    ids = MemberCatalogue.from_index(index).item_ids
    np.save(tmp_path / "in_stock.npy", ids[:9])
    script = (
        "import sys\n"
        "from static_keras.cli import main\n"
        f"code = main(['refresh-eligibility', '--model-base-path', {str(base)!r},\n"
        f"             '--set', 'in_stock={tmp_path / 'in_stock.npy'}'])\n"
        "print(code, 'tensorflow' in sys.modules, 'keras' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "published version 2" in done.stdout
    assert done.stdout.strip().splitlines()[-1] == "0 False False"
    assert read_eligibility(base / "2").sizes()["in_stock"] == 9
    # What it wrote serves: the server's load is the first (and only) one.
    context, set_ids, excluded = _request(index, 4, seed=5)
    answer = load_servable(base / "2", 2).run(
        ELIGIBLE_SIGNATURE,
        {"history": context, "set_id": np.zeros(4, np.int32), "excluded_item_ids": excluded},
    )
    _assert_eligible(answer["item_ids"], read_eligibility(base / "2"), np.zeros(4, int), excluded)
