"""`update_catalogue`: a catalogue delta published like a rules refresh.

The oracle is the Keras search over `StaticIndex.build` of the new catalogue
(exact layout) with the sets the delta implies, sharing the decoder: the
updated version, loaded as TF Serving loads it, answers exactly the same
through both signatures. The graph and warmup records are the served
version's bytes, only index and set tensors change, the job imports neither
TensorFlow nor Keras, and a bad or oversized delta writes nothing.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import CONTEXT_VOCAB
from conftest import HISTORY
from conftest import histories

from static_keras import CachedTransformerDecoder
from static_keras import ConstrainedBeamSearch
from static_keras import ConstrainedDecoding
from static_keras import StaticIndex
from static_keras.export import ELIGIBLE_SIGNATURE
from static_keras.export import catalogue_fingerprint
from static_keras.export import list_versions
from static_keras.export import publish
from static_keras.export import read_eligibility
from static_keras.export import read_metadata
from static_keras.export import read_served_index
from static_keras.export import refresh_eligibility
from static_keras.export import update_catalogue
from static_keras.export.version_lock import PublishConflict
from static_keras.index.eligibility import EligibilitySets
from static_keras.index.eligibility import MemberCatalogue
from static_keras.index.headroom import CapacityError
from static_keras.serving.servable import load_servable

VOCAB, LENGTH, N = 12, 4, 240
NAMES = ("in_stock", "fr")


@pytest.fixture(scope="module")
def catalogue_model():
    rng = np.random.default_rng(0)
    rows = np.unique(rng.integers(0, VOCAB, (N, LENGTH)), axis=0)
    rows = rows[rng.permutation(len(rows))]
    ids = 10**9 + 2 * rng.permutation(len(rows)).astype(np.int64)
    index = StaticIndex.build(rows, VOCAB, item_ids=ids, headroom=0.2)
    sets = {name: rng.choice(ids, len(ids) // 2, replace=False) for name in NAMES}
    keras.utils.set_random_seed(0)
    decoder = CachedTransformerDecoder(VOCAB, LENGTH, context_vocab_size=CONTEXT_VOCAB,
                                       hidden_dim=16)  # fmt: skip
    layer = ConstrainedDecoding(index, eligibility=EligibilitySets.build(index, sets),
                                name="constraint")  # fmt: skip
    search = ConstrainedBeamSearch(constraint=layer, decoder=decoder, beam_size=6)
    history = keras.Input((HISTORY,), dtype="int32", name="history")
    return rows, ids, sets, decoder, keras.Model(history, search(history))


def a_delta(rows, ids, seed):
    """Removes 10 % (one removed row re-used by a new item), adds 12 rows."""
    rng = np.random.default_rng(seed)
    gone = rng.choice(len(rows), len(rows) // 10, replace=False)
    taken = {tuple(r) for r in rows}
    fresh = [r for r in map(tuple, rng.integers(0, VOCAB, (60, LENGTH))) if r not in taken]
    added = np.array(list(dict.fromkeys(fresh))[:11] + [tuple(rows[gone[0]])])
    new_ids = 5 + 2 * np.arange(len(added), dtype=np.int64)
    return gone, added, new_ids


def oracle(decoder, rows, ids, gone, added, new_ids, sets, joined):
    keep = np.setdiff1d(np.arange(len(rows)), gone)
    all_rows = np.concatenate([rows[keep], added])
    all_ids = np.concatenate([ids[keep], new_ids])
    index = StaticIndex.build(all_rows, VOCAB, item_ids=all_ids)
    members = {name: np.concatenate([np.intersect1d(sets[name], all_ids),
                                     np.asarray(joined.get(name, []), np.int64)])
               for name in NAMES}  # fmt: skip
    layer = ConstrainedDecoding(index, eligibility=EligibilitySets.build(index, members))
    return index, members, ConstrainedBeamSearch(constraint=layer, decoder=decoder, beam_size=6)


def test_the_updated_version_answers_as_the_new_catalogue(catalogue_model, tmp_path):
    rows, ids, sets, decoder, model = catalogue_model
    base = tmp_path / "recs"
    publish(model, base, warmup_batch_sizes=(1, 3))
    gone, added, new_ids = a_delta(rows, ids, 1)
    joined = {"in_stock": new_ids[:4]}
    info = update_catalogue(base, add_sequences=added, add_item_ids=new_ids,
                            remove_item_ids=ids[gone], add_to_sets=joined)  # fmt: skip
    assert (info.version, info.source_version) == (2, 1)
    assert (info.added, info.removed) == (len(added), len(gone))
    index, members, search = oracle(decoder, rows, ids, gone, added, new_ids, sets, joined)
    assert info.num_items == index.num_sequences
    assert info.sizes == {name: len(members[name]) for name in NAMES}

    served = read_served_index(base / "2")
    np.testing.assert_array_equal(served.sequences(), index.sequences())
    assert read_eligibility(base / "2").sizes() == info.sizes
    # The graph and the warmup records are the served version's bytes.
    for name in ("saved_model.pb", "assets.extra/tf_serving_warmup_requests"):
        with open(base / "1" / name, "rb") as a, open(base / "2" / name, "rb") as b:
            assert a.read() == b.read(), name
    entry = read_metadata(base / "2")["indexes"][0]
    assert entry["num_sequences"] == index.num_sequences
    assert read_metadata(base / "2")["catalogue_delta"]["source_version"] == 1

    # Loaded as TF Serving loads it, both signatures answer as the oracle.
    servable = load_servable(base / "2", 2)
    context = histories(8, seed=3)
    rng = np.random.default_rng(4)
    set_ids = rng.integers(-1, len(NAMES), 8).astype(np.int32)
    excluded = rng.choice(index.lookup_item_ids(index.sequences()), (8, 3)).astype(np.int64)
    excluded[:, -1] = -1
    got = servable.run(ELIGIBLE_SIGNATURE, {"history": context, "set_id": set_ids,
                                            "excluded_item_ids": excluded})  # fmt: skip
    want = search(context, set_ids, MemberCatalogue.from_index(index).exclusion_members(excluded))
    np.testing.assert_array_equal(got["item_ids"], np.asarray(want["item_ids"]))
    np.testing.assert_allclose(got["scores"], np.asarray(want["scores"]), rtol=1e-5)
    plain = servable.run("serving_default", {"history": context})
    np.testing.assert_array_equal(plain["item_ids"], np.asarray(search(context)["item_ids"]))

    # Rules refresh and a second delta on top of the updated version, built
    # against the catalogue the first one published.
    assert catalogue_fingerprint(base / "2") == info.catalogue_fingerprint
    assert info.catalogue_fingerprint != catalogue_fingerprint(base / "1")
    refresh_eligibility(base, {"fr": new_ids[:2]})
    assert read_eligibility(base / "3").sizes()["fr"] == 2
    with pytest.raises(ValueError, match="`base_fingerprint` .* another catalogue"):
        update_catalogue(base, remove_item_ids=new_ids[:1],
                         base_fingerprint=catalogue_fingerprint(base / "1"))  # fmt: skip
    info = update_catalogue(base, remove_item_ids=new_ids[:1],
                            base_fingerprint=info.catalogue_fingerprint)  # fmt: skip
    assert info.version == 4 and read_eligibility(base / "4").sizes()["fr"] == 1


def test_bad_and_oversized_deltas_write_nothing(catalogue_model, tmp_path):
    rows, ids, _, _, model = catalogue_model
    base = tmp_path / "recs"
    publish(model, base, warmup_batch_sizes=(1,))
    before = sorted(os.listdir(base))
    cases = [
        (dict(remove_item_ids=[7]), "`remove_item_ids` names 1 item id"),
        (dict(add_sequences=rows[:1], add_item_ids=[3]), "repeats the semantic ID"),
        (dict(add_sequences=[[0, 0, 0, 99]], add_item_ids=[3]), "`add_sequences`"),
        (dict(add_sequences=[[0, 0, 0, 0]], add_item_ids=[3], add_to_sets={"fr": [4]}),
         r"`add_to_sets\['fr'\]` names 1 item id"),
        (dict(add_sequences=[[0, 0, 0, 0]], add_item_ids=[3], add_to_sets={"de": [3]}),
         "de"),
        (dict(remove_item_ids=ids[:1], base_fingerprint="0" * 64), "`base_fingerprint`"),
    ]  # fmt: skip
    every = np.indices((VOCAB,) * LENGTH).reshape(LENGTH, -1).T
    every = every[~np.isin(every @ VOCAB ** np.arange(LENGTH)[::-1],
                           rows @ VOCAB ** np.arange(LENGTH)[::-1])][:200]  # fmt: skip
    for arguments, message in cases:
        with pytest.raises(ValueError, match=message):
            update_catalogue(base, **arguments)
    with pytest.raises(CapacityError, match=r"capacity .*more headroom"):
        update_catalogue(base, add_sequences=every, add_item_ids=np.arange(len(every)))
    assert list_versions(base) == [1]
    assert sorted(os.listdir(base)) == before


def test_a_version_without_headroom_is_refused(small_model, tmp_path):
    _, model = small_model
    base = tmp_path / "recs"
    publish(model, base, warmup_batch_sizes=(1,))
    with pytest.raises(ValueError, match=r"without headroom.*headroom=0.1"):
        update_catalogue(base, remove_item_ids=[1000])


def test_the_command_line_job_imports_neither_tensorflow_nor_keras(catalogue_model, tmp_path):
    rows, ids, _, _, model = catalogue_model
    base = tmp_path / "recs"
    publish(model, base, warmup_batch_sizes=(1,))
    gone, added, new_ids = a_delta(rows, ids, 2)
    np.savez(tmp_path / "added.npz", semantic_ids=added, item_ids=new_ids)
    np.save(tmp_path / "removed.npy", ids[gone])
    script = (
        "import sys\n"
        "from static_keras.cli import main\n"
        f"code = main(['update-catalogue', '--model-base-path', {str(base)!r},\n"
        f"             '--add', {str(tmp_path / 'added.npz')!r},\n"
        f"             '--remove', {str(tmp_path / 'removed.npy')!r}])\n"
        "print(code, 'tensorflow' in sys.modules, 'keras' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "published version 2" in done.stdout
    assert done.stdout.strip().splitlines()[-1] == "0 False False"
    served = read_served_index(base / "2")
    assert served.num_sequences == len(rows) - len(gone) + len(added)
    assert tf.saved_model.load(str(base / "2")).signatures  # loads


def _digest_holds(path):
    """The version's table digest verifies (read_eligibility checks it) and
    binds the fingerprint its table really has (derived here, the slow way),
    which is the served index's catalogue."""
    sets = read_eligibility(path)
    ids, members = sets.catalogue.exclusion_table()
    derived = MemberCatalogue.from_sorted(ids, members, sets.num_members).fingerprint
    assert sets.catalogue.fingerprint == derived
    assert derived == MemberCatalogue.from_index(read_served_index(path)).fingerprint


