"""Loading `.keras` files that hold static-keras layers.

Keras finds a custom layer by its registered name (`static_keras>Name`),
which exists once the layer's module has run. The package loads its names
lazily (so index building stays free of Keras), so a fresh process that only
ran `import static_keras` has registered nothing yet: `load_model` here
imports every layer module first.
"""

from __future__ import annotations

from static_keras.tensorflow_log_lines import import_quietly

#: Every module that defines a registered Keras object of the kit.
LAYER_MODULES = (
    "static_keras.layers.cached_transformer_decoder",
    "static_keras.layers.constrained_decoding",
    "static_keras.decoding.constrained_beam_search",
    "static_keras.strings.string_constrained_decoding",
    "static_keras.metrics.recall_at_k",
)


def register_layers() -> None:
    """Registers every static-keras layer with Keras (idempotent)."""
    for module in LAYER_MODULES:
        import_quietly(module)


def load_model(path, **kwargs):
    """`keras.saving.load_model` with the static-keras layers registered."""
    register_layers()
    keras = import_quietly("keras")
    return keras.saving.load_model(path, **kwargs)
