"""`RecallAtK`: the share of relevant items found in the top k results.

The metric of generative retrieval: a model returns item ids ranked best
first (`ConstrainedBeamSearch(..., outputs="item_ids")`), each row has one or
a few relevant items (the user's next item, a held-out set), and Recall@K
is the share of those found among the first k results, averaged over rows.
Pure `keras.ops`: it runs on every backend, in `model.evaluate` and in a
plain loop.
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from static_keras.api_export import static_keras_export


def recall_per_row(y_true, y_pred, k: int) -> tuple:
    """Recall@K of each row, and whether the row has any relevant item.

    A row's relevant items are the distinct non-negative ids of its
    `y_true` row; its top k are the ids among the first `k` entries of its
    `y_pred` row, -1 excluded (a prediction repeated counts once). Recall
    is `|relevant ∩ top k| / |relevant|`, and 0 for a row with no relevant
    item (which `RecallAtK` leaves out of the mean).

    Args:
        y_true: int `[B]` (one relevant id per row) or `[B, T]` (several,
            -1 padding).
        y_pred: int `[B, K']`: predicted ids, best first, -1 padding.
        k: int. How many of the first predictions count; may exceed `K'`.

    Returns:
        `(recall, has_relevant)`: float32 `[B]` and bool `[B]`.

    Example:

    >>> import numpy as np
    >>> recall, has_relevant = recall_per_row(
    ...     np.array([[3, 7], [5, -1], [-1, -1]]),
    ...     np.array([[7, 1, 3], [2, 5, -1], [4, 4, 4]]),
    ...     k=2,
    ... )
    >>> np.asarray(recall).tolist(), np.asarray(has_relevant).tolist()
    ([0.5, 1.0, 0.0], [True, True, False])
    """
    k = _positive_int(k)
    y_true = _item_ids(y_true, "y_true")
    y_pred = _item_ids(y_pred, "y_pred")
    # Compare in int64 when either side has it (`keras.backend.result_type`
    # would narrow int64 to int32 on JAX and torch, merging distinct ids).
    dtypes = {keras.backend.standardize_dtype(x.dtype) for x in (y_true, y_pred)}
    dtype = "int64" if dtypes & {"int64", "uint32", "uint64"} else "int32"
    y_true = ops.cast(y_true, dtype)
    y_pred = ops.cast(y_pred, dtype)
    if len(y_true.shape) == 1:
        y_true = ops.expand_dims(y_true, 1)
    if len(y_true.shape) != 2 or len(y_pred.shape) != 2:
        raise ValueError(
            "`y_true` must be [B] or [B, T] and `y_pred` [B, K']. "
            f"Received shapes {y_true.shape} and {y_pred.shape}"
        )
    # Relevant: non-negative, and not equal to an earlier id of the row.
    same = ops.equal(ops.expand_dims(y_true, 2), ops.expand_dims(y_true, 1))  # [B, T, T]
    width = ops.shape(y_true)[1]
    earlier = ops.less(ops.arange(width)[None, :], ops.arange(width)[:, None])  # [t, s]: s < t
    repeated = ops.any(ops.logical_and(same, ops.expand_dims(earlier, 0)), axis=2)
    relevant = ops.logical_and(ops.greater_equal(y_true, 0), ops.logical_not(repeated))
    # Top k: the first k columns, padding excluded.
    top = ops.less(ops.arange(ops.shape(y_pred)[1]), k)[None, :]
    top = ops.logical_and(top, ops.greater_equal(y_pred, 0))  # [B, K']
    match = ops.equal(ops.expand_dims(y_true, 2), ops.expand_dims(y_pred, 1))  # [B, T, K']
    found = ops.any(ops.logical_and(match, ops.expand_dims(top, 1)), axis=2)  # [B, T]
    hits = ops.sum(ops.cast(ops.logical_and(found, relevant), "float32"), axis=1)
    count = ops.sum(ops.cast(relevant, "float32"), axis=1)
    return ops.divide_no_nan(hits, count), ops.greater(count, 0)


@static_keras_export
class RecallAtK(keras.metrics.Metric):
    """Recall@K over ranked item ids: the (weighted) mean share of relevant
    items among the first k predictions.

    Per row, `|relevant ∩ top k| / |relevant|` (see `recall_per_row`); the
    metric is the mean over rows, weighted by `sample_weight`. Rows with no
    relevant id (all -1) are left out, as if their weight were 0. With one
    relevant id per row this is the hit rate at k. Predictions are item ids
    ranked best first with -1 padding, as `ConstrainedBeamSearch` returns
    them (`outputs="item_ids"`, or `scores_and_item_ids`' second output).

    Args:
        k: int. The number of leading predictions that count. May exceed
            the predictions' width (then every prediction counts).
        name: str or None. The metric's name. Defaults to `"recall_at_{k}"`.
        dtype: the dtype of the result. Defaults to float32.

    Call arguments (`update_state`):
        y_true: int `[B]` (one relevant id per row) or `[B, T]` (several,
            -1 padding; a repeated id counts once).
        y_pred: int `[B, K']`: item ids, best first, -1 padding.
        sample_weight: float `[B]` or None. Row weights. Defaults to None
            (every row 1).

    Returns:
        `result()`: a float scalar in [0, 1], 0 before any row with a
        relevant id is seen.

    Example:

    >>> import numpy as np
    >>> metric = RecallAtK(2)
    >>> metric.update_state(np.array([3, 5]), np.array([[7, 3, 1], [1, 2, 5]]))
    >>> float(metric.result())
    0.5
    >>> metric.update_state(np.array([[1, 2], [-1, -1]]), np.array([[1, -1, 2], [4, 4, 4]]))
    >>> round(float(metric.result()), 4)
    0.5

    References:
        Rajput et al., "Recommender Systems with Generative Retrieval"
        (NeurIPS 2023), which reports Recall@K for semantic-ID decoding.
    """

    def __init__(self, k: int, name: str | None = None, dtype: str | None = None):
        k = _positive_int(k)
        super().__init__(name=name or f"recall_at_{k}", dtype=dtype)
        self.k = k
        self.total = self.add_variable(
            shape=(), initializer="zeros", dtype=self.dtype, name="total"
        )
        self.count = self.add_variable(
            shape=(), initializer="zeros", dtype=self.dtype, name="count"
        )

    def update_state(self, y_true, y_pred, sample_weight=None):
        recall, has_relevant = recall_per_row(y_true, y_pred, self.k)
        weight = ops.cast(has_relevant, self.dtype)
        if sample_weight is not None:
            sample_weight = ops.reshape(ops.cast(sample_weight, self.dtype), (-1,))
            weight = weight * ops.broadcast_to(sample_weight, ops.shape(weight))
        self.total.assign_add(ops.sum(ops.cast(recall, self.dtype) * weight))
        self.count.assign_add(ops.sum(weight))

    def result(self):
        return ops.divide_no_nan(self.total, self.count)

    def reset_state(self):
        self.total.assign(ops.zeros((), dtype=self.dtype))
        self.count.assign(ops.zeros((), dtype=self.dtype))

    def get_config(self):
        config = super().get_config()
        config["k"] = self.k
        return config


def _item_ids(value, name: str):
    """`value` as an integer tensor; host ids beyond int32 are refused where
    the backend would wrap them around (JAX without `jax_enable_x64`)."""
    if isinstance(value, (np.ndarray, np.generic, list, tuple)):
        array = np.asarray(value)
        if array.size and not np.issubdtype(array.dtype, np.integer):
            raise ValueError(f"`{name}` must hold integer item ids. Received dtype {array.dtype}")
        if array.size and array.dtype.itemsize > 4 and not _holds_int64():
            info = np.iinfo(np.int32)
            if array.min() < info.min or array.max() > info.max:
                raise ValueError(
                    f"`{name}` holds item ids beyond int32, which this backend cannot "
                    "hold; on JAX enable 64-bit with jax_enable_x64"
                )
    tensor = ops.convert_to_tensor(value)
    dtype = keras.backend.standardize_dtype(tensor.dtype)
    if "int" not in dtype:
        raise ValueError(f"`{name}` must hold integer item ids. Received dtype {dtype}")
    return tensor


def _holds_int64() -> bool:
    if keras.config.backend() != "jax":
        return True
    import jax

    return bool(jax.config.jax_enable_x64)


def _positive_int(k) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"`k` must be a positive integer. Received: k={k!r}")
    return int(k)
