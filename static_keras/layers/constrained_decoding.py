"""`ConstrainedDecoding`: one STATIC decoding step as a Keras 3 layer."""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from static_keras.api_export import static_keras_export
from static_keras.constants import INVALID_STATE
from static_keras.constants import MASKED_LOGIT
from static_keras.constants import PAD_TOKEN
from static_keras.index.layout import IndexLayout
from static_keras.index.static_index import StaticIndex

__all__ = ["INVALID_STATE", "MASKED_LOGIT", "PAD_TOKEN", "ConstrainedDecoding"]


@static_keras_export
class ConstrainedDecoding(keras.layers.Layer):
    """Restricts one decoding step to the valid continuations of a `StaticIndex`.

    Each row (batch x beam) carries an int32 state: the position of its
    prefix in the index. At step `t` (a Python int: every step has its own
    static shapes) the layer reads the valid next tokens of each row with a
    branch-free, fixed-width gather and returns either

    - candidates (`mode="candidates"`): `scores, tokens, next_states`, each
      `[R, K_t]`. In the CSR tail `K_t = B_t` (`index.step_widths[t]`): the
      vectorised node transition kernel gathers `B_t` slots from each row's
      CSR start and masks the slots past its end. In the dense head (the first
      `dense_levels` steps) the bit-packed mask row is unpacked and the
      `K_t = min(top_k, B_t)` best valid tokens are kept (`top_k` defaults to
      `B_t`: all of them).
    - masked logits (`mode="mask"`): `[R, V]`, invalid tokens set to
      `MASKED_LOGIT`; advance the states with `advance(states, tokens, step)`.

    Padding candidates (a row with fewer than `K_t` valid tokens, or a row
    whose state is `INVALID_STATE`) have token -1, score `-inf` and next state
    -1. The initial state of every row is 0.

    The index arrays are non-trainable weights created in `build()` from the
    layout integers in the config; their values come from the `index`
    argument (not part of the config), or from a `.keras` file's weights.

    Args:
        index: `StaticIndex` or None. The valid set. When None, the layout
            arguments below must be given and the weights are loaded later
            (this is how `from_config` rebuilds the layer).
        vocab_size, length, dense_levels, level_sizes, step_widths,
        has_item_ids: the index layout (see `IndexLayout`). Taken from
            `index` when it is given; if given too they must match it.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        logits: float `[R, V]`, scores of the next token (log-probs or
            logits; cast to float32).
        states: int32 `[R]`, states after the prefix of each row.
        step: Python int in `[0, length)`, the number of tokens decoded.
        mode: `"candidates"` or `"mask"`. Defaults to `"candidates"`.
        top_k: int or None. Candidates kept per row at a dense step.

    Returns:
        `"candidates"`: tuple `(scores float32, tokens int32, next_states
        int32)`, each `[R, K_t]`. `"mask"`: float32 `[R, V]`.

    Example:

    >>> import numpy as np
    >>> index = StaticIndex.build([[1, 2], [1, 3], [0, 2]], vocab_size=4)
    >>> layer = ConstrainedDecoding(index)
    >>> logits = np.log(np.full((1, 4), 0.25, "float32"))
    >>> scores, tokens, states = layer(logits, np.zeros(1, "int32"), step=0)
    >>> sorted(np.asarray(tokens)[0].tolist())
    [0, 1]

    References:
        Su et al., "Vectorizing the Trie: Efficient Constrained Decoding for
        LLM-based Generative Retrieval on Accelerators" (arXiv:2602.22647).
    """

    def __init__(
        self,
        index: StaticIndex | None = None,
        *,
        vocab_size: int | None = None,
        length: int | None = None,
        dense_levels: int | None = None,
        level_sizes: list[int] | None = None,
        step_widths: list[int] | None = None,
        has_item_ids: bool | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        given = {
            "vocab_size": vocab_size,
            "length": length,
            "dense_levels": dense_levels,
            "level_sizes": level_sizes,
            "step_widths": step_widths,
            "has_item_ids": has_item_ids,
        }
        if index is not None:
            if not isinstance(index, StaticIndex):
                raise ValueError(f"`index` must be a StaticIndex. Received: {type(index).__name__}")
            layout = index.layout
            _check_layout_matches(layout, given)
        else:
            missing = [name for name, value in given.items() if value is None]
            if missing:
                raise ValueError(
                    "ConstrainedDecoding needs an `index`, or every layout "
                    f"argument to load one into. Missing: {missing}"
                )
            layout = IndexLayout.create(**given)
        if layout.num_states > np.iinfo(np.int32).max:
            raise ValueError(
                f"The index has {layout.num_states} states; int32 states hold "
                f"at most {np.iinfo(np.int32).max}"
            )
        self.layout = layout
        self._pending_index = index
        self.build()

    def build(self, input_shape=None):
        if self.built:
            return
        self.index_weights = {}
        for name, (shape, dtype) in self.layout.array_shapes().items():
            self.index_weights[name] = self.add_weight(
                name=name,
                shape=shape,
                dtype=_device_dtype(dtype),
                initializer="zeros",
                trainable=False,
            )
        if self._pending_index is not None:
            self.set_index(self._pending_index)
            self._pending_index = None
        self.built = True

    def set_index(self, index: StaticIndex) -> None:
        """Loads the arrays of `index`, which must have this layer's layout."""
        if index.layout != self.layout:
            raise ValueError(
                "The index does not match this layer: index layout "
                f"{index.layout.to_config()} vs layer layout "
                f"{self.layout.to_config()}"
            )
        for name, array in index.arrays.items():
            weight = self.index_weights[name]
            values = array.astype(weight.dtype, copy=False)
            if values.dtype != array.dtype and not np.array_equal(values, array):
                raise ValueError(
                    f"Index array {name!r} holds values beyond {weight.dtype}; "
                    "on JAX enable 64-bit with jax_enable_x64"
                )
            weight.assign(values)

    def get_config(self):
        config = super().get_config()
        config.update(self.layout.to_config())
        return config

    # Properties ------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return self.layout.vocab_size

    @property
    def length(self) -> int:
        return self.layout.length

    @property
    def step_widths(self) -> tuple[int, ...]:
        return self.layout.step_widths

    def num_candidates(self, step: int, top_k: int | None = None) -> int:
        """K_t: candidates per row returned at `step`."""
        self._check_step(step)
        width = self.layout.step_widths[step]
        if step < self.layout.dense_levels and top_k is not None:
            return max(1, min(int(top_k), width))
        return width

    # Decoding ----------------------------------------------------------------

    def call(self, logits, states, step: int, mode: str = "candidates", top_k=None):
        self._check_step(step)
        logits = ops.cast(logits, "float32")
        states = ops.cast(states, "int32")
        if mode == "candidates":
            return self.candidates(logits, states, step, top_k=top_k)
        if mode == "mask":
            return self.mask_logits(logits, states, step)
        raise ValueError(f"`mode` must be 'candidates' or 'mask'. Received: mode={mode!r}")

    def candidates(self, logits, states, step: int, top_k: int | None = None):
        """`(scores, tokens, next_states)`, each `[R, K_t]`; see the class doc."""
        if step < self.layout.dense_levels:
            allowed = self._dense_allowed(states, step)
            k = self.num_candidates(step, top_k)
            masked = ops.where(allowed, logits, -np.inf)
            scores, tokens = ops.top_k(masked, k, sorted=True)
            ok = ops.take_along_axis(allowed, tokens, axis=1)
            tokens = ops.cast(tokens, "int32")
            next_states = self._dense_next(ops.expand_dims(states, 1), tokens, step)
        else:
            edges, ok = self._tail_slots(states, step)
            tokens = ops.cast(ops.take(self.index_weights["tokens"], edges), "int32")
            scores = ops.take_along_axis(logits, tokens, axis=1)
            next_states = edges + self.layout.level_sizes[self.layout.dense_levels]
        ok = ops.logical_and(ok, ops.greater(next_states, INVALID_STATE))
        scores = ops.where(ok, scores, -np.inf)
        tokens = ops.where(ok, tokens, PAD_TOKEN)
        next_states = ops.where(ok, next_states, INVALID_STATE)
        return scores, tokens, next_states

    def allowed_mask(self, states, step: int):
        """bool `[R, V]`: the valid next tokens of each row."""
        self._check_step(step)
        states = ops.cast(states, "int32")
        if step < self.layout.dense_levels:
            return self._dense_allowed(states, step)
        edges, ok = self._tail_slots(states, step)
        tokens = ops.cast(ops.take(self.index_weights["tokens"], edges), "int32")
        # Scatter the valid slots into [R, V + 1]; padding slots land in the
        # spare last column, which is dropped.
        vocab = self.layout.vocab_size
        columns = ops.where(ok, tokens, vocab)
        rows = ops.broadcast_to(
            ops.expand_dims(ops.arange(ops.shape(columns)[0], dtype="int32"), 1),
            ops.shape(columns),
        )
        indices = ops.reshape(ops.stack([rows, columns], axis=-1), (-1, 2))
        counts = ops.scatter(
            indices,
            ops.ones((ops.shape(indices)[0],), dtype="int32"),
            (ops.shape(columns)[0], vocab + 1),
        )
        return ops.greater(counts[:, :vocab], 0)

    def mask_logits(self, logits, states, step: int):
        """float32 `[R, V]`: `logits` with invalid tokens set to `MASKED_LOGIT`."""
        allowed = self.allowed_mask(states, step)
        return ops.where(allowed, ops.cast(logits, "float32"), MASKED_LOGIT)

    def advance(self, states, tokens, step: int):
        """int32 `[R]`: the state after appending `tokens [R]` at `step`.

        A token that is not a valid continuation gives `INVALID_STATE`.
        """
        self._check_step(step)
        states = ops.cast(states, "int32")
        tokens = ops.cast(tokens, "int32")
        if step < self.layout.dense_levels:
            allowed = self._dense_allowed(states, step)
            safe = ops.clip(tokens, 0, self.layout.vocab_size - 1)
            ok = ops.logical_and(
                ops.equal(safe, tokens),
                ops.squeeze(ops.take_along_axis(allowed, safe[:, None], axis=1), 1),
            )
            next_states = self._dense_next(states, safe, step)
            return ops.where(ok, next_states, INVALID_STATE)
        edges, ok = self._tail_slots(states, step)
        slot_tokens = ops.cast(ops.take(self.index_weights["tokens"], edges), "int32")
        match = ops.logical_and(ok, ops.equal(slot_tokens, tokens[:, None]))
        edge = ops.sum(ops.where(match, edges, 0), axis=1)
        found = ops.any(match, axis=1)
        offset = self.layout.level_sizes[self.layout.dense_levels]
        return ops.where(found, edge + offset, INVALID_STATE)

    def item_ids(self, states):
        """int `[...]`: catalogue item ids of final states, -1 for invalid ones."""
        if not self.layout.has_item_ids:
            raise ValueError("The index of this layer was built without `item_ids`")
        states = ops.cast(states, "int32")
        leaf = states - self.layout.leaf_offset
        ok = ops.logical_and(ops.greater_equal(leaf, 0), ops.greater(states, INVALID_STATE))
        ids = ops.take(self.index_weights["leaf_item_ids"], ops.where(ok, leaf, 0))
        return ops.where(ok, ids, ops.cast(-1, ids.dtype))

    # Kernels -----------------------------------------------------------------

    def _dense_allowed(self, states, step: int):
        """Unpacks the bit-packed mask row of each prefix code: bool `[R, V]`."""
        layout = self.layout
        valid = ops.greater(states, INVALID_STATE)
        rows = layout.dense_mask_offsets[step] + ops.where(valid, states, 0)
        words = ops.take(self.index_weights["dense_masks"], rows, axis=0)  # [R, W]
        shifts = ops.arange(32, dtype="int32")
        bits = ops.bitwise_and(ops.right_shift(ops.expand_dims(words, 2), shifts), 1)
        bits = ops.reshape(bits, (-1, layout.mask_words * 32))[:, : layout.vocab_size]
        return ops.logical_and(ops.equal(bits, 1), ops.expand_dims(valid, 1))

    def _dense_next(self, states, tokens, step: int):
        """Next state in the dense head: the code, or the tail state after d."""
        codes = states * self.layout.vocab_size + tokens
        if step + 1 < self.layout.dense_levels:
            return codes
        valid = ops.greater(states, INVALID_STATE)
        table = self.index_weights["dense_states"]
        return ops.where(valid, ops.take(table, ops.where(valid, codes, 0)), INVALID_STATE)

    def _tail_slots(self, states, step: int):
        """VNTK: `B_t` edge slots from each row's CSR start; `[R, B_t]` each.

        Returns the (clamped, always in-range) edge numbers and whether each
        slot is a real child of the row.
        """
        layout = self.layout
        width = layout.step_widths[step]
        valid = ops.greater(states, INVALID_STATE)
        local = ops.where(valid, states - layout.tail_state_offsets[step], 0)
        if step in layout.indptr_offsets:
            rows = layout.indptr_offsets[step] + local
            indptr = self.index_weights["indptr"]
            start = ops.cast(ops.take(indptr, rows), "int32")
            count = ops.cast(ops.take(indptr, rows + 1), "int32") - start
        else:  # every state at this depth has exactly one child
            start = layout.edge_offsets[step] + local
            count = ops.ones_like(start)
        slot = ops.arange(width, dtype="int32")
        ok = ops.logical_and(ops.less(slot, ops.expand_dims(count, 1)), ops.expand_dims(valid, 1))
        edges = ops.where(ok, ops.expand_dims(start, 1) + slot, 0)
        return edges, ok

    def _check_step(self, step) -> None:
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)):
            raise ValueError(
                f"`step` must be a Python int (each step has its own static "
                f"shapes). Received: step={step!r}"
            )
        if not 0 <= step < self.layout.length:
            raise ValueError(f"`step` must lie in [0, {self.layout.length}). Received: step={step}")


def _check_layout_matches(layout: IndexLayout, given: dict) -> None:
    expected = layout.to_config()
    for name, value in given.items():
        if value is None:
            continue
        if isinstance(value, (list, tuple)):
            value = list(value)
        if value != expected[name]:
            raise ValueError(
                f"The index does not match this layer: `{name}` is "
                f"{expected[name]} in the index and {value} in the layer"
            )


def _device_dtype(dtype: np.dtype) -> str:
    """int64 arrays stay int64 unless the backend cannot hold them (JAX x32)."""
    if dtype == np.int64 and keras.config.backend() == "jax":
        import jax

        if not jax.config.jax_enable_x64:
            return "int32"
    return np.dtype(dtype).name
