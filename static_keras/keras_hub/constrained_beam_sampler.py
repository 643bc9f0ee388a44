"""`ConstrainedBeamSampler`: keras-hub beam search restricted to a valid set."""

from __future__ import annotations

import keras_hub
import numpy as np
from keras import ops
from keras import tree

from static_keras.constraint.eligibility_request import Eligibility
from static_keras.decoding import finished_beams
from static_keras.keras_hub.constrained_sampler import ConstraintOrIndex
from static_keras.keras_hub.constrained_sampler import all_stopped
from static_keras.keras_hub.constrained_sampler import as_constraint
from static_keras.keras_hub.constrained_sampler import check_end_token
from static_keras.keras_hub.constrained_sampler import end_token_for
from static_keras.keras_hub.constrained_sampler import positive_int


class ConstrainedBeamSampler(keras_hub.samplers.Sampler):
    """Beam search inside `CausalLM.generate` that only keeps valid beams.

    The constrained counterpart of `keras_hub.samplers.BeamSampler`: each of
    the `num_beams` beams of a row carries an int32 automaton state (0 at the
    start of the answer). At each position a beam's candidates are the
    tokens the constraint allows, scored by the beam's total log-probability
    plus the token's log-softmax (float32, over the whole vocabulary, so a
    score is the model's log-probability of the answer); the best
    `num_beams` extensions of the row survive, and the KV cache, the tokens
    AND the automaton states are reordered by parent beam. A disallowed
    token is never chosen: where fewer valid extensions exist than beams,
    the spare beams are dead (score `-inf`, state `INVALID_STATE`, end
    tokens written).

    Rows still inside their prompt (`padding_mask` True) keep the prompt
    token, their states and their scores. A beam whose member is complete
    is frozen: it writes the end token (the EOS of a string set, whose
    log-probability counts once, as the member's last token; for a
    semantic-ID set `end_token_id`, else the first of the `stop_token_ids`,
    at no cost) and keeps its score. The loop stops as `ConstrainedSampler`'s
    does: when every beam has generated a stop id, or at the end of
    `token_ids`.
    With `num_beams` at least the number of valid token sequences (every
    tokenization of every member of a string set) the best beam is the
    best member by total log-probability.

    Args:
        constraint: the valid set: a `StringConstrainedDecoding` or
            `ConstrainedDecoding` layer, or the `StringIndex` or
            `StaticIndex` to build one from.
        num_beams: int. Beams kept per row.
        return_all_beams: bool. When True, calling the sampler returns
            `(token_ids [B, num_beams, T], log_probs [B, num_beams])`, best
            first, instead of the best beam (`generate()` needs False).
            Defaults to False.
        end_token_id: int or None. As in `ConstrainedSampler`. Defaults to
            None.
        distinct_items: bool. As in `beam_search`: a finished beam whose
            member a better finished beam holds is dropped at every step,
            so `return_all_beams` lists each member once, with its best
            tokenization found (string sets spell a member several ways).
            Defaults to False (every tokenization, as before this option).
        eligibility_set: str, int or None. Only members of this set of the
            constraint's `EligibilitySets` (a name or a set id) are
            generated, for every row: `generate()` takes no per-request
            arguments, so a sampler serves one set (compile the model with
            another sampler for another set). Defaults to None.
        excluded_item_ids: ints or None. Item ids (positions in a string
            list) never generated, for every row. Defaults to None.

    Call arguments:
        As `keras_hub.samplers.Sampler`: `next`, `prompt` int `[B, T]`,
        `cache` (leading dimension B), `index`, `mask` bool `[B, T]`,
        `stop_token_ids`, `hidden_states`, `model`.

    Returns:
        int `[B, T]`, the best beam of each row; or, with
        `return_all_beams=True`, `(token_ids [B, num_beams, T], log_probs
        float32 [B, num_beams])` sorted by score.

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
    >>> causal_lm.compile(sampler=ConstrainedBeamSampler(index, num_beams=4))
    >>> inputs = {"token_ids": np.zeros((1, 8), "int32"),
    ...           "padding_mask": np.arange(8)[None] < 2}
    >>> row = causal_lm.generate(inputs, stop_token_ids=[5])["token_ids"][0, 2:]
    >>> vocab.decode(row[: row.tolist().index(5)]).decode() in index.strings
    True
    """

    def __init__(
        self,
        constraint: ConstraintOrIndex,
        *,
        num_beams: int,
        return_all_beams: bool = False,
        end_token_id: int | None = None,
        distinct_items: bool = False,
        eligibility_set: str | int | None = None,
        excluded_item_ids=None,
    ):
        super().__init__()
        self.constraint = as_constraint(constraint)
        self.num_beams = positive_int(num_beams, "num_beams")
        self.return_all_beams = bool(return_all_beams)
        self.end_token_id = check_end_token(self.constraint, end_token_id)
        self.distinct_items = bool(distinct_items)
        self.eligibility_set = eligibility_set
        self.excluded_item_ids = None if excluded_item_ids is None else list(excluded_item_ids)
        self._request = _request(self.constraint, eligibility_set, self.excluded_item_ids)

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
        beams = self.num_beams
        batch_size, max_length = ops.shape(prompt)[0], ops.shape(prompt)[1]
        index = ops.cast(index, "int32")
        mask = ops.zeros_like(prompt, dtype="bool") if mask is None else ops.cast(mask, "bool")
        end_token = end_token_for(self.constraint, self.end_token_id, stop_token_ids)
        has_cache = cache is not None
        # Beam m of row b is row b * beams + m; `ops.while_loop` takes no None.
        prompt, mask = _repeat(prompt, beams), _repeat(mask, beams)
        cache = tree.map_structure(lambda x: _repeat(x, beams), cache) if has_cache else ()
        # One live beam per row at the start: the others would only repeat it.
        first = np.array([[0.0] + [-np.inf] * (beams - 1)], "float32")
        log_probs = ops.reshape(ops.broadcast_to(first, (batch_size, beams)), (-1,))
        states = ops.zeros_like(prompt[:, 0], dtype="int32")

        def cond(prompt, cache, index, mask, log_probs, states):
            if stop_token_ids is None:
                return ops.convert_to_tensor(True, dtype="bool")
            return ops.logical_not(all_stopped(prompt, mask, stop_token_ids, index))

        def body(prompt, cache, index, mask, log_probs, states):
            logits, _, cache = next(prompt, cache, index)
            in_prompt = ops.take(mask, index, axis=1)
            prompt_token = ops.cast(ops.take(prompt, index, axis=1), "int32")
            scores, forced = self._candidate_scores(
                logits, states, in_prompt, prompt_token, end_token
            )
            log_probs, parent, token = self._top_beams(log_probs, scores)
            prompt = ops.take(prompt, parent, axis=0)
            if has_cache:
                cache = tree.map_structure(lambda x: ops.take(x, parent, axis=0), cache)
            parent_states = ops.take(states, parent)
            advanced = self.constraint.advance(parent_states, token, step=None)
            states = finished_beams.held_states(ops.take(forced, parent), parent_states, advanced)
            if self.distinct_items:  # the same member as a better finished beam: dead
                finished = self.constraint.is_finished(states)
                repeat = finished_beams.repeated_finished(states, finished, beams)
                log_probs = ops.where(repeat, -np.inf, log_probs)
            live = ops.logical_not(ops.equal(log_probs, -np.inf))
            token, states = finished_beams.bury_dead(live, token, states, end_token)
            token = ops.where(in_prompt, prompt_token, token)  # mask is the same for all beams
            prompt = ops.slice_update(prompt, [0, index], ops.cast(token, prompt.dtype)[:, None])
            return prompt, cache, index + 1, mask, log_probs, states

        prompt, _, _, _, log_probs, _ = self.run_loop(
            cond,
            body,
            loop_vars=(prompt, cache, index, mask, log_probs, states),
            maximum_iterations=max_length - index,
            model=model,
        )
        return self._result(prompt, log_probs, max_length)

    def _top_beams(self, log_probs, scores):
        """`(log_probs, parent, token)`, each `[R]`: the best `num_beams` of
        each batch row's beams x next tokens (`scores [R, V]`)."""
        beams = self.num_beams
        vocab_size = ops.shape(scores)[-1]
        total = ops.reshape(log_probs[:, None] + scores, (-1, beams * vocab_size))
        # Sorted where finished beams are told apart by rank (`distinct_items`).
        top, choice = ops.top_k(total, k=beams, sorted=self.distinct_items)
        choice = ops.cast(choice, "int32")
        parent = ops.reshape(
            ops.arange(ops.shape(choice)[0], dtype="int32")[:, None] * beams + choice // vocab_size,
            (-1,),
        )
        return ops.reshape(top, (-1,)), parent, ops.reshape(choice % vocab_size, (-1,))

    def _result(self, prompt, log_probs, max_length):
        """The best beam of each row, or (`return_all_beams`) every beam with
        its log-probability, best first."""
        all_prompts = ops.reshape(prompt, (-1, self.num_beams, max_length))
        all_log_probs = ops.reshape(log_probs, (-1, self.num_beams))
        if self.return_all_beams:
            order = ops.argsort(-all_log_probs, axis=-1)
            return (
                ops.take_along_axis(all_prompts, order[:, :, None], axis=1),
                ops.take_along_axis(all_log_probs, order, axis=1),
            )
        best = ops.argmax(all_log_probs, axis=-1)[:, None, None]
        return ops.squeeze(ops.take_along_axis(all_prompts, best, axis=1), axis=1)

    def _candidate_scores(self, logits, states, in_prompt, prompt_token, end_token: int):
        """`(scores [R, V], forced [R])`: what each beam adds per next token.

        A forced beam (in its prompt, or holding a complete member) has one
        candidate, its prompt or end token, at 0 (`finished_beams`); the
        others have the log-softmax of the allowed tokens, `-inf` elsewhere.
        """
        logits = ops.cast(logits, "float32")
        allowed = self.constraint.allowed_mask(states, step=None, eligibility=self._rows(states))
        scores = ops.where(allowed, ops.log_softmax(logits, axis=-1), -np.inf)
        finished = self.constraint.is_finished(states)
        forced = ops.logical_or(in_prompt, finished)
        forced_token = ops.where(in_prompt, prompt_token, end_token)
        return finished_beams.only_candidate(scores, forced, forced_token), forced

    def _rows(self, states):
        """The request's eligibility for every row of `states`, or None."""
        if self._request is None:
            return None
        set_id, members = self._request
        rows = ops.shape(states)[0]
        set_ids = ops.full((rows,), set_id, dtype="int32")
        excluded = ops.broadcast_to(ops.convert_to_tensor(members), (rows, members.shape[1]))
        return Eligibility(set_ids, excluded)

    def get_config(self) -> dict:
        """The sampler's settings; the constraint (the index weights) is not
        part of it: rebuild with `ConstrainedBeamSampler(constraint, **config)`."""
        return {
            "num_beams": self.num_beams,
            "return_all_beams": self.return_all_beams,
            "end_token_id": self.end_token_id,
            "distinct_items": self.distinct_items,
            "eligibility_set": self.eligibility_set,
            "excluded_item_ids": self.excluded_item_ids,
        }


