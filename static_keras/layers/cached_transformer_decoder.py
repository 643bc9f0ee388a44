"""`CachedTransformerDecoder`: a small decoder that follows the step contract."""

from __future__ import annotations

import keras
from keras import ops

from static_keras.api_export import static_keras_export


@static_keras_export
class CachedTransformerDecoder(keras.layers.Layer):
    """A TIGER-style transformer decoder with a KV cache, one token per call.

    The context (for a recommender: the ids of the items a user interacted
    with, `[rows, H]` int, 0 = padding) is embedded once by `initial_state`;
    every call then embeds one new token (BOS at step 0, else the last token
    of the prefix), writes its keys and values into a fixed-size cache at
    position t, and attends over the context and the cache. The cache lives
    in the state, so beam search must reorder it by parent beam: a beam that
    inherits another beam's prefix must inherit its cache too.

    `full_logits(context, prefix)` recomputes the same logits from scratch
    (no cache): tests compare the two. `sequence_logits(context, prefix)`
    scores every position in one causal pass: the training path.

    Args:
        vocab_size: int. Output tokens, V.
        length: int. Longest prefix decoded (the cache size), L.
        context_vocab_size: int. Ids in the context (0 is padding).
        hidden_dim: int. Width of the model. Defaults to 32.
        num_heads: int. Attention heads; divides `hidden_dim`. Defaults to 2.
        num_layers: int. Decoder blocks. Defaults to 1.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        prefix: int32 `[R, t]`, the tokens decoded so far (t static).
        state: dict from `initial_state` or a previous call.

    Returns:
        `(logits float32 [R, V], state)`.

    Example:

    >>> import numpy as np
    >>> decoder = CachedTransformerDecoder(vocab_size=8, length=3,
    ...                                    context_vocab_size=20)
    >>> state = decoder.initial_state(np.array([[3, 4, 0]]))
    >>> logits, state = decoder(np.zeros((1, 0), "int32"), state)
    >>> tuple(logits.shape)
    (1, 8)
    """

    def __init__(
        self,
        vocab_size: int,
        length: int,
        context_vocab_size: int,
        hidden_dim: int = 32,
        num_heads: int = 2,
        num_layers: int = 1,
        **kwargs,
    ):
        super().__init__(**kwargs)
        for name, value in (
            ("vocab_size", vocab_size),
            ("length", length),
            ("context_vocab_size", context_vocab_size),
            ("hidden_dim", hidden_dim),
            ("num_heads", num_heads),
            ("num_layers", num_layers),
        ):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"`{name}` must be a positive integer. Received: {name}={value!r}")
        if hidden_dim % num_heads:
            raise ValueError(f"`num_heads`={num_heads} must divide `hidden_dim`={hidden_dim}")
        self.vocab_size = vocab_size
        self.length = length
        self.context_vocab_size = context_vocab_size
        self.hidden_dim = hidden_dim
        self.num_heads = num_heads
        self.num_layers = num_layers
        self.head_dim = hidden_dim // num_heads

        self.context_embedding = keras.layers.Embedding(context_vocab_size, hidden_dim)
        # Token vocab_size is BOS.
        self.token_embedding = keras.layers.Embedding(vocab_size + 1, hidden_dim)
        self.position_embedding = keras.layers.Embedding(length, hidden_dim)
        self.blocks = []
        for i in range(num_layers):
            self.blocks.append(
                {
                    "norm1": keras.layers.LayerNormalization(name=f"norm1_{i}"),
                    "query": keras.layers.Dense(hidden_dim, name=f"query_{i}"),
                    "key": keras.layers.Dense(hidden_dim, name=f"key_{i}"),
                    "value": keras.layers.Dense(hidden_dim, name=f"value_{i}"),
                    "output": keras.layers.Dense(hidden_dim, name=f"attn_out_{i}"),
                    "norm2": keras.layers.LayerNormalization(name=f"norm2_{i}"),
                    "ffn_in": keras.layers.Dense(
                        4 * hidden_dim, activation="gelu", name=f"ffn_in_{i}"
                    ),
                    "ffn_out": keras.layers.Dense(hidden_dim, name=f"ffn_out_{i}"),
                }
            )
        self.final_norm = keras.layers.LayerNormalization(name="final_norm")
        self.head = keras.layers.Dense(vocab_size, name="logits")

    def build(self, input_shape=None):
        if self.built:
            return
        h = self.hidden_dim
        self.context_embedding.build((None, None))
        self.token_embedding.build((None,))
        self.position_embedding.build((None,))
        for block in self.blocks:
            for name in ("norm1", "norm2"):
                block[name].build((None, h))
            for name in ("query", "key", "value", "output", "ffn_in"):
                block[name].build((None, h))
            block["ffn_out"].build((None, 4 * h))
        self.final_norm.build((None, h))
        self.head.build((None, h))
        self.built = True

    def initial_state(self, context) -> dict:
        """Embeds the context once and allocates an empty cache per block."""
        self.build()
        context = ops.cast(context, "int32")
        memory = self.context_embedding(context)  # [R, H, D]
        memory_mask = ops.greater(context, 0)  # [R, H]
        rows = ops.shape(context)[0]
        state = {"memory_mask": memory_mask}
        for i, block in enumerate(self.blocks):
            state[f"memory_key_{i}"] = self._heads(block["key"](memory))
            state[f"memory_value_{i}"] = self._heads(block["value"](memory))
            empty = ops.zeros((rows, self.num_heads, self.length, self.head_dim))
            state[f"cache_key_{i}"] = empty
            state[f"cache_value_{i}"] = empty
        return state

    def call(self, prefix, state):
        step = prefix.shape[1]
        if step is None or step >= self.length:
            raise ValueError(
                f"The prefix length must be static and below length={self.length}. "
                f"Received prefix shape {prefix.shape}"
            )
        rows = ops.shape(state["memory_mask"])[0]
        if step == 0:
            token = ops.full((rows,), self.vocab_size, dtype="int32")
        else:
            token = ops.cast(prefix[:, step - 1], "int32")
        x = self.token_embedding(token) + self.position_embedding(
            ops.full((rows,), step, dtype="int32")
        )
        state = dict(state)
        for i, block in enumerate(self.blocks):
            h = block["norm1"](x)
            query = self._heads(block["query"](h)[:, None])  # [R, heads, 1, d]
            key = self._heads(block["key"](h)[:, None])
            value = self._heads(block["value"](h)[:, None])
            # Static slices, not ops.slice_update: on TensorFlow that lowers to
            # XlaDynamicUpdateSlice, which a server with XLA off cannot run.
            for name, new in ((f"cache_key_{i}", key), (f"cache_value_{i}", value)):
                cache = state[name]
                state[name] = ops.concatenate(
                    [cache[:, :, :step], new, cache[:, :, step + 1 :]], axis=2
                )
            keys = ops.concatenate(
                [state[f"memory_key_{i}"], state[f"cache_key_{i}"][:, :, : step + 1]], axis=2
            )
            values = ops.concatenate(
                [state[f"memory_value_{i}"], state[f"cache_value_{i}"][:, :, : step + 1]],
                axis=2,
            )
            mask = ops.concatenate(
                [state["memory_mask"], ops.ones((rows, step + 1), dtype="bool")], axis=1
            )
            attended = self._attend(query, keys, values, mask[:, None, None, :])[
                :, :, 0
            ]  # [R, heads, d]
            x = x + block["output"](ops.reshape(attended, (-1, self.hidden_dim)))
            x = x + block["ffn_out"](block["ffn_in"](block["norm2"](x)))
        return self.head(self.final_norm(x)), state

    def full_logits(self, context, prefix):
        """Logits after `prefix [R, t]`, recomputed without a cache (reference).

        `call` must agree with it at every step.
        """
        return self.sequence_logits(context, prefix)[:, -1]

    def sequence_logits(self, context, prefix):
        """Teacher forcing: logits `[R, t + 1, V]` for every position at once.

        Position i scores the token that follows `prefix[:, :i]` (BOS first),
        with causal attention over the whole prefix in one pass: the training
        path. `sequence_logits(context, targets[:, :-1])` scores `targets`.
        """
        self.build()
        context = ops.cast(context, "int32")
        memory = self.context_embedding(context)
        rows, steps = ops.shape(context)[0], prefix.shape[1] + 1
        tokens = ops.concatenate(
            [ops.full((rows, 1), self.vocab_size, dtype="int32"), ops.cast(prefix, "int32")],
            axis=1,
        )
        x = self.token_embedding(tokens) + self.position_embedding(ops.arange(steps))[None]
        causal = ops.greater_equal(ops.arange(steps)[:, None], ops.arange(steps)[None, :])
        memory_mask = ops.broadcast_to(
            ops.greater(context, 0)[:, None, :], (rows, steps, ops.shape(context)[1])
        )
        mask = ops.concatenate(
            [memory_mask, ops.broadcast_to(causal[None], (rows, steps, steps))], axis=2
        )[:, None]
        for block in self.blocks:
            h = block["norm1"](x)
            keys = ops.concatenate(
                [self._heads(block["key"](memory)), self._heads(block["key"](h))], axis=2
            )
            values = ops.concatenate(
                [self._heads(block["value"](memory)), self._heads(block["value"](h))], axis=2
            )
            attended = self._attend(self._heads(block["query"](h)), keys, values, mask)
            attended = ops.reshape(ops.transpose(attended, (0, 2, 1, 3)), (rows, steps, -1))
            x = x + block["output"](attended)
            x = x + block["ffn_out"](block["ffn_in"](block["norm2"](x)))
        return self.head(self.final_norm(x))

    def _heads(self, x):
        """[R, S, D] -> [R, heads, S, head_dim]."""
        x = ops.reshape(x, (ops.shape(x)[0], -1, self.num_heads, self.head_dim))
        return ops.transpose(x, (0, 2, 1, 3))

    def _attend(self, query, keys, values, mask):
        scores = ops.einsum("rhqd,rhkd->rhqk", query, keys) / (self.head_dim**0.5)
        scores = ops.where(mask, scores, -1e9)  # mask broadcasts to [R, h, q, k]
        return ops.einsum("rhqk,rhkd->rhqd", ops.softmax(scores, axis=-1), values)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocab_size": self.vocab_size,
                "length": self.length,
                "context_vocab_size": self.context_vocab_size,
                "hidden_dim": self.hidden_dim,
                "num_heads": self.num_heads,
                "num_layers": self.num_layers,
            }
        )
        return config


