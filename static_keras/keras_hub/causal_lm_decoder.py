"""`CausalLMDecoder`: a keras-hub `CausalLM` as a step decoder for `beam_search`."""

from __future__ import annotations

import inspect

import keras
import keras_hub
import numpy as np
from keras import ops


class CausalLMDecoder:
    """Adapts a keras-hub `CausalLM` to the kit's step-decoder contract.

    `decoder(prefix, state) -> (logits, state)`: `prefix` int32 `[R, t]`
    holds the t answer tokens decoded so far, `logits` float32 `[R, V]`
    scores the next one, and `state` (a dict of tensors with leading
    dimension R) holds the prompt tokens, their lengths and the model's KV
    cache, so `static_keras.beam_search` (which reorders the state by
    parent beam) runs the model incrementally, one cached forward pass per
    step:

        decoder = CausalLMDecoder(causal_lm)
        state = decoder.initial_state(token_ids, padding_mask)
        out = beam_search(index, decoder, batch_size, beam_size, initial_state=state)

    `initial_state` takes the inputs of `generate()` without a preprocessor:
    right-padded `token_ids [B, T]` and `padding_mask [B, T]` (True on the
    prompt). `T` bounds the cache: it must be at least the longest prompt
    plus `index.length - 1`. A state of B rows is repeated to the R = B x
    beam rows of the first call (rows `b * beam + m`, beam search's order),
    so the same state works for any beam size.

    Prompts of different lengths in one batch work as in keras-hub: the
    cache API writes one position for all rows per forward pass, so a step
    runs one pass per distinct prompt length (`max - min + 1` passes; one
    when all prompts have the same length), each row taking its logits at
    its own position; positions past a row's answer hold stale keys that
    the causal mask hides until they are rewritten.

    keras-hub API used: `causal_lm.call_with_cache(token_ids, cache,
    cache_update_index)` (public, documented on each text `CausalLM`), and
    `causal_lm._build_cache(token_ids)` (private, but the one way every
    text `CausalLM` allocates and seeds its cache; its shape and layout are
    model-specific). Models whose `_build_cache` takes more inputs (images,
    encoder states) are not supported.

    Args:
        causal_lm: `keras_hub.models.CausalLM` with `call_with_cache` and a
            one-argument `_build_cache(token_ids)` (GPT-2, Llama, Gemma,
            Mistral, Qwen, ...).

    Call arguments:
        prefix: int32 `[R, t]`, the answer tokens so far (t static).
        state: dict from `initial_state` or a previous call.

    Returns:
        `(logits float32 [R, V], state)`.

    Example:

    >>> import keras, keras_hub, numpy as np
    >>> from static_keras import StringConstrainedDecoding, StringIndex
    >>> from static_keras import TokenVocabulary, beam_search
    >>> vocab = TokenVocabulary.from_token_bytes(
    ...     [b"a", b"b", b"c", b"ab", b"bc", b"<eos>"], special=[5])
    >>> index = StringIndex.from_strings(["abc", "b", "cab"], vocab, eos_token_id=5)
    >>> keras.utils.set_random_seed(0)
    >>> backbone = keras_hub.models.GPT2Backbone(
    ...     vocabulary_size=6, num_layers=1, num_heads=2, hidden_dim=8,
    ...     intermediate_dim=16, max_sequence_length=16)
    >>> decoder = CausalLMDecoder(
    ...     keras_hub.models.GPT2CausalLM(backbone, preprocessor=None))
    >>> state = decoder.initial_state(np.zeros((1, 8), "int32"), np.arange(8)[None] < 2)
    >>> constraint = StringConstrainedDecoding(index)
    >>> out = beam_search(constraint, decoder, 1, 4, initial_state=state)
    >>> sorted(index.lookup_item_ids(np.asarray(out["tokens"])[0]).tolist())  # 3 members
    [-1, 0, 1, 2]
    """

    def __init__(self, causal_lm: keras_hub.models.CausalLM):
        if not isinstance(causal_lm, keras_hub.models.CausalLM):
            raise ValueError(
                "`causal_lm` must be a keras_hub.models.CausalLM. "
                f"Received: causal_lm={type(causal_lm).__name__}"
            )
        build_cache = getattr(causal_lm, "_build_cache", None)
        if not callable(getattr(causal_lm, "call_with_cache", None)) or not callable(build_cache):
            raise ValueError(
                "`causal_lm` must offer `call_with_cache` and `_build_cache` (keras-hub's "
                f"cached decoding). Received: causal_lm={type(causal_lm).__name__}"
            )
        parameters = [
            p
            for p in inspect.signature(build_cache).parameters.values()
            if p.default is inspect.Parameter.empty
        ]
        if len(parameters) != 1:
            raise ValueError(
                f"`causal_lm` builds its cache from {[p.name for p in parameters]}; only "
                "text models whose `_build_cache` takes `token_ids` alone are supported. "
                f"Received: causal_lm={type(causal_lm).__name__}"
            )
        self.causal_lm = causal_lm

    def initial_state(self, token_ids, padding_mask) -> dict:
        """The state before the first answer token: prompts and their cache.

        Args:
            token_ids: int `[B, T]`, right-padded prompts (as `generate()`
                takes them without a preprocessor).
            padding_mask: bool `[B, T]`, True on each row's prompt (a
                prefix of the row, at least one token).

        Returns:
            dict with `token_ids` int32 `[B, T]`, `lengths` int32 `[B]` and
            `cache` (the model's KV cache, seeded with the prompts).
        """
        if isinstance(padding_mask, np.ndarray) or isinstance(token_ids, np.ndarray):
            _check_prompts(np.asarray(token_ids), np.asarray(padding_mask, bool))
        token_ids = ops.cast(token_ids, "int32")
        lengths = ops.sum(ops.cast(padding_mask, "int32"), axis=-1)
        _, cache = self.causal_lm._build_cache(token_ids)
        return {"token_ids": token_ids, "lengths": lengths, "cache": cache}

    def __call__(self, prefix, state: dict):
        step = prefix.shape[1]
        if step is None:
            raise ValueError(
                f"`prefix` must have a static length. Received shape {tuple(prefix.shape)}"
            )
        rows = ops.shape(prefix)[0]
        if step == 0:
            state = _repeat_rows(state, rows)
        token_ids, lengths, cache = state["token_ids"], state["lengths"], state["cache"]
        # Row r's answer token t sits at position lengths[r] + t.
        last = lengths + step - 1
        if step > 0:
            positions = ops.arange(ops.shape(token_ids)[1], dtype="int32")[None, :]
            token_ids = ops.where(
                ops.equal(positions, last[:, None]),
                ops.cast(prefix[:, -1:], "int32"),
                token_ids,
            )
        first, stop = ops.min(last), ops.max(last) + 1

        def forward(position, cache):
            tokens = ops.expand_dims(ops.take(token_ids, position, axis=1), 1)
            logits, _, cache = self.causal_lm.call_with_cache(tokens, cache, position)
            return ops.cast(logits[:, 0], "float32"), cache

        logits, cache = forward(first, cache)

        def body(position, carry):
            logits, cache = carry
            position_logits, cache = forward(position, cache)
            here = ops.equal(last, position)[:, None]
            return ops.where(here, position_logits, logits), cache

        logits, cache = ops.fori_loop(first + 1, stop, body, (logits, cache))
        return logits, {"token_ids": token_ids, "lengths": lengths, "cache": cache}


