"""The Python API prints nothing of TensorFlow's harmless start-up and saving
notes where static-keras is what loads TensorFlow, keeps real errors, and
leaves a user's logging as the user set it."""

import logging
import os
import subprocess
import sys
import textwrap

from static_keras import tensorflow_log_lines

# What TensorFlow printed before: import notes, the CUDA probe on a machine
# without a GPU, the saver's INFO lines, the TFRecord reader's buffer note.
_NOISE = (
    "absl::InitializeLog",
    "oneDNN",
    "cuda drivers",
    "cpu_feature_guard",
    "cuInit",
    "Assets written to",
    "contains input name",
    "buffer_size",
    "buffer size",
)


def test_build_decode_and_publish_print_no_tensorflow_notes(tmp_path):
    # A user's script with INFO logging on (where the saver's lines showed,
    # each twice with absl's handler too); static-keras is what imports Keras.
    script = textwrap.dedent(
        """
        import logging
        logging.basicConfig(level=logging.INFO)
        import numpy as np
        from static_keras import StaticIndex, ConstrainedBeamSearch, CachedTransformerDecoder
        rng = np.random.default_rng(0)
        index = StaticIndex.build(rng.integers(0, 16, (300, 3)), vocab_size=16)
        import keras
        decoder = CachedTransformerDecoder(vocab_size=16, length=3, context_vocab_size=301,
                                           hidden_dim=16, num_heads=2, num_layers=1)
        history = keras.Input((5,), dtype="int32", name="history")
        model = keras.Model(history, ConstrainedBeamSearch(index, decoder, beam_size=4)(history))
        model.predict(np.ones((2, 5), "int32"), verbose=0)
        from static_keras.export import publish
        publish(model, "models/recs")
        print("published", logging.getLogger("tensorflow").filters, logging.root.level)
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # The user's logging is as they set it: no filter left behind, root at INFO.
    assert "published [] 20" in done.stdout
    noise = [line for line in done.stderr.splitlines() if any(n in line for n in _NOISE)]
    assert noise == [], noise


def test_filtered_start_up_keeps_every_line_it_does_not_know(capfd):
    with tensorflow_log_lines.startup_lines_filtered():
        banner = b"All log messages before absl::InitializeLog() is called are written to STDERR"
        os.write(2, b"WARNING: " + banner + b"\n")
        os.write(2, b"I0000 00:00:1.0 port.cc:153] oneDNN custom operations are on.\n")
        os.write(2, b"E0000 00:00:1.0 some_op.cc:10] a real error\n")
        print("a Python warning", file=sys.stderr)
    err = capfd.readouterr().err
    # (pytest's sys.stderr is not file descriptor 2, so the order may differ here)
    assert sorted(err.splitlines()) == [
        "E0000 00:00:1.0 some_op.cc:10] a real error",
        "a Python warning",
    ]


def test_cuinit_failure_is_harmless_only_without_an_nvidia_device(monkeypatch):
    line = "E0000 00:00:1.0 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error\n"
    monkeypatch.setattr(tensorflow_log_lines.glob, "glob", lambda pattern: [])
    assert tensorflow_log_lines.harmless(line)
    monkeypatch.setattr(tensorflow_log_lines.glob, "glob", lambda pattern: ["/dev/nvidia0"])
    assert not tensorflow_log_lines.harmless(line)


def test_saving_notes_are_hidden_only_inside_the_block(caplog):
    logger = logging.getLogger("tensorflow")
    filters = list(logger.filters)
    with caplog.at_level(logging.INFO, logger="tensorflow"):
        with tensorflow_log_lines.notes_hidden():
            logger.info("Assets written to: somewhere")
            logger.warning("a real warning")
        logger.info("after the block")
    assert [r.getMessage() for r in caplog.records] == ["a real warning", "after the block"]
    assert logger.filters == filters