@static_keras_export
class TeacherForcing(keras.layers.Layer):
    """The training view of a step decoder: logits for every target position.

    Wraps a decoder with `sequence_logits(context, prefix)` (such as
    `CachedTransformerDecoder`) so a functional model can train it with
    `fit`: `(context [B, H], targets [B, L]) -> logits [B, L, V]`, where
    position i scores `targets[:, i]` given `targets[:, :i]`. The decoder's
    weights are shared, so the trained decoder decodes directly.

    Example:

    >>> import numpy as np
    >>> decoder = CachedTransformerDecoder(8, 3, context_vocab_size=20)
    >>> logits = TeacherForcing(decoder)(np.ones((2, 4), "int32"), np.zeros((2, 3), "int32"))
    >>> tuple(logits.shape)
    (2, 3, 8)
    """

    def __init__(self, decoder, **kwargs):
        super().__init__(**kwargs)
        self.decoder = decoder

    def build(self, *args):
        if hasattr(self.decoder, "build") and not self.decoder.built:
            self.decoder.build()
        self.built = True

    def call(self, context, targets):
        return self.decoder.sequence_logits(context, targets[:, :-1])

    def get_config(self):
        config = super().get_config()
        config["decoder"] = keras.saving.serialize_keras_object(self.decoder)
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["decoder"] = keras.saving.deserialize_keras_object(config["decoder"])
        return cls(**config)
