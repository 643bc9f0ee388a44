"""`StringConstrainedDecoding`: one decoding step over a `StringIndex`."""

from __future__ import annotations

import math

import keras
import numpy as np
from keras import ops

from static_keras.api_export import static_keras_export
from static_keras.constants import INVALID_STATE
from static_keras.constants import MASKED_LOGIT
from static_keras.constants import PAD_TOKEN
from static_keras.strings import serialization
from static_keras.strings.layout import StringIndexLayout
from static_keras.strings.string_index import StringIndex

_LAYOUT_ARGS = (
    "vocab_size",
    "length",
    "eos_token_id",
    "num_states",
    "num_edges",
    "num_members",
    "step_widths",
    "max_width",
)


@static_keras_export
class StringConstrainedDecoding(keras.layers.Layer):
    """Restricts one decoding step to the tokens that keep spelling a member.

    The string counterpart of `ConstrainedDecoding`, with the same call
    contract, so `beam_search`, `ConstrainedBeamSearch` and SavedModel export
    take either. Each row carries an int32 state (0 at the start); at step
    `t` (a Python int) the layer gathers `B_t` slots from the row's CSR
    start (the vectorised node transition kernel), masks slots past the
    row's end, and returns

    - candidates (`mode="candidates"`): `scores, tokens, next_states`, each
      `[R, K_t]` with `K_t = min(top_k, B_t)` (`top_k` defaults to `B_t`);
    - masked logits (`mode="mask"`): `[R, V]`, disallowed tokens set to the
      finite `MASKED_LOGIT`; advance the states with `advance`.

    EOS is a candidate where the prefix is a complete member; it leads to
    the member's accept state, which allows only EOS again (a fixed-length
    loop keeps padding with EOS). `eos_token_id` tells `beam_search` to stop
    beams at EOS; `item_ids(states)` maps accept states to the position of
    the member in the caller's list. Padding candidates have token -1,
    score `-inf` and state -1. `step=None` (mask mode, `advance`) uses the
    widest row of any step: a stateless logits processor for any decode
    loop, at any step.

    Index arrays are non-trainable weights created in `build()` from the
    layout integers of the config; their values come from `index` (not part
    of the config) or from a `.keras` file's weights.

    Args:
        index: `StringIndex` or None. When None, the layout arguments must be
            given and the weights loaded later (this is how `from_config`
            rebuilds the layer).
        vocab_size, length, eos_token_id, num_states, num_edges, num_members,
        step_widths, max_width: the layout (see `StringIndexLayout`); taken
            from `index` when it is given.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        logits: float `[R, V]`, scores of the next token (cast to float32).
        states: int32 `[R]`.
        step: Python int in `[0, length)`, or None (mask mode only).
        mode: `"candidates"` or `"mask"`. Defaults to `"candidates"`.
        top_k: int or None. Candidates kept per row.

    Returns:
        `"candidates"`: `(scores float32, tokens int32, next_states int32)`,
        each `[R, K_t]`. `"mask"`: float32 `[R, V]`.

    Example:

    >>> from static_keras.strings import TokenVocabulary
    >>> vocab = TokenVocabulary.from_token_bytes([b"a", b"b", b"ab", b"."],
    ...                                          special=[3])
    >>> index = StringIndex.from_strings(["ab", "b"], vocab, eos_token_id=3)
    >>> layer = StringConstrainedDecoding(index)
    >>> logits = np.zeros((1, 4), "float32")
    >>> _, tokens, states = layer(logits, np.zeros(1, "int32"), step=0)
    >>> sorted(np.asarray(tokens)[0].tolist())
    [0, 1, 2]

    References:
        Xu and Bouyarmane, "Trie Automata for Constrained Decoding over Large
        Finite Sets" (arXiv:2608.12574).
    """

    def __init__(
        self,
        index: StringIndex | None = None,
        *,
        vocab_size: int | None = None,
        length: int | None = None,
        eos_token_id: int | None = None,
        num_states: int | None = None,
        num_edges: int | None = None,
        num_members: int | None = None,
        step_widths: list[int] | None = None,
        max_width: int | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        given = {
            "vocab_size": vocab_size,
            "length": length,
            "eos_token_id": eos_token_id,
            "num_states": num_states,
            "num_edges": num_edges,
            "num_members": num_members,
            "step_widths": step_widths,
            "max_width": max_width,
        }
        if index is not None:
            if not isinstance(index, StringIndex):
                raise ValueError(f"`index` must be a StringIndex. Received: {type(index).__name__}")
            layout = index.layout
            expected = layout.to_config()
            for name, value in given.items():
                if (
                    value is not None
                    and (list(value) if name == "step_widths" else value) != (expected[name])
                ):
                    raise ValueError(
                        f"The index does not match this layer: `{name}` is "
                        f"{expected[name]} in the index and {value} in the layer"
                    )
        else:
            missing = [name for name, value in given.items() if value is None]
            if missing:
                raise ValueError(
                    "StringConstrainedDecoding needs an `index`, or every layout "
                    f"argument to load one into. Missing: {missing}"
                )
            layout = StringIndexLayout.create(**given)
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
                dtype=np.dtype(dtype).name,
                initializer="zeros",
                trainable=False,
            )
        if self._pending_index is not None:
            self.set_index(self._pending_index)
            self._pending_index = None
        self.built = True

    def set_index(self, index: StringIndex) -> None:
        """Loads the arrays of `index`, which must have this layer's layout."""
        if index.layout != self.layout:
            raise ValueError(
                "The index does not match this layer: index layout "
                f"{index.layout.to_config()} vs layer layout {self.layout.to_config()}"
            )
        for name, array in index.arrays.items():
            self.index_weights[name].assign(array)

    def get_config(self):
        config = super().get_config()
        config.update(self.layout.to_config())
        return config

    def index_arrays(self) -> dict[str, np.ndarray]:
        """The device arrays this layer holds, as NumPy arrays."""
        shapes = self.layout.array_shapes()
        return {
            name: np.asarray(ops.convert_to_numpy(weight)).astype(shapes[name][1], copy=False)
            for name, weight in self.index_weights.items()
        }

    def index_metadata(self) -> dict:
        """Format, layout, counts and checksum of the index (for export)."""
        return serialization.metadata(self.layout, self.index_arrays())

    # Properties ------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return self.layout.vocab_size

    @property
    def length(self) -> int:
        return self.layout.length

    @property
    def eos_token_id(self) -> int:
        return self.layout.eos_token_id

    @property
    def step_widths(self) -> tuple[int, ...]:
        return self.layout.step_widths

    def num_candidates(self, step: int, top_k: int | None = None) -> int:
        """K_t: candidates per row returned at `step`."""
        self._check_step(step)
        width = self.layout.step_widths[step]
        return width if top_k is None else max(1, min(int(top_k), width))

    # Decoding ----------------------------------------------------------------

    def call(self, logits, states, step=None, mode: str = "candidates", top_k=None):
        logits = ops.cast(logits, "float32")
        states = ops.cast(states, "int32")
        if mode == "candidates":
            return self.candidates(logits, states, step, top_k=top_k)
        if mode == "mask":
            return self.mask_logits(logits, states, step)
        raise ValueError(f"`mode` must be 'candidates' or 'mask'. Received: mode={mode!r}")

    def candidates(self, logits, states, step: int, top_k: int | None = None):
        """`(scores, tokens, next_states)`, each `[R, K_t]`; see the class doc."""
        self._check_step(step)
        logits = ops.cast(logits, "float32")
        width = self.layout.step_widths[step]
        edges, ok = self._slots(ops.cast(states, "int32"), width)
        tokens = ops.cast(ops.take(self.index_weights["tokens"], edges), "int32")
        next_states = ops.cast(ops.take(self.index_weights["next_states"], edges), "int32")
        scores = ops.where(ok, ops.take_along_axis(logits, tokens, axis=1), -np.inf)
        k = self.num_candidates(step, top_k)
        if k < width:
            scores, pick = ops.top_k(scores, k, sorted=True)
            tokens = ops.take_along_axis(tokens, pick, axis=1)
            next_states = ops.take_along_axis(next_states, pick, axis=1)
        ok = ops.greater(scores, -np.inf)
        tokens = ops.where(ok, tokens, PAD_TOKEN)
        next_states = ops.where(ok, next_states, INVALID_STATE)
        return scores, tokens, next_states

    def allowed_mask(self, states, step: int | None = None):
        """bool `[R, V]`: the allowed next tokens of each row."""
        width = self._width(step)
        states = ops.cast(states, "int32")
        edges, ok = self._slots(states, width)
        tokens = ops.cast(ops.take(self.index_weights["tokens"], edges), "int32")
        # Scatter the valid slots into [R, V + 1]; padding lands in the spare column.
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

    def mask_logits(self, logits, states, step: int | None = None):
        """float32 `[R, V]`: `logits` with disallowed tokens set to `MASKED_LOGIT`."""
        allowed = self.allowed_mask(states, step)
        return ops.where(allowed, ops.cast(logits, "float32"), MASKED_LOGIT)

    def advance(self, states, tokens, step: int | None = None):
        """int32 `[R]`: the state after `tokens [R]`; `INVALID_STATE` where the
        token is not allowed. A branch-free binary search in each sorted row."""
        width = self._width(step)
        states = ops.cast(states, "int32")
        tokens = ops.cast(tokens, "int32")
        table = self.index_weights["tokens"]
        valid = ops.logical_and(
            ops.greater(states, INVALID_STATE), ops.less(states, self.layout.num_states)
        )
        safe = ops.where(valid, states, 0)
        indptr = self.index_weights["indptr"]
        start = ops.cast(ops.take(indptr, safe), "int32")
        end = ops.where(valid, ops.cast(ops.take(indptr, safe + 1), "int32"), start)
        low, high = start, end
        for _ in range(max(1, math.ceil(math.log2(width + 1)))):
            active = ops.less(low, high)
            middle = (low + high) // 2
            value = ops.cast(ops.take(table, ops.where(active, middle, 0)), "int32")
            right = ops.logical_and(active, ops.less(value, tokens))
            low = ops.where(right, middle + 1, low)
            high = ops.where(ops.logical_and(active, ops.logical_not(right)), middle, high)
        last = self.layout.num_edges - 1
        at = ops.minimum(low, last)
        hit = ops.equal(ops.cast(ops.take(table, at), "int32"), tokens)
        found = ops.logical_and(ops.logical_and(ops.less(low, end), hit), valid)
        next_states = ops.cast(ops.take(self.index_weights["next_states"], at), "int32")
        return ops.where(found, next_states, INVALID_STATE)

    def is_finished(self, states):
        """bool: whether each row has emitted EOS (is in an accept state)."""
        states = ops.cast(states, "int32")
        return ops.greater_equal(states, self.layout.accept_offset)

    def item_ids(self, states):
        """int32: position of the member in the caller's list for accept
        states, -1 for every other state."""
        states = ops.cast(states, "int32")
        offset = self.layout.accept_offset
        finished = ops.logical_and(
            ops.greater_equal(states, offset), ops.less(states, self.layout.num_states)
        )
        local = ops.where(finished, states - offset, 0)
        ids = ops.take(self.index_weights["member_item_ids"], local)
        return ops.where(finished, ids, ops.cast(-1, ids.dtype))

    # Kernels -----------------------------------------------------------------

    def _slots(self, states, width: int):
        """VNTK: `width` edge slots from each row's CSR start; `[R, width]` each."""
        valid = ops.logical_and(
            ops.greater(states, INVALID_STATE), ops.less(states, self.layout.num_states)
        )
        safe = ops.where(valid, states, 0)
        indptr = self.index_weights["indptr"]
        start = ops.cast(ops.take(indptr, safe), "int32")
        count = ops.cast(ops.take(indptr, safe + 1), "int32") - start
        slot = ops.arange(width, dtype="int32")
        ok = ops.logical_and(ops.less(slot, ops.expand_dims(count, 1)), ops.expand_dims(valid, 1))
        edges = ops.where(ok, ops.expand_dims(start, 1) + slot, 0)
        return edges, ok

    def _width(self, step) -> int:
        if step is None:
            return self.layout.max_width
        self._check_step(step)
        return self.layout.step_widths[step]

    def _check_step(self, step) -> None:
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)):
            raise ValueError(
                f"`step` must be a Python int (each step has its own static "
                f"shapes). Received: step={step!r}"
            )
        if not 0 <= step < self.layout.length:
            raise ValueError(f"`step` must lie in [0, {self.layout.length}). Received: step={step}")
