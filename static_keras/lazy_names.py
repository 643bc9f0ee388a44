"""Package attributes that import their module on first use (PEP 562).

The offline side of the kit (index building, the string compiler) must not
pay for Keras and TensorFlow, yet users expect `from static_keras import
ConstrainedBeamSearch`. A package lists where each name lives; its
`__getattr__` imports that module only when the name is first asked for
(with TensorFlow's harmless start-up lines filtered, when that import is
what loads it).
"""

from __future__ import annotations

import importlib

from static_keras.tensorflow_log_lines import import_quietly


def lazy_names(package: str, names: dict[str, str]):
    """`(__getattr__, __dir__)` for `package`, whose attributes `names` maps
    to their defining modules."""

    def __getattr__(name):
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_quietly(module), name)
        setattr(importlib.import_module(package), name, value)  # later lookups skip this
        return value

    def __dir__():
        return sorted(set(vars(importlib.import_module(package))) | set(names))

    return __getattr__, __dir__
