"""Shared builders for tests: small indexes and decoding models."""

import keras
import numpy as np
import pytest

from static_keras import CachedTransformerDecoder
from static_keras import ConstrainedBeamSearch
from static_keras import StaticIndex

HISTORY = 5
CONTEXT_VOCAB = 50


def make_index(seed: int, n: int = 300, vocab: int = 16, length: int = 4, **kwargs):
    rows = np.random.default_rng(seed).integers(0, vocab, size=(n, length))
    return StaticIndex.build(
        rows, vocab, item_ids=np.arange(n) + 1000 * seed, on_duplicate_item="first", **kwargs
    )


def make_model(index, decoder=None, beam_size: int = 4, num_results=None, seed: int = 0):
    """A functional model: history [B, 5] -> {tokens, scores, item_ids}."""
    if decoder is None:
        keras.utils.set_random_seed(seed)
        decoder = CachedTransformerDecoder(
            index.vocab_size, index.length, context_vocab_size=CONTEXT_VOCAB, hidden_dim=16
        )
    history = keras.Input((HISTORY,), dtype="int32", name="history")
    search = ConstrainedBeamSearch(index, decoder, beam_size=beam_size, num_results=num_results)
    return keras.Model(history, search(history))


def histories(batch: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, CONTEXT_VOCAB, (batch, HISTORY)).astype("int32")


@pytest.fixture(scope="module")
def small_model():
    index = make_index(1)
    return index, make_model(index)
