"""A small causal LM plus a string index as one SavedModel: served answers are members."""

import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

pytest.importorskip("tokenizers", reason="vocabularies are trained with `tokenizers` in the tests")
from string_oracles import byte_level_vocabulary

from static_keras import CachedTransformerDecoder
from static_keras import ConstrainedBeamSearch
from static_keras.strings import StringIndex

MEMBERS = ["search", "get_weather", "get_weather_forecast", "東京都", "🍕🍕", "Home > Kitchen"]
PROMPT = 6

_FRESH_PROCESS = textwrap.dedent(
    """
    import sys, numpy as np, tensorflow as tf
    path, inputs, out = sys.argv[1:4]
    serve = tf.saved_model.load(path).signatures["serving_default"]
    data = np.load(inputs)
    results = {}
    for batch in ("b1", "b5"):
        for name, value in serve(prompt=tf.constant(data[batch])).items():
            results[f"{batch}_{name}"] = value.numpy()
    assert not any(m.startswith("static_keras") for m in sys.modules), "imported"
    np.savez(out, **results)
    """
)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from static_keras.export import export_saved_model

    vocab = byte_level_vocabulary()
    index = StringIndex.from_strings(MEMBERS, vocab, eos_token_id=vocab.eos_token_id, max_length=9)
    keras.utils.set_random_seed(0)
    decoder = CachedTransformerDecoder(
        index.vocab_size, index.length, context_vocab_size=index.vocab_size, hidden_dim=16
    )
    prompt = keras.Input((PROMPT,), dtype="int32", name="prompt")
    model = keras.Model(prompt, ConstrainedBeamSearch(index, decoder, beam_size=4)(prompt))
    path = tmp_path_factory.mktemp("export") / "1"
    info = export_saved_model(model, path, warmup_batch_sizes=(1, 5))
    return vocab, index, model, path, info


@pytest.mark.slow  # a served model in a fresh process: 18 s on 2 cores
def test_served_answers_are_members_in_a_fresh_process(exported, tmp_path):
    vocab, index, model, path, info = exported
    assert info.input_names == ("prompt",)
    assert info.output_names == ("item_ids", "scores", "tokens")
    rng = np.random.default_rng(0)
    batches = {
        b: rng.integers(1, vocab.vocab_size, (int(b[1:]), PROMPT)).astype("int32")
        for b in ("b1", "b5")
    }
    np.savez(tmp_path / "inputs.npz", **batches)
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            _FRESH_PROCESS,
            str(path),
            str(tmp_path / "inputs.npz"),
            str(tmp_path / "out.npz"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    served = np.load(tmp_path / "out.npz")
    answered = 0
    for batch, prompts in batches.items():
        expected = model.predict(prompts, verbose=0)
        for name in ("tokens", "item_ids"):
            np.testing.assert_array_equal(served[f"{batch}_{name}"], expected[name])
        # `predict` may compile with XLA, the served graph does not: the
        # log-softmax's sum of exponentials is added in another order.
        np.testing.assert_allclose(served[f"{batch}_scores"], expected["scores"], rtol=1e-6)
        tokens, items = served[f"{batch}_tokens"], served[f"{batch}_item_ids"]
        for row, item in zip(tokens.reshape(-1, index.length), items.ravel()):
            if item < 0:
                assert np.all(row == -1)
                continue
            answered += 1
            assert vocab.decode(row).decode() == MEMBERS[item]
    assert answered > 0


def test_saved_model_passes_the_serving_lint(exported):
    from static_keras.export import check_saved_model

    _, _, model, path, info = exported
    report = check_saved_model(path)
    assert report.xla_functions == ()
    assert report.num_variables == len(model.variables) == info.num_variables


def test_index_only_refresh_to_a_new_string_set(exported):
    from static_keras.export import replace_index

    vocab, index, model, _, _ = exported
    fresh = ["Café crème", "東京タワー", "search"]
    new_index = StringIndex.from_strings(fresh, vocab, max_length=index.length)
    refreshed = replace_index(model, new_index)
    prompts = np.random.default_rng(1).integers(1, vocab.vocab_size, (2, PROMPT)).astype("int32")
    out = refreshed.predict(prompts, verbose=0)
    assert (out["item_ids"] >= 0).any()
    for row, item in zip(out["tokens"].reshape(-1, index.length), out["item_ids"].ravel()):
        if item >= 0:
            assert vocab.decode(row).decode() == fresh[item]
    # The decoder weights are shared, not copied.
    assert refreshed.layers[-1].decoder is model.layers[-1].decoder
