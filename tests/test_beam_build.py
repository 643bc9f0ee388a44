"""The Beam-built index equals `StaticIndex.build`, array for array.

Every test writes shards (Parquet, TFRecord, CSV) to a temporary folder,
builds with `build_index_beam` on Beam's direct runner (in-process unless
said otherwise), and compares layout and arrays with `StaticIndex.build` on
the same rows concatenated in sorted path order: over random sets, every
dense depth, several partition depths, duplicates, item ids with each
duplicate policy, one-row and one-partition inputs, many small files. Bad
rows must fail with their file and row and write nothing; a pipeline that
dies must leave no index that loads.
"""

from __future__ import annotations

import gzip
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

beam = pytest.importorskip(
    "apache_beam", reason="apache-beam is not installed (pip install 'static-keras[beam]')"
)
pa = pytest.importorskip("pyarrow", reason="pyarrow is not installed")

import pyarrow.parquet as parquet  # noqa: E402

from static_keras import cli  # noqa: E402
from static_keras.index import StaticIndex  # noqa: E402
from static_keras.index.beam_build import PipelineFailed  # noqa: E402
from static_keras.index.beam_build import build_index_beam  # noqa: E402
from static_keras.index.beam_build import partitions  # noqa: E402
from static_keras.index.beam_build.tfrecord import example_class  # noqa: E402

# ----------------------------------------------------------------------------
# Shards and the comparison
# ----------------------------------------------------------------------------


def write_parquet(folder, rows, item_ids=None, files=3, list_column=False, prefix="ids"):
    os.makedirs(folder, exist_ok=True)
    for i, part in enumerate(np.array_split(np.arange(len(rows)), files)):
        if list_column:
            columns = {"semantic_id": pa.array(rows[part].tolist(), pa.list_(pa.int64()))}
        else:
            columns = {f"t{t}": rows[part, t] for t in range(rows.shape[1])}
        if item_ids is not None:
            columns["item_id"] = item_ids[part]
        parquet.write_table(pa.table(columns), os.path.join(folder, f"{prefix}-{i:03d}.parquet"))
    return os.path.join(folder, f"{prefix}-*.parquet")


def write_csv(folder, rows, item_ids=None, files=3, compress=False):
    os.makedirs(folder, exist_ok=True)
    for i, part in enumerate(np.array_split(np.arange(len(rows)), files)):
        table = rows[part] if item_ids is None else np.column_stack([rows[part], item_ids[part]])
        text = "".join(",".join(map(str, row)) + "\n" for row in table.tolist())
        name = os.path.join(folder, f"ids-{i:03d}.csv")
        if compress:
            with gzip.open(name + ".gz", "wt") as file:
                file.write(text)
        else:
            with open(name, "w") as file:
                file.write(text)
    return os.path.join(folder, "ids-*.csv" + (".gz" if compress else ""))


def write_tfrecord(folder, rows, item_ids=None, files=3):
    import tensorflow as tf

    os.makedirs(folder, exist_ok=True)
    for i, part in enumerate(np.array_split(np.arange(len(rows)), files)):
        with tf.io.TFRecordWriter(os.path.join(folder, f"ids-{i:03d}.tfrecord")) as writer:
            for r in part.tolist():
                feature = {"semantic_id": _int64s(tf, rows[r].tolist())}
                if item_ids is not None:
                    feature["item_id"] = _int64s(tf, [int(item_ids[r])])
                example = tf.train.Example(features=tf.train.Features(feature=feature))
                writer.write(example.SerializeToString())
    return os.path.join(folder, "ids-*.tfrecord")


def _int64s(tf, values):
    return tf.train.Feature(int64_list=tf.train.Int64List(value=values))


def assert_same_index(built: StaticIndex, expected: StaticIndex) -> None:
    assert built.layout == expected.layout
    assert set(built.arrays) == set(expected.arrays)
    for name, array in expected.arrays.items():
        other = built.arrays[name]
        assert other.dtype == array.dtype and other.shape == array.shape, name
        np.testing.assert_array_equal(other, array, err_msg=name)


