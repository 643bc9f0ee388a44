"""Jobs that overlap never lose a change (docs/serving.md, "When jobs overlap").

Each case pauses one job at a fixed point (a wrapped step that runs the
other job first), so the overlap does not depend on timing:

1. a rules refresh lands while the catalogue job builds its new layer
   (after it read the served sets): the catalogue version keeps the rule;
2. a rules refresh lands while the catalogue job exports: both publish,
   the catalogue job last, with the rule;
3. two rules jobs on different sets at once: both publish, the last holds both;

and the edges of the rule: the number is taken at the rename, a job given
`--source-version` refuses in one line, a full disk ends in one line with
nothing visible, a set the catalogue job itself changed keeps its members,
and the three-way merge of sets against an item-id oracle.
"""

from __future__ import annotations

import errno
import os

import keras
import numpy as np
import pytest
from conftest import CONTEXT_VOCAB
from conftest import HISTORY

import static_keras.export
from static_keras import CachedTransformerDecoder
from static_keras import ConstrainedBeamSearch
from static_keras import ConstrainedDecoding
from static_keras import StaticIndex
from static_keras.export import checkpoint_patch
from static_keras.export import list_versions
from static_keras.export import publish
from static_keras.export import read_eligibility
from static_keras.export import refresh_eligibility
from static_keras.export.rebase import merged_sets
from static_keras.export.version_lock import PublishConflict
from static_keras.index.eligibility import EligibilitySets
from static_keras.index.eligibility import MemberCatalogue

NAMES = ("in_stock", "fr")
WARMUP = {"warmup_batch_sizes": (1,)}


def _catalogue(replaced: int = 0, seed: int = 1):
    """300 items (ids 1000..1299); the first `replaced` swapped for new items
    (ids 9000.., new semantic IDs): a day's catalogue change."""
    rows = np.random.default_rng(seed).integers(0, 16, size=(300, 4))
    ids = np.arange(300) + 1000
    if replaced:
        rows[:replaced] = np.random.default_rng(seed + 50).integers(0, 16, size=(replaced, 4))
        ids[:replaced] = np.arange(replaced) + 9000
    return StaticIndex.build(rows, 16, item_ids=ids, on_duplicate_item="first")


