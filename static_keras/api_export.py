"""One decorator that marks a public Keras object and registers it for saving."""

import keras

PACKAGE = "static_keras"


def static_keras_export(cls):
    """Registers `cls` as `static_keras>Name` so `.keras` files can reload it."""
    return keras.saving.register_keras_serializable(package=PACKAGE)(cls)