def build_and_compare(tmp_path, sources, rows, vocab, item_ids=None, **options):
    out = tmp_path / "index.npz"
    built = build_index_beam(
        sources, vocab, out, item_id_field="item_id" if item_ids is not None else None, **options
    )
    for beam_only in ("partition_levels", "input_format", "pipeline_options", "shuffle"):
        options.pop(beam_only, None)
    expected = StaticIndex.build(rows, vocab, item_ids=item_ids, **options)
    assert_same_index(built, expected)
    loaded = StaticIndex.load(out)
    assert_same_index(loaded, expected)
    assert loaded.checksum == expected.checksum
    assert sorted(os.listdir(tmp_path)) == sorted(
        {"index.npz"} | {p.name for p in tmp_path.iterdir() if p.is_dir()}
    ), "staging files were left behind"
    return built


def random_rows(seed, n, vocab, length, duplicates=0):
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, vocab, size=(n, length))
    if duplicates:
        rows = np.concatenate([rows, rows[rng.integers(0, n, duplicates)]])
        rows = rows[rng.permutation(len(rows))]
    return rows


# ----------------------------------------------------------------------------
# Equality with StaticIndex.build
# ----------------------------------------------------------------------------


# Rows through Beam's shuffle, or staged blocks and references to them.
SHUFFLES = ["rows", "staged"]


@pytest.mark.parametrize("shuffle", SHUFFLES)
@pytest.mark.parametrize("dense_levels", [0, 1, 2, 3, 4])
def test_every_dense_depth_matches_the_in_process_build(tmp_path, dense_levels, shuffle):
    rows = random_rows(dense_levels, 600, vocab=6, length=4, duplicates=80)
    sources = write_parquet(tmp_path / "in", rows)
    build_and_compare(
        tmp_path, sources, rows, 6, dense_levels=dense_levels, partition_levels=1,
        shuffle=shuffle,
    )  # fmt: skip


@pytest.mark.parametrize(
    "partition_levels,dense_levels", [(2, 0), (3, 1), (3, 3), (4, 2), (4, "auto")]
)
def test_partition_depths_below_at_and_above_the_dense_head(
    tmp_path, partition_levels, dense_levels
):
    # V = 4: at most 4**p partitions, so every level and split stays small.
    rows = random_rows(10 + partition_levels, 500, vocab=4, length=4, duplicates=50)
    sources = write_parquet(tmp_path / "in", rows, files=4)
    build_and_compare(
        tmp_path, sources, rows, 4, dense_levels=dense_levels, partition_levels=partition_levels
    )


def test_auto_dense_levels_and_auto_partitions_with_uint16_tokens(tmp_path):
    rows = random_rows(3, 3000, vocab=300, length=3, duplicates=200)
    sources = write_parquet(tmp_path / "in", rows, files=5)
    built = build_and_compare(tmp_path, sources, rows, 300)
    assert built.arrays["tokens"].dtype == np.uint16
    assert built.dense_levels == StaticIndex.build(rows, 300).dense_levels


@pytest.mark.parametrize("shuffle", SHUFFLES)
@pytest.mark.parametrize("policy", ["error", "first", "last"])
def test_item_ids_follow_each_duplicate_policy_in_file_order(tmp_path, policy, shuffle):
    rows = random_rows(4, 300, vocab=5, length=3, duplicates=150)
    # Duplicate rows keep one id under "error"; they differ under first/last.
    if policy == "error":
        _, first = np.unique(rows, axis=0, return_inverse=True)
        item_ids = 1000 + first.reshape(-1)
    else:
        item_ids = np.arange(len(rows)) * 7
    sources = write_parquet(tmp_path / "in", rows, item_ids, files=6)
    build_and_compare(
        tmp_path, sources, rows, 5, item_ids=item_ids, on_duplicate_item=policy,
        partition_levels=1, shuffle=shuffle,
    )  # fmt: skip


