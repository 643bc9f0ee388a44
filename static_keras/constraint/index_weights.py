"""The index of a constraint layer as non-trainable weights.

An `AutomatonConstraint` creates its weights in `build()` from layout
integers alone (what a config holds), so a `.keras` file rebuilds the layer
before its values load; the values come from an index (`assign_arrays`) or
the file (`SharedValues`).
These are the steps shared by every weight group: the layout of a layer,
the weights of a group, their values in and out.
"""

from __future__ import annotations

import contextlib
import contextvars

import numpy as np

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
    created from `values[name]` where given, else zeros. Neither costs a
    transient copy where the backend shares host memory (TensorFlow: the
    variable takes the array's buffer, and the zeros of a layer that a file
    will fill are pages never touched)."""
    primitives = execution_plan.current().primitives
    for name, (shape, dtype) in shapes.items():
        dtype = device_dtype(dtype)
        if values is not None and name in values:
            value = primitives.weight_value(_fitted(name, values[name], dtype))
        else:
            value = primitives.zeros_value(shape, dtype)
        initializer = "zeros" if value is None else _constant(value)
        group[name] = add_weight(
            name=name, shape=shape, dtype=dtype, initializer=initializer, trainable=False
        )


def assign_arrays(group: dict, arrays: dict) -> None:
    """Assigns `name -> array` to the weights of `group`; ValueError when a
    value does not fit the weight's dtype (int64 ids on JAX without x64)."""
    primitives = execution_plan.current().primitives
    for name, array in arrays.items():
        weight = group[name]
        weight.assign(primitives.weight_value(_fitted(name, array, weight.dtype)))


class SharedValues:
    """A `load_own_variables` store whose values are handed to the weights
    without a transient copy where the backend shares host memory: each
    value is read from the file (one copy) when its weight asks for it."""

    def __init__(self, store):
        self._store = store
        self._primitives = execution_plan.current().primitives

    def keys(self):
        return self._store.keys()

    def __len__(self):
        return len(self._store.keys())

    def __getitem__(self, key):
        return self._primitives.weight_value(np.asarray(self._store[key]))


#: Inside `replacing_index`: whether a loading layer reads what carries its
#: sets over (True) or nothing of its index (False); None outside.
_REPLACING = contextvars.ContextVar("static_keras_replacing_index", default=None)


@contextlib.contextmanager
def replacing_index(carry_sets: bool):
    """Within: a constraint layer loading from a file leaves its index
    unread (zeros never touched cost no memory), for a model whose index is
    replaced as soon as it loads (`replace_index(path, index)`). With
    `carry_sets`, it reads its member item ids and sets, which carry the
    sets over to the new index by item id."""
    token = _REPLACING.set(bool(carry_sets))
    try:
        yield
    finally:
        _REPLACING.reset(token)


def weights_to_load(layer):
    """None (every weight), or the weights of `layer` that a load reads
    inside `replacing_index`."""
    carry = _REPLACING.get()
    if carry is None:
        return None
    if not carry or not layer.num_eligibility_sets:
        return []
    ids = [layer.index_weights[layer.layout.member_ids_array]] if layer.has_item_ids else []
    return ids + list(layer.eligibility_weights.values())


def _constant(value):
    return lambda shape, dtype=None: value


def _fitted(name: str, array, dtype: str) -> np.ndarray:
    values = array.astype(dtype, copy=False)
    if values.dtype != array.dtype and not np.array_equal(values, array):
        raise ValueError(
            f"Index array {name!r} holds values beyond {dtype}; "
            "on JAX enable 64-bit with jax_enable_x64"
        )
    return values


def read_arrays(group: dict, shapes: dict) -> dict[str, np.ndarray]:
    """The weights of `group` as NumPy arrays of the layout's dtypes
    (read-only views of the weights where the backend shares host memory
    and the dtype is the layout's; else copies)."""
    primitives = execution_plan.current().primitives
    return {
        name: primitives.host_array(weight).astype(shapes[name][1], copy=False)
        for name, weight in group.items()
    }


def device_dtype(dtype: np.dtype) -> str:
    """int64 arrays stay int64 unless the backend cannot hold them (JAX
    without x64), as the execution plan's primitives say."""
    if dtype == np.int64 and not execution_plan.current().primitives.holds_int64():
        return "int32"
    return np.dtype(dtype).name
