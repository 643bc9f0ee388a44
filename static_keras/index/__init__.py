"""Offline index building: NumPy only (no Keras, no TensorFlow).

`TokenAutomaton` is the host-side contract of every compiled valid set;
`StaticIndex` is its semantic-ID kind (the string kind, `StringIndex`, lives
in `static_keras.strings`); `archive.load` / `load_index` read a file of any
kind.
"""

from static_keras.index.archive import load as load_index
from static_keras.index.automaton import TokenAutomaton
from static_keras.index.layout import IndexLayout
from static_keras.index.static_index import StaticIndex

__all__ = ["IndexLayout", "StaticIndex", "TokenAutomaton", "load_index"]