def test_two_ids_of_one_semantic_id_fail_like_the_in_process_build(tmp_path):
    rows = random_rows(5, 200, vocab=5, length=3, duplicates=40)
    item_ids = np.arange(len(rows))
    sources = write_parquet(tmp_path / "in", rows, item_ids, files=4)
    with pytest.raises(ValueError) as expected:
        StaticIndex.build(rows, 5, item_ids=item_ids)
    with pytest.raises(ValueError) as raised:
        build_index_beam(sources, 5, tmp_path / "index.npz", item_id_field="item_id")
    assert str(raised.value).startswith(str(expected.value))
    assert not (tmp_path / "index.npz").exists()


def test_one_row(tmp_path):
    rows = np.array([[3, 1, 4, 1]])
    sources = write_parquet(tmp_path / "in", rows, np.array([42]), files=1)
    build_and_compare(tmp_path, sources, rows, 8, item_ids=np.array([42]))


def test_one_partition_every_row_shares_the_key(tmp_path):
    rows = random_rows(6, 400, vocab=7, length=4, duplicates=30)
    rows[:, :2] = [5, 2]
    sources = write_parquet(tmp_path / "in", rows, files=3)
    for d in (1, 3):
        build_and_compare(tmp_path, sources, rows, 7, dense_levels=d, partition_levels=2)


def test_many_small_files_and_an_empty_one(tmp_path):
    rows = random_rows(7, 500, vocab=9, length=3, duplicates=60)
    item_ids = np.arange(len(rows)) + 10
    sources = write_parquet(tmp_path / "in", rows, item_ids, files=40)
    empty = pa.table({name: pa.array([], pa.int64()) for name in ("t0", "t1", "t2", "item_id")})
    parquet.write_table(empty, tmp_path / "in" / "ids-000-empty.parquet")
    build_and_compare(
        tmp_path, sources, rows, 9, item_ids=item_ids, on_duplicate_item="last",
        partition_levels=1,
    )  # fmt: skip


def test_parquet_list_column(tmp_path):
    rows = random_rows(8, 300, vocab=10, length=5)
    sources = write_parquet(tmp_path / "in", rows, files=2, list_column=True)
    build_and_compare(tmp_path, sources, rows, 10, partition_levels=1)


def test_tfrecord_examples_written_by_tensorflow(tmp_path):
    rows = random_rows(9, 300, vocab=12, length=4, duplicates=30)
    item_ids = np.arange(len(rows)) + 5
    sources = write_tfrecord(tmp_path / "in", rows, item_ids)
    build_and_compare(
        tmp_path, sources, rows, 12, item_ids=item_ids, on_duplicate_item="first",
        partition_levels=1,
    )  # fmt: skip


@pytest.mark.parametrize("compress", [False, True])
def test_csv_with_item_ids_in_the_last_column(tmp_path, compress):
    rows = random_rows(10, 300, vocab=11, length=3, duplicates=40)
    item_ids = np.arange(len(rows)) * 3
    sources = write_csv(tmp_path / "in", rows, item_ids, compress=compress)
    build_and_compare(
        tmp_path, sources, rows, 11, item_ids=item_ids, on_duplicate_item="last",
        partition_levels=1,
    )  # fmt: skip


def test_multi_processing_runner_with_two_workers(tmp_path):
    rows = random_rows(11, 2000, vocab=16, length=4, duplicates=100)
    sources = write_parquet(tmp_path / "in", rows, files=4)
    options = ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]
    build_and_compare(tmp_path, sources, rows, 16, partition_levels=1, pipeline_options=options)


def test_auto_shuffle_stages_on_the_direct_runner_only():
    from apache_beam.options.pipeline_options import PipelineOptions

    from static_keras.index.beam_build.pipeline import _choose_shuffle

    assert _choose_shuffle("auto", PipelineOptions([])) == "staged"
    assert _choose_shuffle("auto", PipelineOptions(["--runner=DirectRunner"])) == "staged"
    assert _choose_shuffle("auto", PipelineOptions(["--runner=DataflowRunner"])) == "rows"
    assert _choose_shuffle("rows", PipelineOptions([])) == "rows"
    with pytest.raises(ValueError, match="`shuffle` must be"):
        _choose_shuffle("disk", PipelineOptions([]))


