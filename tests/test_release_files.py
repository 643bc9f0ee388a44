"""Files written by release 0.1 still load and give the answers recorded then.

tests/fixtures/release_0_1/ was written once by
tests/fixtures/make_release_fixtures.py from the 0.1 checkout and is never
regenerated: a change to weights, their names, their order or their
meaning must keep these loading (an explicit upgrade step), not rewrite them.
"""

import os

import keras
import numpy as np
import pytest

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "release_0_1")


@pytest.fixture(scope="module")
def expected():
    return dict(np.load(os.path.join(FIXTURES, "expected.npz")))


def _assert_answers(found, expected, prefix):
    names = sorted(k[len(prefix) :] for k in expected if k.startswith(prefix))
    assert sorted(found) == names
    for name in names:
        want = expected[prefix + name]
        if name == "scores":
            np.testing.assert_allclose(np.asarray(found[name]), want, rtol=1e-5, atol=1e-5)
        else:
            np.testing.assert_array_equal(np.asarray(found[name]), want)


def test_the_recommender_keras_file_loads_and_answers_as_recorded(expected):
    model = keras.saving.load_model(os.path.join(FIXTURES, "recommender.keras"))
    _assert_answers(model(expected["history"]), expected, "recommender_")
    search = model.get_layer("search")
    members = search.constraint.catalogue().exclusion_members(expected["excluded"])
    from static_keras import Eligibility  # after the load: it needs no import of ours

    found = search(expected["history"], eligibility=Eligibility(expected["set_ids"], members))
    _assert_answers(found, expected, "eligible_")
    assert search.constraint.eligibility_sets().names == ("in_stock", "fr")


def test_the_strings_keras_file_loads_and_answers_as_recorded(expected):
    model = keras.saving.load_model(os.path.join(FIXTURES, "strings.keras"))
    _assert_answers(model(expected["prompt"]), expected, "strings_")


def test_the_saved_model_serves_the_recorded_answers(expected):
    import tensorflow as tf

    loaded = tf.saved_model.load(os.path.join(FIXTURES, "saved_model"))
    serve = loaded.signatures["serving_default"]
    _assert_answers(serve(history=tf.constant(expected["history"])), expected, "recommender_")
    eligible = loaded.signatures["serving_eligible"](
        history=tf.constant(expected["history"]),
        set_id=tf.constant(expected["set_ids"]),
        excluded_item_ids=tf.constant(expected["excluded"]),
    )
    _assert_answers(eligible, expected, "eligible_")


def test_an_eligibility_refresh_of_the_release_saved_model_serves_the_new_sets(expected, tmp_path):
    import shutil

    import tensorflow as tf

    from static_keras.export import read_eligibility
    from static_keras.export import refresh_eligibility

    base = tmp_path / "recs"
    shutil.copytree(os.path.join(FIXTURES, "saved_model"), base / "1")
    held = read_eligibility(base / "1")
    new_ids = held.catalogue.item_ids[::2][:40]
    info = refresh_eligibility(base, {"in_stock": new_ids})
    assert (info.version, info.source_version) == (2, 1)
    loaded = tf.saved_model.load(str(base / "2"))
    found = loaded.signatures["serving_eligible"](
        history=tf.constant(expected["history"]),
        set_id=tf.zeros(len(expected["history"]), tf.int32),  # "in_stock" everywhere
        excluded_item_ids=tf.constant(expected["excluded"]),
    )
    items = found["item_ids"].numpy()
    assert (items >= 0).any()
    allowed = set(new_ids.tolist())
    for row, excluded in zip(items, expected["excluded"]):
        assert set(row[row >= 0].tolist()) <= allowed - set(excluded.tolist())