def _items(path, name):
    sets = read_eligibility(path)
    members = np.flatnonzero(sets.contains(sets.set_id(name), np.arange(sets.num_members)))
    return np.sort(sets.catalogue.item_ids[members])


def test_a_rule_landing_during_the_delta_job_is_kept(catalogue_model, tmp_path, monkeypatch):
    """The delta job pauses where it writes its checkpoint; a rules job
    publishes first. The delta rebases: its version holds the rule too."""
    from static_keras.export import checkpoint_patch

    rows, ids, _, _, model = catalogue_model
    base = tmp_path / "recs"
    publish(model, base, warmup_batch_sizes=(1,))
    gone, added, new_ids = a_delta(rows, ids, 3)
    rule = np.setdiff1d(ids[:30], ids[gone])
    real, paused = checkpoint_patch.replace_tensors, []

    def rules_job_first(*args, **kwargs):
        if not paused:
            paused.append(True)
            assert refresh_eligibility(base, {"fr": rule}).version == 2
        return real(*args, **kwargs)

    monkeypatch.setattr(checkpoint_patch, "replace_tensors", rules_job_first)
    info = update_catalogue(base, add_sequences=added, add_item_ids=new_ids,
                            remove_item_ids=ids[gone])  # fmt: skip
    assert (info.version, info.rebased_onto) == (3, (2,))
    np.testing.assert_array_equal(_items(base / "3", "fr"), np.sort(rule))
    _digest_holds(base / "3")
    served = read_served_index(base / "3")
    assert set(served.lookup_item_ids(added).tolist()) == set(new_ids.tolist())