def test_example_class_reads_tensorflow_examples():
    import tensorflow as tf

    example = tf.train.Example(
        features=tf.train.Features(feature={"semantic_id": _int64s(tf, [1, 2, 3])})
    )
    parsed = example_class().FromString(example.SerializeToString())
    assert list(parsed.features.feature["semantic_id"].int64_list.value) == [1, 2, 3]


@pytest.mark.parametrize("policy", ["first", "last"])
def test_a_partition_restores_input_order_whatever_order_its_chunks_arrive_in(policy):
    # A runner may hand a partition its chunks in any order.
    rows = random_rows(23, 400, vocab=4, length=4, duplicates=300)
    rows[:, 0] = 3
    item_ids = np.arange(len(rows)) * 11
    order = np.arange(len(rows)) + (7 << partitions.ROW_BITS)
    bounds = [0, 50, 170, 171, 320, len(rows)]
    chunks = [(rows[a:b], item_ids[a:b], order[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
    tail = partitions.build_tail(chunks[::-1], 4, 1, policy)
    expected = StaticIndex.build(rows, 4, item_ids=item_ids, on_duplicate_item=policy)
    np.testing.assert_array_equal(tail["leaf_item_ids"], expected.arrays["leaf_item_ids"])


def test_partition_keys_round_trip():
    rows = random_rows(12, 50, vocab=2048, length=8)
    keys = partitions.partition_keys(rows, 2048, 3)
    np.testing.assert_array_equal(partitions.key_rows(keys, 2048, 3), rows[:, :3])


# ----------------------------------------------------------------------------
# Bad input: the file and row, and nothing written
# ----------------------------------------------------------------------------


def _bad_parquet_token(folder):
    rows = random_rows(13, 100, vocab=8, length=3)
    rows[57, 2] = 8
    write_parquet(folder, rows, files=2)  # row 57 is row 7 of the second file
    return (
        os.path.join(folder, "*.parquet"),
        "ids-001.parquet",
        r"holds token 8 \(row 7, position 2\)",
    )


def _bad_csv_length(folder):
    write_csv(folder, random_rows(14, 40, vocab=8, length=3), files=1)
    path = os.path.join(folder, "ids-000.csv")
    lines = pathlib.Path(path).read_text().splitlines()
    lines[12] += ",5"
    pathlib.Path(path).write_text("\n".join(lines) + "\n")
    return os.path.join(folder, "*.csv"), "ids-000.csv", r"ragged.*row 12, line 13 has 4 tokens"


def _bad_csv_value(folder):
    write_csv(folder, random_rows(15, 40, vocab=8, length=3), files=2)
    path = os.path.join(folder, "ids-001.csv")
    lines = pathlib.Path(path).read_text().splitlines()
    lines[3] = "1,2.5,3"
    pathlib.Path(path).write_text("\n".join(lines) + "\n")
    return (
        os.path.join(folder, "*.csv"),
        "ids-001.csv",
        r"must hold integers. Received '2.5' \(row 3",
    )


def _bad_parquet_float(folder):
    os.makedirs(folder)
    table = pa.table({"t0": [1, 2], "t1": [0.5, 1.0]})
    parquet.write_table(table, os.path.join(folder, "ids-000.parquet"))
    return os.path.join(folder, "*.parquet"), "ids-000.parquet", r"must hold integers.*'t1'"


def _bad_tfrecord_length(folder):
    rows = random_rows(16, 30, vocab=8, length=3)
    write_tfrecord(folder, rows, files=1)
    example = example_class()()
    example.features.feature["semantic_id"].int64_list.value.extend([1, 2])
    import tensorflow as tf

    with tf.io.TFRecordWriter(os.path.join(folder, "ids-001.tfrecord")) as writer:
        writer.write(example_class()().SerializeToString())  # row 0: no feature
    with tf.io.TFRecordWriter(os.path.join(folder, "ids-000.tfrecord")) as writer:
        for row in rows.tolist()[:5]:
            good = example_class()()
            good.features.feature["semantic_id"].int64_list.value.extend(row)
            writer.write(good.SerializeToString())
        writer.write(example.SerializeToString())  # row 5: two tokens
    return os.path.join(folder, "*.tfrecord"), "ids-000.tfrecord", r"row 5 has 2 tokens, expected 3"


@pytest.mark.parametrize(
    "make",
    [_bad_parquet_token, _bad_csv_length, _bad_csv_value, _bad_parquet_float, _bad_tfrecord_length],
)
def test_bad_rows_name_file_and_row_and_write_nothing(tmp_path, make):
    sources, name, pattern = make(str(tmp_path / "in"))
    with pytest.raises(ValueError, match=pattern) as raised:
        build_index_beam(sources, 8, tmp_path / "index.npz", partition_levels=1)
    assert name in str(raised.value)
    assert os.listdir(tmp_path) == ["in"], "an index or staging files were written"


def test_negative_item_id_names_its_row(tmp_path):
    rows = random_rows(17, 20, vocab=8, length=2)
    item_ids = np.arange(20)
    item_ids[13] = -3
    sources = write_parquet(tmp_path / "in", rows, item_ids, files=1)
    match = r"ids-000.parquet: `item_ids` must be non-negative .*Received -3 \(row 13\)"
    with pytest.raises(ValueError, match=match):
        build_index_beam(sources, 8, tmp_path / "index.npz", item_id_field="item_id")


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"on_duplicate_item": "any"}, "on_duplicate_item"),
        ({"dense_levels": 9}, r"must lie in \[0, length=3\]"),
        ({"partition_levels": 0}, r"partition_levels` must lie in \[1, length=3\]"),
        ({"sources": "nothing-*.parquet"}, "No input file matches"),
    ],
)
def test_bad_options_fail_before_the_pipeline(tmp_path, kwargs, match):
    sources = write_parquet(tmp_path / "in", random_rows(18, 20, vocab=8, length=3), files=1)
    kwargs = {"sources": sources, **kwargs}
    with pytest.raises(ValueError, match=match):
        build_index_beam(vocab_size=8, out=tmp_path / "index.npz", **kwargs)


