"""String sets under real LLM tokenizers: trie automata (arXiv:2608.12574).

`StringIndex.from_strings(strings, vocabulary, eos_token_id=...)` compiles K
strings against a `TokenVocabulary` (a list of token bytes, a Hugging Face
`tokenizer.json`, a GGUF file or a `.tiktoken` file); `beam_search`,
`ConstrainedBeamSearch` and SavedModel export take the index like a
`StaticIndex`, through its `StringConstrainedDecoding` layer
(`index.constraint_layer()`); `StringLogitsProcessor` serves any other decode
loop. The host-side modules (vocabulary, tries, builder, layout,
serialization, index, logits processor) import no deep-learning backend:
NumPy, plus the compiler's loops (`kernels`, a Cython extension built at
install). The names load on first use, so `from static_keras.strings import
StringIndex` imports neither Keras nor TensorFlow; the layer module imports
Keras and registers the layer for `.keras` loading.
"""

import importlib

_LAZY = {
    "StringConstrainedDecoding": "static_keras.strings.string_constrained_decoding",
    "StringIndex": "static_keras.strings.string_index",
    "StringIndexLayout": "static_keras.strings.layout",
    "StringLogitsProcessor": "static_keras.strings.logits_processor",
    "TokenVocabulary": "static_keras.strings.vocabulary",
}

__all__ = sorted(_LAZY)


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'static_keras.strings' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
