"""The offline side imports no deep-learning backend; layers load for `.keras`.

Checked in fresh interpreters through `sys.modules` (what a user's process
actually loads), not by reading import statements.
"""

import json
import subprocess
import sys

import pytest

_BACKENDS = ("keras", "tensorflow", "jax", "torch")

# Index building, the string compiler and the host-side string processor.
_HOST_SIDE = [
    "static_keras",
    "static_keras.constants",
    "static_keras.index",
    "static_keras.index.archive",
    "static_keras.index.automaton",
    "static_keras.index.builder",
    "static_keras.index.static_index",
    "static_keras.index.semantic_ids",
    "static_keras.strings",
    "static_keras.strings.kernels",
    "static_keras.strings.vocabulary",
    "static_keras.strings.builder",
    "static_keras.strings.string_index",
    "static_keras.strings.logits_processor",
]


def _loaded_after(code: str) -> list[str]:
    listing = "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    probe = f"{code}\nimport json, sys\n{listing}"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("module", _HOST_SIDE)
def test_host_side_module_loads_no_backend(module):
    loaded = _loaded_after(f"import {module}")
    assert not set(loaded) & set(_BACKENDS), (module, set(loaded) & set(_BACKENDS))


def test_top_level_names_and_string_compile_load_no_backend():
    code = (
        "from static_keras import StaticIndex, StringIndex, StringLogitsProcessor\n"
        "from static_keras import TokenVocabulary\n"
        "import numpy as np\n"
        "StaticIndex.build(np.array([[1, 2], [3, 4]]), vocab_size=8)\n"
        "vocab = TokenVocabulary.from_token_bytes([b'a', b'b', b'ab', b'<e>'], special=[3])\n"
        "index = StringIndex.from_strings(['ab', 'ba'], vocab, eos_token_id=3)\n"
        "StringLogitsProcessor(index).mask_logits(np.zeros((1, 4)), np.zeros(1, np.int32))\n"
        "import os, tempfile\n"
        "path = os.path.join(tempfile.mkdtemp(), 'strings.npz')\n"
        "index.save(path)\n"
        "from static_keras.index import archive\n"
        "assert type(archive.load(path)).__name__ == 'StringIndex'"
    )
    assert not set(_loaded_after(code)) & set(_BACKENDS)


def test_every_top_level_name_resolves():
    import static_keras

    for name in static_keras.__all__:
        assert getattr(static_keras, name) is not None, name


def test_unknown_top_level_name_is_an_attribute_error():
    import static_keras

    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        static_keras.Nope  # noqa: B018
    assert "ConstrainedBeamSearch" in dir(static_keras)


@pytest.mark.slow  # a fresh process, 24 s: in-process load tests run by default
def test_saving_load_model_registers_the_layers_in_a_fresh_process(tmp_path):
    import keras
    import numpy as np

    from static_keras import ConstrainedBeamSearch
    from static_keras import StringIndex
    from static_keras import TokenVocabulary
    from static_keras.layers.cached_transformer_decoder import CachedTransformerDecoder

    vocab = TokenVocabulary.from_token_bytes([b"a", b"b", b"ab", b"<e>"], special=[3])
    index = StringIndex.from_strings(["ab", "ba"], vocab, eos_token_id=3)
    decoder = CachedTransformerDecoder(4, index.length, context_vocab_size=5, hidden_dim=8)
    context = keras.Input((3,), dtype="int32")
    model = keras.Model(context, ConstrainedBeamSearch(index, decoder, beam_size=2)(context))
    path = tmp_path / "strings.keras"
    model.save(path)
    expected = model.predict(np.array([[1, 2, 3]], "int32"), verbose=0)["tokens"]
    code = (
        "import numpy as np, static_keras.saving\n"
        f"model = static_keras.saving.load_model({str(path)!r})\n"
        "out = model.predict(np.array([[1, 2, 3]], 'int32'), verbose=0)['tokens']\n"
        "print(out.tolist())"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == expected.tolist()
