"""TF Serving's REST JSON: request bodies to arrays, outputs back to JSON.

A JSON number has no dtype, so each value is converted to the dtype the
signature declares for its input, as the real server does
(tensorflow_serving/util/json_tensor.cc, `FillPredictRequestFromJson`): a
value that does not fit (1.5 for an int32 input, 2**40 for int32, a string
for a number) is INVALID_ARGUMENT, and so is a ragged list. The two forms
are the row form (`{"instances": [...]}`, answered with `predictions`) and
the columnar form (`{"inputs": ...}`, answered with `outputs`).
"""

from __future__ import annotations

import numpy as np

from static_keras.serving.status import ServingFailure


def _bad(message: str) -> ServingFailure:
    return ServingFailure("INVALID_ARGUMENT", message)


def _to_array(name: str, value, dtype: np.dtype) -> np.ndarray:
    """One input's JSON value as an array of the signature's dtype."""
    if value == []:
        raise _bad(f"Input {name!r} is an empty list: send at least one row")
    try:
        array = np.asarray(value)
    except ValueError:  # NumPy refuses ragged nested lists
        array = np.asarray(value, dtype=object)
    if array.dtype == object:
        raise _bad(f"Input {name!r} is ragged or mixes types: every row needs the same shape")
    kind, target = array.dtype.kind, np.dtype(dtype)
    if target.kind in "iu":
        if kind not in "iu":
            raise _bad(f"Input {name!r} must hold integers ({target.name}); got {array.dtype}")
        converted = array.astype(target)
        if not np.array_equal(converted, array):
            raise _bad(f"Input {name!r} holds values outside the range of {target.name}")
        return converted
    if target.kind == "f":
        if kind not in "iuf":
            raise _bad(f"Input {name!r} must hold numbers ({target.name}); got {array.dtype}")
        return array.astype(target)
    if target.kind == "b":
        if kind != "b":
            raise _bad(f"Input {name!r} must hold true/false values; got {array.dtype}")
        return array
    if target.kind in "SO":
        if kind != "U":
            raise _bad(f"Input {name!r} must hold strings; got {array.dtype}")
        return np.vectorize(lambda s: s.encode(), otypes=[object])(array)
    raise _bad(f"Input {name!r} has dtype {target}, which this server cannot read from JSON")


def parse_predict_body(body, dtypes: dict[str, np.dtype]) -> tuple[dict[str, np.ndarray], bool]:
    """`(arrays by input name, row_form)` for a `:predict` body.

    Args:
        body: the decoded JSON.
        dtypes: the signature's input dtypes by name.
    """
    if not isinstance(body, dict):
        raise _bad(f"The request body must be a JSON object; got {type(body).__name__}")
    if ("instances" in body) == ("inputs" in body):
        raise _bad("The request must have exactly one of 'instances' or 'inputs'")
    names = sorted(dtypes)
    if "instances" in body:
        instances = body["instances"]
        if not isinstance(instances, list):
            raise _bad(f"'instances' must be a list; got {type(instances).__name__}")
        if not instances:
            raise _bad("'instances' is an empty list: send at least one row")
        objects = [isinstance(row, dict) for row in instances]
        if any(objects) and not all(objects):
            first = objects.index(not objects[0])
            raise _bad(
                f"instance {first} is a {type(instances[first]).__name__} but instance 0 is "
                f"a {type(instances[0]).__name__}: every instance must have the same form"
            )
        if all(objects):
            keys = set(instances[0])
            for i, row in enumerate(instances):
                if set(row) != keys:
                    raise _bad(
                        f"instance {i} names inputs {sorted(row)}, instance 0 names "
                        f"{sorted(keys)}: every instance must name the same inputs"
                    )
            columns = {k: [row[k] for row in instances] for k in keys}
        elif len(names) == 1:
            columns = {names[0]: instances}
        else:
            raise _bad(
                f"Instances without input names need a single-input signature; inputs: {names}"
            )
        return _convert(columns, dtypes), True
    inputs = body["inputs"]
    if isinstance(inputs, dict):
        columns = inputs
    elif len(names) == 1:
        columns = {names[0]: inputs}
    else:
        raise _bad(f"Unnamed 'inputs' need a single-input signature; inputs: {names}")
    return _convert(columns, dtypes), False


def _convert(columns: dict, dtypes: dict[str, np.dtype]) -> dict[str, np.ndarray]:
    unknown = sorted(set(columns) - set(dtypes))
    missing = sorted(set(dtypes) - set(columns))
    if unknown or missing:
        raise _bad(
            f"Request inputs {sorted(columns)} do not match the signature's inputs "
            f"{sorted(dtypes)} (missing {missing}, unexpected {unknown})"
        )
    return {name: _to_array(name, value, dtypes[name]) for name, value in columns.items()}


def predict_answer(outputs: dict[str, np.ndarray], row_form: bool) -> dict:
    """The JSON answer: `predictions` (row form) or `outputs` (columnar form)."""
    lists = {k: _jsonable(v) for k, v in outputs.items()}
    if not row_form:
        return {"outputs": next(iter(lists.values())) if len(lists) == 1 else lists}
    if len(lists) == 1:
        return {"predictions": next(iter(lists.values()))}
    rows = len(next(iter(lists.values())))
    return {"predictions": [{k: v[i] for k, v in lists.items()} for i in range(rows)]}


def _jsonable(array: np.ndarray):
    if array.dtype.kind in "SO":
        return np.vectorize(
            lambda b: b.decode(errors="replace") if isinstance(b, bytes) else b, otypes=[object]
        )(array).tolist()
    return array.tolist()
