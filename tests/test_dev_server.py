"""The development server: wire formats, labels, errors and hot swaps."""

import gc
import os
import shutil
import threading
import time
import weakref

import numpy as np
import pytest
import tensorflow as tf
from conftest import histories
from conftest import make_model

from static_keras.export import export_saved_model
from static_keras.export import publish
from static_keras.serving import GrpcClient
from static_keras.serving import RestClient
from static_keras.serving import ServedModel
from static_keras.serving import ServingError
from static_keras.serving import read_models_config
from static_keras.serving import write_batching_config
from static_keras.serving import write_models_config
from static_keras.serving.dev_server import DevServer
from static_keras.serving.warmup import write_warmup_requests


@pytest.fixture(scope="module")
def two_indexes():
    """Two disjoint valid sets: a response valid under both would be a mix."""
    rows = np.random.default_rng(9).permutation(16**4)[:600]
    tokens = np.stack([(rows // 16**k) % 16 for k in range(4)], axis=1)
    return make_index_from(tokens[:300], 0), make_index_from(tokens[300:], 1)


def make_index_from(tokens, offset):
    from static_keras import StaticIndex

    ids = np.arange(len(tokens)) + 10_000 * (offset + 1)
    return StaticIndex.build(tokens, 16, item_ids=ids)


def test_grpc_and_rest_answer_like_the_model(small_model, tmp_path):
    index, model = small_model
    publish(model, tmp_path / "recs")
    batch = histories(3, seed=11)
    expected = model.predict(batch, verbose=0)
    with DevServer([ServedModel("recs", str(tmp_path / "recs"))]) as server:
        with GrpcClient(server.grpc_address) as grpc_client:
            answers = [grpc_client.predict("recs", {"history": batch})]
            assert answers[0]["model_version"] == 1
            assert grpc_client.model_status("recs") == [
                {"version": 1, "state": "AVAILABLE", "error": ""}
            ]
        rest = RestClient(server.rest_url)
        answers.append(rest.predict("recs", {"history": batch}, form="inputs"))
        answers.append(rest.predict("recs", {"history": batch}, form="instances"))
        answers.append(rest.predict("recs", {"history": batch}, version=1))
        assert rest.model_status("recs") == [{"version": 1, "state": "AVAILABLE", "error": ""}]
    for answer in answers:
        np.testing.assert_array_equal(answer["tokens"], expected["tokens"])
        np.testing.assert_array_equal(answer["item_ids"], expected["item_ids"])
        np.testing.assert_allclose(answer["scores"], expected["scores"], rtol=1e-6)


@pytest.mark.slow  # two servers from a models config: 19 s on 2 cores
def test_labels_from_a_models_config(two_indexes, tmp_path):
    old, new = two_indexes
    decoder_model = make_model(old)
    publish(decoder_model, tmp_path / "recs")
    publish(make_model(new, decoder=decoder_model.layers[1].decoder), tmp_path / "recs")
    config = tmp_path / "models.config"
    write_models_config(
        config,
        [ServedModel("recs", str(tmp_path / "recs"), versions=[1, 2],
                     labels={"stable": 1, "canary": 2})],
    )  # fmt: skip
    (model,) = read_models_config(config)
    assert model.labels == {"stable": 1, "canary": 2} and model.versions == [1, 2]
    batch = histories(2, seed=12)
    with DevServer(read_models_config(config)) as server:
        grpc_client, rest = GrpcClient(server.grpc_address), RestClient(server.rest_url)
        for label, index, version in (("stable", old, 1), ("canary", new, 2)):
            answer = grpc_client.predict("recs", {"history": batch}, label=label)
            assert answer["model_version"] == version
            assert index.contains(answer["tokens"].reshape(-1, 4)).all()
            answer = rest.predict("recs", {"history": batch}, label=label)
            assert index.contains(answer["tokens"].reshape(-1, 4)).all()
        assert grpc_client.model_status("recs", label="canary")[0]["version"] == 2
        # Rolling back is moving the label: a new config, same versions.
        with pytest.raises(ServingError, match="Unrecognized servable version label: beta"):
            grpc_client.predict("recs", {"history": batch}, label="beta")
        grpc_client.close()


def test_bad_requests_get_clear_errors(small_model, tmp_path):
    _, model = small_model
    publish(model, tmp_path / "recs")
    batch = histories(2)
    # (inputs, kwargs, gRPC message, REST message)
    cases = [
        # gRPC feeds tensors as they are: Session::Run refuses another dtype.
        ({"history": batch.astype("float32")}, {}, r"expects arg\[0\] to be int32 but float32",
         "must hold integers"),
        ({"query": batch}, {}, r"Sent extra: \{query\}. Missing but required: \{history\}",
         r"do not match the signature's inputs \['history'\]"),
        ({"history": batch}, {"version": 9}, r"Specific\(recs, 9\)", r"Specific\(recs, 9\)"),
        ({"history": batch}, {"signature": "nope"}, 'FAILED_PRECONDITION.*"nope" not found',
         'HTTP 400.*"nope" not found'),
    ]  # fmt: skip
    with DevServer([ServedModel("recs", str(tmp_path / "recs"))]) as server:
        with GrpcClient(server.grpc_address) as grpc_client:
            rest = RestClient(server.rest_url)
            for inputs, kwargs, grpc_message, rest_message in cases:
                with pytest.raises(ServingError, match=grpc_message):
                    grpc_client.predict("recs", inputs, **kwargs)
                with pytest.raises(ServingError, match=rest_message):
                    rest.predict("recs", inputs, **kwargs)
            # No silent cast over gRPC; JSON numbers take the signature's dtype.
            with pytest.raises(ServingError, match="INVALID_ARGUMENT.*int32 but int64"):
                grpc_client.predict("recs", {"history": batch.astype("int64")})
            answer = rest.predict("recs", {"history": batch.astype("int64")})
            assert answer["model_version"] == 1
            with pytest.raises(ServingError, match="NOT_FOUND.*model 'ads'"):
                grpc_client.predict("ads", {"history": batch})
            with pytest.raises(ServingError, match="HTTP 404"):
                rest.predict("ads", {"history": batch})
            with pytest.raises(ServingError, match="HTTP 400.*exactly one of"):
                rest._request(f"{server.rest_url}/v1/models/recs:predict", {}, "empty")


def test_hot_swap_under_load_never_fails_or_mixes(two_indexes, tmp_path):
    old, new = two_indexes
    first = make_model(old, beam_size=4)
    second = make_model(new, decoder=first.layers[1].decoder, beam_size=4)
    base = tmp_path / "recs"
    publish(first, base, warmup_batch_sizes=(1, 2))
    batch = histories(2, seed=13)
    answers, failures = [], []
    stop = threading.Event()

    def load(client):
        # Until the main thread has seen version 2 answer: a cap on the
        # answers raced the publish (on a loaded machine 2000 answers came
        # before version 2 was served). The deadline only bounds a hang.
        deadline = time.monotonic() + 300
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                answers.append(client.predict("recs", {"history": batch}))
            except ServingError as error:
                failures.append(str(error))

    with DevServer([ServedModel("recs", str(base))], poll_seconds=0.1) as server:
        with GrpcClient(server.grpc_address, timeout=30) as client:
            worker = threading.Thread(target=load, args=(client,))
            worker.start()
            while len(answers) < 5 and worker.is_alive():
                time.sleep(0.01)
            publish(second, base, warmup_batch_sizes=(1, 2))  # index-only refresh
            server.wait_for_version("recs", 2)
            served_v2 = len(answers)
            while len(answers) < served_v2 + 5 and worker.is_alive():
                time.sleep(0.01)
            stop.set()
            worker.join()
            assert client.predict("recs", {"history": batch})["model_version"] == 2
            status = {s["version"]: s["state"] for s in client.model_status("recs")}
    assert failures == []
    versions = [answer["model_version"] for answer in answers]
    assert versions == sorted(versions) and set(versions) == {1, 2}
    for answer in answers:
        index = old if answer["model_version"] == 1 else new
        assert index.contains(answer["tokens"].reshape(-1, 4)).all()
        np.testing.assert_array_equal(
            answer["item_ids"].reshape(-1), index.lookup_item_ids(answer["tokens"].reshape(-1, 4))
        )
    assert status == {1: "END", 2: "AVAILABLE"}


def test_broken_versions_are_rejected_while_the_old_one_serves(small_model, tmp_path):
    index, model = small_model
    base = tmp_path / "recs"
    publish(model, base)
    batch = histories(1)
    with DevServer([ServedModel("recs", str(base))], poll_seconds=0.1) as server:
        with GrpcClient(server.grpc_address) as client:
            # Version 2: corrupt variables (copied aside, then renamed in).
            staging = tmp_path / "staging2"
            shutil.copytree(base / "1", staging)
            data = next((staging / "variables").glob("variables.data-*"))
            data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
            os.rename(staging, base / "2")
            # Version 3: warmup requests the model cannot run (wrong dtype).
            export_saved_model(model, tmp_path / "staging3")
            write_warmup_requests(
                str(tmp_path / "staging3" / "assets.extra" / "tf_serving_warmup_requests"),
                model_name="recs", signature_name="serving_default",
                examples={"history": np.zeros((1, 5), "float32")}, batch_sizes=[1],
            )  # fmt: skip
            os.rename(tmp_path / "staging3", base / "3")
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                status = {s["version"]: s for s in client.model_status("recs")}
                if status.get(3, {}).get("state") == "END":
                    break
                time.sleep(0.1)
            assert status[1]["state"] == "AVAILABLE"
            assert status[2]["state"] == "END" and status[2]["error"]
            assert status[3]["state"] == "END" and "int32" in status[3]["error"]
            answer = client.predict("recs", {"history": batch})
            assert answer["model_version"] == 1
            assert index.contains(answer["tokens"].reshape(-1, 4)).all()


def test_an_unloaded_version_is_freed(small_model, tmp_path):
    _, model = small_model
    base = tmp_path / "recs"
    publish(model, base, warmup_batch_sizes=(1,))
    with DevServer([ServedModel("recs", str(base))], poll_seconds=0.05) as server:
        manager = server.manager("recs")
        with GrpcClient(server.grpc_address) as client:
            assert client.predict("recs", {"history": histories(1)})["model_version"] == 1
        old = manager.resolve(None, None)
        # Its session holds the graph, the variables (the index) and the
        # functions it instantiated.
        call = old.signatures["serving_default"].call
        refs = [weakref.ref(old), weakref.ref(old.session), weakref.ref(old.session.graph)]
        del old
        publish(model, base, warmup_batch_sizes=(1,))
        server.wait_for_version("recs", 2)
        deadline = time.monotonic() + 60
        while manager.status(1, None)[0][1] != "END" and time.monotonic() < deadline:
            time.sleep(0.05)
        # Unloading closes the version's session, which frees all of it at
        # once (no kernel cache outlives it), and drops every reference.
        assert manager.status(1, None)[0][1] == "END"
        with pytest.raises(tf.errors.CancelledError, match="Session has been closed"):
            call(histories(1))
        del call
        # A gRPC worker that answered from version 1 may still hold what it
        # ran until it takes its next request: what matters is that nothing
        # keeps the version (no leak) while traffic goes on.
        with GrpcClient(server.grpc_address) as client:
            while any(ref() is not None for ref in refs) and time.monotonic() < deadline:
                assert client.predict("recs", {"history": histories(1)})["model_version"] == 2
                gc.collect()
        assert [ref for ref in refs if ref() is not None] == []


def test_an_unload_waits_for_requests_in_flight_then_frees(small_model, tmp_path):
    """A request still running on the old version when the new one is up:
    the unload waits for it (TF Serving's handles), then frees the version
    at once, without waiting for a later garbage collection."""
    _, model = small_model
    base = tmp_path / "recs"
    publish(model, base, warmup_batch_sizes=(1,))
    with DevServer([ServedModel("recs", str(base))], poll_seconds=0.05) as server:
        manager = server.manager("recs")
        with manager.serving(None, None) as old:  # a request in flight on version 1
            refs = [weakref.ref(old), weakref.ref(old.session), weakref.ref(old.session.graph)]
            call = old.signatures["serving_default"].call
            publish(model, base, warmup_batch_sizes=(1,))
            server.wait_for_version("recs", 2)
            time.sleep(0.5)  # several polls: the unload is waiting
            assert manager.status(1, None)[0][1] == "UNLOADING"
            answer = old.run("serving_default", {"history": histories(1)})  # still runs
            assert answer["item_ids"].shape[0] == 1
            del old
        deadline = time.monotonic() + 60
        while manager.status(1, None)[0][1] != "END" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert manager.status(1, None)[0][1] == "END"
        with pytest.raises(tf.errors.CancelledError, match="Session has been closed"):
            call(histories(1))  # closed once its request ended
        del call
        gc.collect()
        assert [ref for ref in refs if ref() is not None] == []


def test_xla_versions_rejected_unless_enabled(small_model, tmp_path):
    _, model = small_model
    publish(model, tmp_path / "recs", xla=True, warmup_batch_sizes=(1,))
    with DevServer([ServedModel("recs", str(tmp_path / "recs"))]) as server:
        (status,) = server.manager("recs").status(None, None)
        assert status[1] == "END" and "XLA compilation disabled" in status[2]
    with DevServer([ServedModel("recs", str(tmp_path / "recs"))], xla_enabled=True) as server:
        answer = GrpcClient(server.grpc_address).predict("recs", {"history": histories(1)})
        assert answer["model_version"] == 1


def test_config_writers(tmp_path):
    text = write_batching_config(
        tmp_path / "batching.config", max_batch_size=32, allowed_batch_sizes=[1, 8, 32]
    )
    assert "max_batch_size { value: 32 }" in text
    assert text.count("allowed_batch_sizes:") == 3
    with pytest.raises(ValueError, match="must end at max_batch_size=32"):
        write_batching_config(tmp_path / "b", max_batch_size=32, allowed_batch_sizes=[1, 8])
    with pytest.raises(ValueError, match="not served"):
        write_models_config(tmp_path / "m", [ServedModel("r", "/x", [1], {"stable": 2})])
    with pytest.raises(ValueError, match="labels need explicit"):
        write_models_config(tmp_path / "m", [ServedModel("r", "/x", None, {"stable": 1})])
    (tmp_path / "bad.config").write_text("model_config_list { nonsense: 1 }")
    with pytest.raises(ValueError, match="not a valid models.config"):
        read_models_config(tmp_path / "bad.config")