def test_a_delta_landing_during_a_rules_job_is_kept(catalogue_model, tmp_path, monkeypatch):
    """The rules job pauses where it writes its checkpoint; the delta
    publishes first. The rules job rebases onto the new catalogue."""
    from static_keras.export import checkpoint_patch

    rows, ids, _, _, model = catalogue_model
    base = tmp_path / "recs"
    publish(model, base, warmup_batch_sizes=(1,))
    gone, added, new_ids = a_delta(rows, ids, 4)
    real, paused = checkpoint_patch.replace_tensors, []

    def delta_first(*args, **kwargs):
        if not paused:
            paused.append(True)
            update_catalogue(base, add_sequences=added, add_item_ids=new_ids,
                             remove_item_ids=ids[gone])  # fmt: skip
        return real(*args, **kwargs)

    monkeypatch.setattr(checkpoint_patch, "replace_tensors", delta_first)
    info = refresh_eligibility(base, {"fr": ids[:30]})
    assert (info.version, info.rebased_onto) == (3, (2,))
    # The rule over the new catalogue: removed items dropped out.
    still_there = np.setdiff1d(ids[:30], ids[gone])
    np.testing.assert_array_equal(_items(base / "3", "fr"), np.sort(still_there))
    _digest_holds(base / "3")
    served = read_served_index(base / "3")
    assert served.num_sequences == len(rows) - len(gone) + len(added)