def _ids(index) -> np.ndarray:
    return MemberCatalogue.from_index(index).item_ids


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    index = _catalogue()
    rng = np.random.default_rng(0)
    ids = _ids(index)
    sets = EligibilitySets.build(
        index, {name: rng.choice(ids, len(ids) // 2, replace=False) for name in NAMES}
    )
    keras.utils.set_random_seed(0)
    decoder = CachedTransformerDecoder(
        index.vocab_size, index.length, context_vocab_size=CONTEXT_VOCAB, hidden_dim=16
    )
    layer = ConstrainedDecoding(index, eligibility=sets, name="constraint")
    search = ConstrainedBeamSearch(constraint=layer, decoder=decoder, beam_size=4)
    history = keras.Input((HISTORY,), dtype="int32", name="history")
    model = keras.Model(history, search(history))
    path = str(tmp_path_factory.mktemp("model") / "recs.keras")
    model.save(path)
    return path, model


def _assert_sets(path, index, expected: dict):
    """The version at `path` holds exactly `expected` ({name: item ids}) over `index`."""
    held = read_eligibility(path)
    want = EligibilitySets.build(index, expected)
    assert held.names == NAMES and held.catalogue.fingerprint == want.catalogue.fingerprint
    for name in NAMES:
        row, other = held.set_id(name), want.set_id(name)
        np.testing.assert_array_equal(held.words[row], want.words[other], err_msg=name)


def _members(path, name) -> np.ndarray:
    sets = read_eligibility(path)
    inside = sets.contains(sets.set_id(name), np.arange(sets.num_members))
    return sets.catalogue.item_ids[inside]


def _publish_command(model_path, base, index_path):
    return ["publish", model_path, "--model-base-path", str(base), "--index", str(index_path),
            "--warmup-batch-sizes", "1"]  # fmt: skip


@pytest.mark.parametrize("pause_in", ["replace_index", "export"])
def test_a_rules_refresh_during_the_catalogue_job_is_kept(
    model_file, tmp_path, monkeypatch, capsys, pause_in
):
    """Cases 1 and 2: the refresh lands while the catalogue job builds its
    layer (after it read the served sets) or while it exports."""
    from static_keras import cli
    from static_keras.export import saved_model

    model_path, model = model_file
    base = tmp_path / "recs"
    publish(model, base, **WARMUP)
    new_index = _catalogue(replaced=30)
    new_index.save(tmp_path / "fresh.npz")
    rule = _ids(_catalogue())[::5]  # the rules job's in_stock, over version 1's catalogue
    fr_before = _members(base / "1", "fr")

    def refresh_first(real):
        def paused(*args, **kwargs):
            assert refresh_eligibility(base, {"in_stock": rule}).version == 2
            return real(*args, **kwargs)

        return paused

    if pause_in == "replace_index":
        monkeypatch.setattr(
            static_keras.export, "replace_index", refresh_first(static_keras.export.replace_index)
        )
    else:
        real_export = saved_model.export_saved_model
        monkeypatch.setattr(saved_model, "export_saved_model", refresh_first(real_export))
    assert cli.main(_publish_command(model_path, base, tmp_path / "fresh.npz")) == 0, (
        capsys.readouterr().err
    )
    assert "published version 3" in capsys.readouterr().out
    assert list_versions(base) == [1, 2, 3]
    # The rule published during the job, over the new catalogue; fr as it was.
    _assert_sets(base / "3", new_index, {"in_stock": rule, "fr": fr_before})
    assert read_eligibility(base / "3").sizes()["in_stock"] == np.isin(rule, _ids(new_index)).sum()


def test_two_rules_jobs_at_once_both_publish(model_file, tmp_path, monkeypatch, capsys):
    """Case 3: `--set in_stock=...` and `--set fr=...` overlap; the second
    lands while the first writes its checkpoint."""
    from static_keras import cli

    _, model = model_file
    base = tmp_path / "recs"
    publish(model, base, **WARMUP)
    ids = _ids(_catalogue())
    np.save(tmp_path / "in_stock.npy", ids[:40])
    np.save(tmp_path / "fr.npy", ids[100:107])
    command = ["refresh-eligibility", "--model-base-path", str(base), "--set"]
    real = checkpoint_patch.replace_tensors
    paused = []

    def other_job_first(*args, **kwargs):
        if not paused:
            paused.append(True)
            assert cli.main([*command, f"fr={tmp_path / 'fr.npy'}"]) == 0
        return real(*args, **kwargs)

    monkeypatch.setattr(checkpoint_patch, "replace_tensors", other_job_first)
    assert cli.main([*command, f"in_stock={tmp_path / 'in_stock.npy'}"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("published version 2") and out[1].startswith("published version 3")
    assert list_versions(base) == [1, 2, 3]
    assert sorted(_members(base / "3", "in_stock")) == sorted(ids[:40])
    assert sorted(_members(base / "3", "fr")) == sorted(ids[100:107])
    assert sorted(_members(base / "2", "in_stock")) == sorted(_members(base / "1", "in_stock"))


def test_the_number_is_taken_at_the_rename_and_refusals_are_one_line(
    model_file, tmp_path, monkeypatch, capsys
):
    from static_keras import cli

    _, model = model_file
    base = tmp_path / "recs"
    publish(model, base, **WARMUP)
    ids = _ids(_catalogue())
    real = checkpoint_patch.replace_tensors

    def once(job):
        def wrapped(*args, **kwargs):
            if job:
                job.pop()()
            return real(*args, **kwargs)

        return wrapped

    # A refresh of an explicit source refuses (it cannot rebase a choice).
    monkeypatch.setattr(
        checkpoint_patch, "replace_tensors",
        once([lambda: refresh_eligibility(base, {"fr": ids[:3]})]),
    )  # fmt: skip
    np.save(tmp_path / "ids.npy", ids[:9])
    command = ["refresh-eligibility", "--model-base-path", str(base)]
    assert (
        cli.main([*command, "--source-version", "1", "--set", f"in_stock={tmp_path / 'ids.npy'}"])
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert (
        err.count("\n") == 0 and "version 2 was published while this job refreshed version 1" in err
    )
    assert list_versions(base) == [1, 2]

    # An explicit version that another job took meanwhile: one line.
    monkeypatch.setattr(
        checkpoint_patch, "replace_tensors",
        once([lambda: refresh_eligibility(base, {"fr": ids[:4]}, version=5)]),
    )  # fmt: skip
    with pytest.raises(ValueError, match="Version 5 already exists"):
        refresh_eligibility(base, {"in_stock": ids[:9]}, version=5)

    # A full disk: one line, nothing visible, nothing left behind.
    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(base / "x"))

    monkeypatch.setattr(checkpoint_patch, "replace_tensors", disk_full)
    assert cli.main([*command, "--set", f"in_stock={tmp_path / 'ids.npy'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err.count("\n") == 0 and "No space left on device" in err and "nothing was published" in err
    )
    assert list_versions(base) == [1, 2, 5]
    assert not [name for name in os.listdir(base) if name.startswith(".tmp-")]


def test_a_version_published_while_a_job_starts_is_no_error(model_file, tmp_path, monkeypatch):
    """The job lists the versions, then finds its source (a version check
    that can take seconds); a rules job publishing meanwhile takes the number
    this one would take now. That is no error (found by the soak): the
    number is taken under the lock, and the job rebases onto the new version."""
    from static_keras.export import staging

    _, model = model_file
    base = tmp_path / "recs"
    publish(model, base, **WARMUP)
    ids = _ids(_catalogue())
    real = staging.newest_good_version
    other_job = [lambda: refresh_eligibility(base, {"fr": ids[:4]})]

    def slow_check(*args, **kwargs):
        found = real(*args, **kwargs)
        if other_job:
            assert other_job.pop()().version == 2
        return found

    monkeypatch.setattr(staging, "newest_good_version", slow_check)
    info = refresh_eligibility(base, {"in_stock": ids[:9]})
    assert info.version == 3 and list_versions(base) == [1, 2, 3]
    assert sorted(_members(base / "3", "in_stock")) == sorted(ids[:9])
    assert sorted(_members(base / "3", "fr")) == sorted(ids[:4])


def test_a_job_overtaken_again_and_again_still_publishes(model_file, tmp_path, monkeypatch):
    """Short jobs publishing while a job rebases: twice it rebases out of
    the lock, the third time holding it (no other job can land), so it ends."""
    from static_keras.export.staging import OPTIMISTIC_REBASES

    _, model = model_file
    base = tmp_path / "recs"
    publish(model, base, **WARMUP)
    ids = _ids(_catalogue())
    real = checkpoint_patch.replace_tensors
    calls, inner = [], []

    def another_job_first(*args, **kwargs):
        if not inner and len(calls) < 3:  # the outer job's write and its 2 optimistic rebases
            calls.append(True)
            inner.append(True)
            try:
                refresh_eligibility(base, {"fr": ids[10 * len(calls) : 10 * len(calls) + 5]})
            finally:
                inner.pop()
        return real(*args, **kwargs)

    monkeypatch.setattr(checkpoint_patch, "replace_tensors", another_job_first)
    info = refresh_eligibility(base, {"in_stock": ids[:20]})
    assert OPTIMISTIC_REBASES == 2
    assert (info.version, info.rebased_onto, info.source_version) == (5, (2, 3, 4), 4)
    assert sorted(_members(info.path, "in_stock")) == sorted(ids[:20])
    assert sorted(_members(info.path, "fr")) == sorted(ids[30:35])  # the last fr job's


def test_a_set_the_catalogue_job_changed_keeps_its_members(model_file, tmp_path, monkeypatch):
    """Python `publish` of a model whose fr the job itself set: a refresh of
    in_stock meanwhile is carried in, fr stays the job's (three-way)."""
    from static_keras.export import saved_model

    _, model = model_file
    base = tmp_path / "recs"
    publish(model, base, **WARMUP)
    new_index = _catalogue(replaced=30)
    new_ids = _ids(new_index)
    served = read_eligibility(base / "1").carried_over(new_index)
    ours = served.replace("fr", new_ids[:12])
    swapped = static_keras.export.replace_index(model, new_index, eligibility=ours)
    rule = np.intersect1d(new_ids, _ids(_catalogue()))[50:90]  # items of both catalogues
    real = saved_model.export_saved_model

    def paused(*args, **kwargs):
        refresh_eligibility(base, {"in_stock": rule, "fr": new_ids[200:210]})
        return real(*args, **kwargs)

    monkeypatch.setattr(saved_model, "export_saved_model", paused)
    for bad in (7, "1", True, 0):
        with pytest.raises(ValueError, match=r"`based_on` must be a version under .*\[1\]"):
            publish(swapped, base, based_on=bad, **WARMUP)
    info = publish(swapped, base, based_on=1, **WARMUP)
    assert info.version == 3
    _assert_sets(info.path, new_index, {"in_stock": rule, "fr": new_ids[:12]})


def test_a_set_changed_twice_while_the_catalogue_job_rebases_keeps_the_last(
    model_file, tmp_path, monkeypatch
):
    """in_stock lands during the export, and again during the job's first
    rebase: the second rebase compares against what it rebased onto, so the
    last rule is published (the 2x10^7 soak found the first kept)."""
    from static_keras.export import rebase
    from static_keras.export import saved_model

    _, model = model_file
    base = tmp_path / "recs"
    publish(model, base, **WARMUP)
    fr_before = _members(base / "1", "fr")
    new_index = _catalogue(replaced=30)
    both = np.intersect1d(_ids(new_index), _ids(_catalogue()))  # items of both catalogues
    swapped = static_keras.export.replace_index(model, new_index)
    real_export, real_write = saved_model.export_saved_model, rebase.write_with_sets

    def export_after_a_rule(*args, **kwargs):
        assert refresh_eligibility(base, {"in_stock": both[:40]}).version == 2
        return real_export(*args, **kwargs)

    def rebase_after_another(*args, **kwargs):
        if len(list_versions(base)) == 2:
            assert refresh_eligibility(base, {"in_stock": both[100:130]}).version == 3
        return real_write(*args, **kwargs)

    monkeypatch.setattr(saved_model, "export_saved_model", export_after_a_rule)
    monkeypatch.setattr(rebase, "write_with_sets", rebase_after_another)
    info = publish(swapped, base, based_on=1, **WARMUP)
    assert (info.version, info.rebased_onto) == (4, (2, 3))
    _assert_sets(info.path, new_index, {"in_stock": both[100:130], "fr": fr_before})


def _random_sets(catalogue, rng) -> EligibilitySets:
    ids = catalogue.item_ids
    return EligibilitySets.build(
        catalogue,
        {name: rng.choice(ids, rng.integers(0, len(ids)), replace=False) for name in NAMES},
    )


@pytest.mark.parametrize("seed", range(6))
def test_merged_sets_match_an_item_id_oracle(seed):
    rng = np.random.default_rng(seed)
    all_ids = rng.choice(10**9, 400, replace=False)

    def catalogue():
        ids = rng.choice(all_ids, rng.integers(1, 300), replace=False)
        return MemberCatalogue(ids, len(ids))

    read_catalogue = catalogue()
    ours_catalogue = catalogue() if seed % 2 else read_catalogue
    read = _random_sets(read_catalogue, rng)
    ours = read.carried_over(ours_catalogue)
    changed = {name for name in NAMES if rng.random() < 0.5}
    for name in changed:
        ours = ours.replace(name, rng.choice(ours_catalogue.item_ids, 5))
    newest = _random_sets(catalogue() if seed % 3 else read_catalogue, rng)
    merged, names = merged_sets(read, ours, newest)

    def items(sets, name):
        inside = sets.contains(sets.set_id(name), np.arange(sets.num_members))
        return set(sets.catalogue.item_ids[inside].tolist())

    here = set(ours_catalogue.item_ids.tolist())
    assert merged.catalogue.fingerprint == ours_catalogue.fingerprint
    for name in NAMES:
        job_changed = items(ours, name) != items(read, name) & here
        expected = items(ours, name) if job_changed else items(newest, name) & here
        assert items(merged, name) == expected
        assert (name in names) == job_changed
    with pytest.raises(PublishConflict, match="rerun the job"):
        merged_sets(read, ours, EligibilitySets.build(ours_catalogue, {"de": []}))


def test_where_the_rule_cannot_hold_a_job_refuses_or_warns(tmp_path, monkeypatch, caplog):
    from static_keras.export import version_lock

    with pytest.raises(ValueError, match="object stores have neither an atomic rename"):
        refresh_eligibility("gs://bucket/recs", {"in_stock": [1]})
    mounts = {
        "nfs": ("nfs4", ["rw", "local_lock=flock"], "/mnt/shared"),
        "gcs": ("fuse.gcsfuse", ["rw"], "/mnt/bucket"),
        "disk": ("ext4", ["rw"], "/"),
    }
    for kind, mount in mounts.items():
        monkeypatch.setattr(version_lock, "_mount_of", lambda path, mount=mount: mount)
        with caplog.at_level("WARNING", logger="static_keras.export"):
            caplog.clear()
            version_lock.check_base_path(str(tmp_path))
            version_lock.check_base_path(str(tmp_path))  # once per mount
        warned = [r.getMessage() for r in caplog.records]
        assert len(warned) == (0 if kind == "disk" else 1), warned
        if kind == "nfs":
            assert "local_lock=flock" in warned[0] and "other hosts" in warned[0]
        if kind == "gcs":
            assert "half written" in warned[0]

    def no_locks(descriptor, operation):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(version_lock.fcntl, "flock", no_locks)
    with pytest.raises(ValueError, match="this file system has no locks"):
        with version_lock.version_lock(str(tmp_path)):
            pass


def test_the_lock_is_held_by_one_job_at_a_time(tmp_path):
    """A second process waits for the lock, then times out in one line."""
    import subprocess
    import sys

    from static_keras.export.version_lock import version_lock

    script = (
        "import sys\n"
        "from static_keras.export.version_lock import version_lock, PublishConflict\n"
        "try:\n"
        f"    with version_lock({str(tmp_path)!r}, timeout_seconds=0.5):\n"
        "        print('locked')\n"
        "except PublishConflict as error:\n"
        "    print(error)\n"
    )
    with version_lock(str(tmp_path)):
        held = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert "stayed locked for 0 s" in held.stdout or "stayed locked for 1 s" in held.stdout
    free = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert free.stdout.strip() == "locked", free.stderr


@pytest.mark.slow  # about 2 minutes: a server, a client, two rules loops, two catalogue jobs
def test_soak_of_overlapping_jobs_under_a_paced_client():
    import sys

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if repo not in sys.path:
        sys.path.insert(0, repo)
    from benchmarks import overlapping_jobs

    summary = overlapping_jobs.main(["--items", "2000", "--seconds", "45", "--csv", ""])
    assert summary["failed_jobs"] == 0, summary["job_errors"]
    assert summary["catalogue_jobs"] == 2 and summary["rules_jobs"] >= 6
    assert summary["wrong_versions"] == []
    assert summary["failed_requests"] == 0 and summary["wrong_answers"] == 0
    assert summary["answers"] > 0 and len(summary["answer_versions"]) > 1