def _repeat_rows(state: dict, rows):
    """Repeats a state of B rows to `rows` = B x beam (batch-major)."""
    have = ops.shape(state["lengths"])[0]
    if isinstance(have, int) and isinstance(rows, int):
        if rows % have:
            raise ValueError(
                f"The state has {have} rows, which do not divide the {rows} rows of "
                "`prefix`: pass `decoder.initial_state(...)` of the batch"
            )
        if rows == have:
            return state
    return keras.tree.map_structure(lambda x: ops.repeat(x, rows // have, axis=0), state)


def _check_prompts(token_ids: np.ndarray, padding_mask: np.ndarray) -> None:
    if token_ids.ndim != 2 or padding_mask.shape != token_ids.shape:
        raise ValueError(
            "`token_ids` and `padding_mask` must both be [B, T]. Received shapes "
            f"{token_ids.shape} and {padding_mask.shape}"
        )
    lengths = padding_mask.sum(axis=1)
    if (lengths < 1).any():
        raise ValueError("`padding_mask` must mark at least one prompt token in every row")
    if not np.array_equal(padding_mask, np.arange(token_ids.shape[1]) < lengths[:, None]):
        raise ValueError("`padding_mask` must be True on a prefix of each row (right padding)")
    if lengths.max() >= token_ids.shape[1]:
        raise ValueError(
            f"`token_ids` must leave room for the answer after the longest prompt "
            f"({lengths.max()} of {token_ids.shape[1]} positions)"
        )