# ----------------------------------------------------------------------------
# Failures: no index that loads, and what failed
# ----------------------------------------------------------------------------


def test_failed_pipeline_names_the_step_and_keeps_the_old_index(tmp_path, monkeypatch):
    rows = random_rows(19, 100, vocab=8, length=3)
    sources = write_parquet(tmp_path / "in", rows, files=2)
    old = StaticIndex.build([[1, 2, 3]], 8)
    old.save(tmp_path / "index.npz")

    def broken(*args, **kwargs):
        raise MemoryError("worker ran out of memory")

    monkeypatch.setattr(partitions, "build_tail", broken)
    with pytest.raises(PipelineFailed, match=r"BuildTails.*MemoryError.*out of memory"):
        build_index_beam(sources, 8, tmp_path / "index.npz", partition_levels=1)
    assert StaticIndex.load(tmp_path / "index.npz").checksum == old.checksum
    assert sorted(os.listdir(tmp_path)) == ["in", "index.npz"]


def test_a_lost_partition_fails_the_build(tmp_path, monkeypatch):
    from static_keras.index.beam_build import transforms

    rows = random_rows(24, 200, vocab=8, length=3)
    sources = write_parquet(tmp_path / "in", rows, files=2)
    process = transforms.BuildTail.process

    def loses_key_zero(self, element):
        if element[0] != 0:
            yield from process(self, element)

    monkeypatch.setattr(transforms.BuildTail, "process", loses_key_zero)
    with pytest.raises(PipelineFailed, match=r"read 200 rows but its partitions hold 1\d\d"):
        build_index_beam(sources, 8, tmp_path / "index.npz", partition_levels=1)
    assert os.listdir(tmp_path) == ["in"]