def test_two_deltas_at_once_both_publish(catalogue_model, tmp_path, monkeypatch):
    """A second delta lands while the first writes its checkpoint: the first
    rebases onto it and applies its own change there; both changes hold."""
    from static_keras.export import checkpoint_patch

    rows, ids, _, _, model = catalogue_model
    base = tmp_path / "recs"
    publish(model, base, warmup_batch_sizes=(1,))
    real, paused = checkpoint_patch.replace_tensors, []

    def other_delta_first(*args, **kwargs):
        if not paused:
            paused.append(True)
            assert update_catalogue(base, remove_item_ids=ids[:3]).version == 2
        return real(*args, **kwargs)

    monkeypatch.setattr(checkpoint_patch, "replace_tensors", other_delta_first)
    info = update_catalogue(base, remove_item_ids=ids[3:5])
    assert (info.version, info.rebased_onto) == (3, (2,))
    served = read_served_index(base / "3")
    assert served.num_sequences == len(rows) - 5
    assert not set(ids[:5].tolist()) & set(served.lookup_item_ids(served.sequences()).tolist())
    # A delta that no longer applies after the rebase is refused in one line.
    paused.clear()

    def same_item_removed_first(*args, **kwargs):
        if not paused:
            paused.append(True)
            update_catalogue(base, remove_item_ids=ids[5:6])
        return real(*args, **kwargs)

    monkeypatch.setattr(checkpoint_patch, "replace_tensors", same_item_removed_first)
    with pytest.raises(PublishConflict, match="does not take this delta.*nothing was published"):
        update_catalogue(base, remove_item_ids=ids[5:7])
    assert list_versions(base)[-1] == 4


def test_a_source_pruned_while_the_delta_reads_it_is_one_line(
    catalogue_model, tmp_path, monkeypatch, capsys
):
    """A rules job with `--keep 1` publishes and removes the delta's source
    while the delta reads it again after its merge (the served table): the
    delta ends in one line, nothing published, the rule kept."""
    from static_keras import cli
    from static_keras.export import checkpoint_patch

    rows, ids, _, _, model = catalogue_model
    base = tmp_path / "recs"
    publish(model, base, warmup_batch_sizes=(1,))
    real, reads = checkpoint_patch.read_tensors, []

    def pruned_before_the_second_read(*args, **kwargs):
        reads.append(True)
        if len(reads) == 2:  # the served table, read again after the merge
            assert refresh_eligibility(base, {"fr": ids[:7]}, keep=1).version == 2
        return real(*args, **kwargs)

    monkeypatch.setattr(checkpoint_patch, "read_tensors", pruned_before_the_second_read)
    np.save(tmp_path / "gone.npy", ids[:2])
    command = ["update-catalogue", "--model-base-path", str(base), "--remove",
               str(tmp_path / "gone.npy")]  # fmt: skip
    assert cli.main(command) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "version 1 was removed while this job read it" in err
    assert "nothing was published" in err
    assert list_versions(base) == [2]
    np.testing.assert_array_equal(_items(base / "2", "fr"), np.sort(ids[:7]))


