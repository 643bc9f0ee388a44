"""`ConstrainedSampler`: keras-hub `CausalLM.generate` restricted to a valid set."""

from __future__ import annotations

import keras_hub
from keras import ops
from keras import random

from static_keras.decoding import finished_beams
from static_keras.index.automaton import TokenAutomaton
from static_keras.layers import AutomatonConstraint
from static_keras.layers import constraint_for

#: A constraint layer, or an index (`StaticIndex`, `StringIndex`) to build one from.
ConstraintOrIndex = AutomatonConstraint | TokenAutomaton


class ConstrainedSampler(keras_hub.samplers.Sampler):
    """Greedy or top-k sampling that only emits members of a valid set.

    Compile a keras-hub `CausalLM` with this sampler (`causal_lm.compile(
    sampler=ConstrainedSampler(index))`) and `generate()` answers with a
    member of the set: a string of a `StringIndex`, or a semantic ID of a
    `StaticIndex`. The sampler runs its own `ops.while_loop` (keras-hub's
    loop carries no per-row state) with one int32 automaton state per row,
    0 at the start of the answer. At each position, a row still inside its
    prompt (`padding_mask` True) keeps its prompt token and its state; the
    other rows get their logits masked by the constraint (disallowed tokens
    at the finite `MASKED_LOGIT`), pick a token (greedy when `k=1`, else
    top-k sampling at `temperature`) and advance their state with it.

    Once a row's automaton holds a complete member it emits the end token
    at every later position: for a string set the index's EOS (its accept
    state allows nothing else, so EOS is also what the model was allowed to
    pick); for a semantic-ID set (fixed length `constraint.length`, no EOS
    in the index) `end_token_id`, or else the first of the `stop_token_ids`
    given to `generate()`. The loop stops as keras-hub's does: when every
    row has generated one of the `stop_token_ids`, or at the end of the
    padded `token_ids` (unlike keras-hub's, padding that holds a stop id
    does not count as generated). Give the prompt room for `constraint.length` tokens
    (plus one end token for semantic IDs), or a long member is cut short.

    Args:
        constraint: the valid set: a `StringConstrainedDecoding` or
            `ConstrainedDecoding` layer, or the `StringIndex` or
            `StaticIndex` to build one from.
        k: int. Candidates of top-k sampling; 1 is greedy. Defaults to 1.
        temperature: float. Divides the logits before sampling. Defaults
            to 1.0.
        seed: int or None. Seed of top-k sampling. Defaults to None.
        end_token_id: int or None. The token a semantic-ID row emits after
            its member. For a string set it must be None or the index's
            EOS. Defaults to None (the first of `generate()`'s
            `stop_token_ids`).

    Call arguments:
        As `keras_hub.samplers.Sampler` (keras-hub's `generate_step` passes
        them): `next` (`(prompt, cache, index) -> (logits [B, V],
        hidden_states, cache)`), `prompt` int `[B, T]`, `cache`, `index`
        (first position to generate), `mask` bool `[B, T]` (True: prompt),
        `stop_token_ids`, `hidden_states`, `model`.

    Returns:
        int `[B, T]`: the prompt with each row's answer written after it.

    Example:

    >>> import keras, keras_hub, numpy as np
    >>> from static_keras import StringIndex, TokenVocabulary
    >>> vocab = TokenVocabulary.from_token_bytes(
    ...     [b"a", b"b", b"c", b"ab", b"bc", b"<eos>"], special=[5])
    >>> index = StringIndex.from_strings(["abc", "b", "cab"], vocab, eos_token_id=5)
    >>> keras.utils.set_random_seed(0)
    >>> backbone = keras_hub.models.GPT2Backbone(
    ...     vocabulary_size=6, num_layers=1, num_heads=2, hidden_dim=8,
    ...     intermediate_dim=16, max_sequence_length=16)
    >>> causal_lm = keras_hub.models.GPT2CausalLM(backbone, preprocessor=None)
    >>> causal_lm.compile(sampler=ConstrainedSampler(index))
    >>> token_ids = np.zeros((2, 8), "int32")
    >>> padding_mask = np.arange(8) < 2  # a 2-token prompt per row
    >>> out = causal_lm.generate(
    ...     {"token_ids": token_ids, "padding_mask": np.stack([padding_mask] * 2)},
    ...     stop_token_ids=[5])
    >>> answers = [row[2:].tolist() for row in out["token_ids"]]
    >>> [vocab.decode(a[: a.index(5)]).decode() in index.strings for a in answers]
    [True, True]
    """

    def __init__(
        self,
        constraint: ConstraintOrIndex,
        *,
        k: int = 1,
        temperature: float = 1.0,
        seed: int | None = None,
        end_token_id: int | None = None,
    ):
        super().__init__(temperature=positive_float(temperature, "temperature"))
        self.constraint = as_constraint(constraint)
        self.k = positive_int(k, "k")
        if self.k > self.constraint.vocab_size:
            raise ValueError(
                f"`k` must be at most the vocabulary size {self.constraint.vocab_size}. "
                f"Received: k={k}"
            )
        self.seed = seed
        self.end_token_id = check_end_token(self.constraint, end_token_id)
        if self.k > 1:
            self.seed_generator = random.SeedGenerator(seed)

    def __call__(
        self,
        next,
        prompt,
        cache=None,
        index=0,
        mask=None,
        stop_token_ids=None,
        hidden_states=None,
        model=None,
        **kwargs,
    ):
        max_length = ops.cast(ops.shape(prompt)[-1], "int32")
        index = ops.cast(index, "int32")
        mask = ops.zeros_like(prompt, dtype="bool") if mask is None else ops.cast(mask, "bool")
        # `ops.while_loop` does not accept None in `loop_vars`.
        cache = () if cache is None else cache
        end_token = end_token_for(self.constraint, self.end_token_id, stop_token_ids)
        states = ops.zeros_like(prompt[:, 0], dtype="int32")

        def cond(prompt, cache, index, mask, states):
            if stop_token_ids is None:
                return ops.convert_to_tensor(True, dtype="bool")
            return ops.logical_not(all_stopped(prompt, mask, stop_token_ids, index))

        def body(prompt, cache, index, mask, states):
            logits, _, cache = next(prompt, cache, index)
            token, next_states = self._constrained_token(logits, states, end_token)
            in_prompt = ops.take(mask, index, axis=1)
            token = ops.where(
                in_prompt, ops.take(prompt, index, axis=1), ops.cast(token, prompt.dtype)
            )
            states = ops.where(in_prompt, states, next_states)
            prompt = ops.slice_update(prompt, [0, index], token[:, None])
            return prompt, cache, index + 1, mask, states

        prompt, *_ = self.run_loop(
            cond,
            body,
            loop_vars=(prompt, cache, index, mask, states),
            maximum_iterations=max_length - index,
            model=model,
        )
        return prompt

    def _constrained_token(self, logits, states, end_token: int):
        """`(token, next_state)` of each generating row, both int32 `[B]`: a
        row holding a complete member writes `end_token` and keeps its state
        (`finished_beams`)."""
        finished = self.constraint.is_finished(states)
        masked = self.constraint.mask_logits(logits, states, step=None)
        token = ops.cast(self.get_next_token(self.compute_probabilities(masked)), "int32")
        token = finished_beams.finished_tokens(finished, end_token, token)
        advanced = self.constraint.advance(states, token, step=None)
        return token, finished_beams.held_states(finished, states, advanced)

    def get_next_token(self, probabilities):
        """The argmax (`k=1`) or a top-k sample of each row of `probabilities`.

        Disallowed tokens have probability 0 (their logit is `MASKED_LOGIT`),
        so a sample never picks one, even when fewer than `k` are allowed.
        """
        if self.k == 1:
            return ops.argmax(probabilities, axis=-1)
        top, indices = ops.top_k(probabilities, k=self.k, sorted=False)
        sample = random.categorical(
            ops.log(top), 1, seed=self.seed_generator, dtype="int32"
        )  # log(0) = -inf: never drawn
        return ops.squeeze(ops.take_along_axis(indices, sample, axis=-1), axis=-1)

    def get_config(self) -> dict:
        """The sampler's settings; the constraint (the index weights) is not
        part of it: rebuild with `ConstrainedSampler(constraint, **config)`."""
        config = super().get_config()
        config.update({"k": self.k, "seed": self.seed, "end_token_id": self.end_token_id})
        return config


