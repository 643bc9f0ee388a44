"""Loading `.keras` files that hold static-keras layers.

Keras finds a custom layer by its registered name (`static_keras>Name`),
which exists once the layer's module has run. The package loads its names
lazily (so index building stays free of Keras), so a fresh process that only
ran `import static_keras` has registered nothing yet: `load_model` here
imports every layer module first.
"""

from __future__ import annotations

from static_keras.tensorflow_log_lines import import_quietly
from static_keras.tensorflow_log_lines import quiet_tensorflow_start


def register_layers() -> None:
    """Registers every static-keras layer with Keras (idempotent): imports
    each module that defines a registered Keras object of the kit."""
    with quiet_tensorflow_start():
        from static_keras.decoding import constrained_beam_search  # noqa: F401
        from static_keras.layers import cached_transformer_decoder  # noqa: F401
        from static_keras.layers import constrained_decoding  # noqa: F401
        from static_keras.metrics import recall_at_k  # noqa: F401
        from static_keras.strings import string_constrained_decoding  # noqa: F401


def load_model(path, **kwargs):
    """`keras.saving.load_model` with the static-keras layers registered."""
    register_layers()
    keras = import_quietly("keras")
    return keras.saving.load_model(path, **kwargs)