@pytest.mark.slow
def test_a_worker_killed_mid_pipeline_gives_the_right_index_or_none(tmp_path):
    # 2048 partitions: building them takes seconds, so the kill lands mid-way.
    rows = random_rows(25, 1_000_000, vocab=2048, length=4)
    sources = write_parquet(tmp_path / "in", rows, files=8)
    script = textwrap.dedent(
        f"""
        import psutil
        from static_keras.index.beam_build import PipelineFailed, build_index_beam

        killed = []

        def progress(stage, fraction):
            if stage.startswith("partitions") and not killed:
                for child in psutil.Process().children(recursive=True):
                    if "sdk_worker_main" in " ".join(child.cmdline()):
                        child.kill()
                        killed.append(child.pid)
                        break

        try:
            build_index_beam({sources!r}, 2048, {str(tmp_path / "index.npz")!r}, progress=progress,
                             pipeline_options=["--direct_num_workers=2",
                                               "--direct_running_mode=multi_processing"])
            print("built", len(killed))
        except PipelineFailed as error:
            print("failed", len(killed), error)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    outcome = done.stdout.strip().splitlines()[-1]
    assert outcome.split()[1] == "1", f"no worker was killed: {outcome}"
    if outcome.startswith("built"):
        expected = StaticIndex.build(rows, 2048)
        assert_same_index(StaticIndex.load(tmp_path / "index.npz"), expected)
    else:
        assert outcome.startswith("failed") and not (tmp_path / "index.npz").exists()


@pytest.mark.parametrize("stage", ["partitions", "merging", "writing"])
def test_killed_build_leaves_no_index_that_loads(tmp_path, stage):
    rows = random_rows(20, 300, vocab=8, length=3)
    sources = write_parquet(tmp_path / "in", rows, files=3)
    script = textwrap.dedent(
        f"""
        import os, signal
        from static_keras.index.beam_build import build_index_beam

        def progress(name, fraction):
            if name.startswith({stage!r}):
                os.kill(os.getpid(), signal.SIGKILL)

        build_index_beam({sources!r}, 8, {str(tmp_path / "index.npz")!r},
                         partition_levels=1, progress=progress)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=300)
    assert done.returncode == -9, done.stderr.decode()[-2000:]
    assert not (tmp_path / "index.npz").exists()
    with pytest.raises(FileNotFoundError):
        StaticIndex.load(tmp_path / "index.npz")


# ----------------------------------------------------------------------------
# The command line and the imports
# ----------------------------------------------------------------------------


def test_cli_runner_beam_writes_the_same_index(tmp_path, capsys):
    rows = random_rows(21, 400, vocab=32, length=4, duplicates=20)
    item_ids = np.arange(len(rows))
    sources = write_parquet(tmp_path / "in", rows, item_ids, files=3)
    out = tmp_path / "index.npz"
    code = cli.main(
        ["build-index", sources, "--vocab-size", "32", "--out", str(out), "--runner", "beam",
         "--item-id-field", "item_id", "--on-duplicate-item", "first", "--progress",
         "--beam-option=--direct_num_workers=1"]
    )  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "built with Apache Beam" in captured.out and "merging" in captured.err
    expected = StaticIndex.build(rows, 32, item_ids=item_ids, on_duplicate_item="first")
    assert_same_index(StaticIndex.load(out), expected)


def test_cli_runner_beam_bad_row_is_one_line(tmp_path, capsys):
    sources, name, _ = _bad_parquet_token(str(tmp_path / "in"))
    out = tmp_path / "index.npz"
    code = cli.main(
        ["build-index", sources, "--vocab-size", "8", "--out", str(out), "--runner", "beam"]
    )
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2 and name in err and "row 7, position 2" in err, err
    assert not out.exists()


def test_cli_beam_flags_need_the_beam_runner(tmp_path, capsys):
    np.save(tmp_path / "ids.npy", random_rows(22, 10, vocab=8, length=2))
    code = cli.main(
        ["build-index", str(tmp_path / "ids.npy"), "--vocab-size", "8", "--out",
         str(tmp_path / "x.npz"), "--item-id-field", "item_id"]
    )  # fmt: skip
    assert code == 2 and "--item-id-field needs --runner beam" in capsys.readouterr().err


def test_beam_build_loads_no_backend():
    code = (
        "import sys, static_keras.index.beam_build\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'keras', 'tensorflow', 'jax', 'torch'}))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
