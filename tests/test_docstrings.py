"""The runnable examples in public docstrings run and print what they claim."""

import doctest
import importlib

import pytest

MODULES = [
    "static_keras.index.archive",
    "static_keras.index.static_index",
    "static_keras.layers.automaton_constraint",
    "static_keras.layers.constrained_decoding",
    "static_keras.layers.cached_transformer_decoder",
    "static_keras.decoding.beam_search",
    "static_keras.decoding.constrained_beam_search",
    "static_keras.metrics.recall_at_k",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0, "no example found"
    assert result.failed == 0
