"""The index of a constraint layer as non-trainable weights.

An `AutomatonConstraint` creates its weights in `build()` from layout
integers alone (what a config holds), so a `.keras` file rebuilds the layer
before its values load; the values come from an index (`assign_arrays`).
These are the steps shared by every weight group: the layout of a layer,
the weights of a group, their values in and out.
"""

from __future__ import annotations

import numpy as np
from keras import ops

from static_keras.kernels import execution_plan


def resolve_layout(index, layout_fields: dict, index_class, layout_class, layer_name: str):
    """The layout of a layer: `index`'s (every given field must match it),
    or, without an index, one made from `layout_fields` (all given)."""
    if index is not None:
        if not isinstance(index, index_class):
            raise ValueError(
                f"`index` must be a {index_class.__name__}. Received: {type(index).__name__}"
            )
        layout = index.layout
        expected = layout.to_config()
        for field, value in layout_fields.items():
            if value is None:
                continue
            value = list(value) if isinstance(value, (list, tuple)) else value
            if value != expected[field]:
                raise ValueError(
                    f"The index does not match this layer: `{field}` is "
                    f"{expected[field]} in the index and {value} in the layer"
                )
    else:
        missing = [field for field, value in layout_fields.items() if value is None]
        if missing:
            raise ValueError(
                f"{layer_name} needs an `index`, or every layout argument to load one "
                f"into. Missing: {missing}"
            )
        layout = layout_class.create(**layout_fields)
    if layout.state_space > np.iinfo(np.int32).max:
        raise ValueError(
            f"The index has {layout.state_space} decoding states; int32 states hold "
            f"at most {np.iinfo(np.int32).max}"
        )
    return layout


def add_weights(add_weight, shapes: dict, group: dict, values: dict | None = None) -> None:
    """Adds a non-trainable weight per `name -> (shape, dtype)` to `group`:
    created from `values[name]` where given (the variable is the one copy:
    no zero-filled buffer that an assignment then replaces), else zeros."""
    for name, (shape, dtype) in shapes.items():
        dtype = device_dtype(dtype)
        initializer = "zeros"
        if values is not None and name in values:
            initializer = _initial_value(name, values[name], dtype)
        group[name] = add_weight(
            name=name, shape=shape, dtype=dtype, initializer=initializer, trainable=False
        )


def assign_arrays(group: dict, arrays: dict) -> None:
    """Assigns `name -> array` to the weights of `group`; ValueError when a
    value does not fit the weight's dtype (int64 ids on JAX without x64)."""
    for name, array in arrays.items():
        weight = group[name]
        weight.assign(_fitted(name, array, weight.dtype))


def _initial_value(name: str, array, dtype: str):
    fitted = _fitted(name, array, dtype)
    return lambda shape, dtype=None: fitted


def _fitted(name: str, array, dtype: str) -> np.ndarray:
    values = array.astype(dtype, copy=False)
    if values.dtype != array.dtype and not np.array_equal(values, array):
        raise ValueError(
            f"Index array {name!r} holds values beyond {dtype}; "
            "on JAX enable 64-bit with jax_enable_x64"
        )
    return values


def read_arrays(group: dict, shapes: dict) -> dict[str, np.ndarray]:
    """The weights of `group` as NumPy arrays of the layout's dtypes."""
    return {
        name: np.asarray(ops.convert_to_numpy(weight)).astype(shapes[name][1], copy=False)
        for name, weight in group.items()
    }


def device_dtype(dtype: np.dtype) -> str:
    """int64 arrays stay int64 unless the backend cannot hold them (JAX
    without x64), as the execution plan's primitives say."""
    if dtype == np.int64 and not execution_plan.current().primitives.holds_int64():
        return "int32"
    return np.dtype(dtype).name