def test_bad_delta_files_are_one_line(catalogue_model, tmp_path, capsys):
    from static_keras import cli

    _, ids, _, _, model = catalogue_model
    base = tmp_path / "recs"
    publish(model, base, warmup_batch_sizes=(1,))
    np.savez(tmp_path / "no_ids.npz", semantic_ids=np.zeros((1, LENGTH), np.int64))
    np.save(tmp_path / "rows.npy", np.zeros((1, LENGTH), np.int64))
    np.save(tmp_path / "removed.npy", ids[:1])
    command = ["update-catalogue", "--model-base-path", str(base)]
    cases = [
        ([], "needs --add, --remove or both"),
        (["--add", str(tmp_path / "no_ids.npz")], "no array 'item_ids'"),
        (["--add", str(tmp_path / "missing.npz")], "no such file"),
        (["--add", str(tmp_path / "no_ids.npz").replace(".npz", ".npy")], "no such file"),
        (["--add", str(tmp_path / "rows.npy")], "needs --add-item-ids FILE"),
        (
            ["--add-to-set", "fr", "--remove", str(tmp_path / "removed.npy")],
            "--add-to-set must be NAME=FILE",
        ),
        (["--remove", str(tmp_path / "x.npy")], "no such file"),
    ]
    for extra, message in cases:
        assert cli.main([*command, *extra]) == 2
        assert message in capsys.readouterr().err
    assert list_versions(base) == [1]


def test_the_jobs_print_their_stages_with_progress_and_nothing_without(
    catalogue_model, tmp_path, capsys
):
    """`--progress` (or a terminal): one line as each stage starts and one
    with its seconds as it ends, in order, on stderr; without it (a script's
    stderr) and from Python, nothing."""
    from static_keras import cli

    _, ids, _, _, model = catalogue_model
    base = tmp_path / "recs"
    publish(model, base, warmup_batch_sizes=(1,))
    capsys.readouterr()
    np.save(tmp_path / "removed.npy", ids[:2])
    np.save(tmp_path / "in_stock.npy", ids[2:40])
    update = ["update-catalogue", "--model-base-path", str(base), "--remove"]
    assert cli.main([*update, str(tmp_path / "removed.npy")]) == 0
    quiet = capsys.readouterr()
    assert "published version 2" in quiet.out and quiet.err == ""

    np.save(tmp_path / "removed.npy", ids[2:3])
    assert cli.main([*update, str(tmp_path / "removed.npy"), "--progress"]) == 0
    staged = capsys.readouterr()
    stages = [
        "merging the delta into the index of version 2",
        "writing and verifying the new index tensors",
        "publishing: the next version number and the rename, under the lock",
    ]
    lines = staged.err.splitlines()
    expected = [line for s in stages for line in (f"{s} ...", f"{s}: done in")]
    assert len(lines) == len(expected), staged.err
    for line, want in zip(lines, expected):
        assert re.fullmatch(r"\[ *\d+\.\d s\] " + re.escape(want) + r"( \d+\.\d s)?", line), line
    assert "published version 3" in staged.out

    refresh = ["refresh-eligibility", "--model-base-path", str(base), "--progress"]
    assert cli.main([*refresh, "--set", f"fr={tmp_path / 'in_stock.npy'}"]) == 0
    err = capsys.readouterr().err
    assert "reading the sets of version 3 ..." in err
    assert "writing and verifying the new sets: done in" in err
    # Python: no lines unless the caller's logging asks for INFO.
    update_catalogue(base, remove_item_ids=ids[3:4])
    assert capsys.readouterr().err == ""