def as_constraint(constraint: ConstraintOrIndex) -> AutomatonConstraint:
    """The constraint layer of `constraint` (a layer, or an index to build one)."""
    if not isinstance(constraint, (AutomatonConstraint, TokenAutomaton)):
        raise ValueError(
            "`constraint` must be a constraint layer (ConstrainedDecoding, "
            "StringConstrainedDecoding) or an index (StaticIndex, StringIndex). "
            f"Received: constraint={type(constraint).__name__}"
        )
    return constraint_for(constraint)


def check_end_token(constraint: AutomatonConstraint, end_token_id: int | None) -> int | None:
    """Validates `end_token_id` against the constraint; returns it as an int."""
    if end_token_id is None:
        return None
    if (
        isinstance(end_token_id, bool)
        or not isinstance(end_token_id, int)
        or not 0 <= end_token_id < constraint.vocab_size
    ):
        raise ValueError(
            f"`end_token_id` must be an int in [0, {constraint.vocab_size}). "
            f"Received: end_token_id={end_token_id!r}"
        )
    eos = constraint.eos_token_id
    if eos is not None and end_token_id != eos:
        raise ValueError(
            f"A string set ends with its EOS token {eos}: `end_token_id` must be None "
            f"or {eos}. Received: end_token_id={end_token_id}"
        )
    return int(end_token_id)


def end_token_for(constraint: AutomatonConstraint, end_token_id: int | None, stop_token_ids) -> int:
    """The token a row emits once its member is complete."""
    if constraint.eos_token_id is not None:
        return int(constraint.eos_token_id)
    if end_token_id is not None:
        return end_token_id
    if stop_token_ids:
        return int(stop_token_ids[0])
    raise ValueError(
        f"A semantic-ID set ends after {constraint.length} tokens and has no EOS: pass "
        "`end_token_id` to the sampler or `stop_token_ids` to `generate()`. "
        "Received: end_token_id=None, stop_token_ids=None"
    )


def all_stopped(prompt, mask, stop_token_ids, index):
    """bool scalar: whether every row has generated one of `stop_token_ids`.

    keras-hub's rule, counting only positions generated so far (before
    `index`, outside the prompt): keras-hub also counts the padding still
    ahead, so padding with a stop id (EOS as the pad token) would end
    `generate()` before its first token.
    """
    generated = ops.logical_and(
        ops.logical_not(mask), ops.arange(ops.shape(prompt)[1], dtype="int32")[None, :] < index
    )
    stopped = ops.zeros_like(mask)
    for token in stop_token_ids:
        stopped = ops.logical_or(stopped, ops.equal(prompt, token))
    return ops.all(ops.any(ops.logical_and(stopped, generated), axis=-1))


def positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"`{name}` must be a positive integer. Received: {name}={value!r}")
    return value


def positive_float(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"`{name}` must be a positive number. Received: {name}={value!r}")
    return float(value)
