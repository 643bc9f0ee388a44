"""String sets under real LLM tokenizers: trie automata (arXiv:2608.12574).

`StringIndex.from_strings(strings, vocabulary, eos_token_id=...)` compiles K
strings against a `TokenVocabulary` (a list of token bytes, a Hugging Face
`tokenizer.json`, a GGUF file or a `.tiktoken` file); `beam_search`,
`ConstrainedBeamSearch` and SavedModel export take the index like a
`StaticIndex` (both are `TokenAutomaton`s), through its
`StringConstrainedDecoding` layer (`static_keras.constraint_for(index)`);
`StringLogitsProcessor` serves any other decode
loop, and `TransformersLogitsProcessor` Hugging Face `generate()` (torch is
imported on its first call, never by this package). The host-side modules
(vocabulary, tries, builder, layout, index, logits processor) import no
deep-learning backend:
NumPy, plus the compiler's loops (`kernels`, a Cython extension built at
install). The names load on first use, so `from static_keras.strings import
StringIndex` imports neither Keras nor TensorFlow; the layer module imports
Keras and registers the layer for `.keras` loading.
"""

from static_keras.lazy_names import lazy_names

_LAZY = {
    "StringConstrainedDecoding": "static_keras.strings.string_constrained_decoding",
    "StringIndex": "static_keras.strings.string_index",
    "StringIndexLayout": "static_keras.strings.layout",
    "StringLogitsProcessor": "static_keras.strings.logits_processor",
    "TokenVocabulary": "static_keras.strings.vocabulary",
    "TransformersLogitsProcessor": "static_keras.strings.transformers_processor",
}

__all__ = sorted(_LAZY)


__getattr__, __dir__ = lazy_names(__name__, _LAZY)
