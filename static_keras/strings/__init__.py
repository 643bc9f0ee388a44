"""String sets under real LLM tokenizers: trie automata (arXiv:2608.12574).

`StringIndex.from_strings(strings, vocabulary, eos_token_id=...)` compiles K
strings against a `TokenVocabulary` (a list of token bytes, a Hugging Face
`tokenizer.json`, a GGUF file or a `.tiktoken` file); `beam_search`,
`ConstrainedBeamSearch` and SavedModel export take the index like a
`StaticIndex`, through its `StringConstrainedDecoding` layer
(`index.constraint_layer()`); `StringLogitsProcessor` serves any other decode
loop. The host-side modules (vocabulary, tries, builder, layout,
serialization, index) import no deep-learning backend: NumPy, plus Numba for
the compiler's loops (`kernels`); the layer module imports Keras, and
importing this package registers it for `.keras` loading.
"""

from static_keras.strings.layout import StringIndexLayout
from static_keras.strings.logits_processor import StringLogitsProcessor
from static_keras.strings.string_constrained_decoding import StringConstrainedDecoding
from static_keras.strings.string_index import StringIndex
from static_keras.strings.vocabulary import TokenVocabulary

__all__ = [
    "StringConstrainedDecoding",
    "StringIndex",
    "StringIndexLayout",
    "StringLogitsProcessor",
    "TokenVocabulary",
]