def _repeat(x, beams: int):
    return ops.repeat(x, beams, axis=0)


def _request(constraint, eligibility_set, excluded_item_ids):
    """`(set id, excluded member numbers int32 [1, E])` for every row, or None."""
    if eligibility_set is None and excluded_item_ids is None:
        return None
    set_id = -1
    if eligibility_set is not None:
        names = tuple(constraint.eligibility_names or ())
        if isinstance(eligibility_set, str):
            if eligibility_set not in names:
                raise ValueError(
                    f"No eligibility set {eligibility_set!r} in the constraint (sets: "
                    f"{list(names)}); build it with `eligibility=EligibilitySets.build(...)`"
                )
            set_id = names.index(eligibility_set)
        elif not 0 <= int(eligibility_set) < constraint.num_eligibility_sets:
            raise ValueError(
                f"`eligibility_set` must name one of the constraint's "
                f"{constraint.num_eligibility_sets} sets. Received: {eligibility_set!r}"
            )
        else:
            set_id = int(eligibility_set)
    if not constraint.num_eligibility_sets:
        raise ValueError(
            "`eligibility_set` and `excluded_item_ids` need a constraint built with "
            "eligibility sets (`eligibility=EligibilitySets.build(index, sets)`)"
        )
    ids = np.asarray([] if excluded_item_ids is None else excluded_item_ids, np.int64)
    members = constraint.catalogue().exclusion_members(ids.reshape(1, -1), width=max(ids.size, 1))
    return set_id, members.astype(np.int32)
