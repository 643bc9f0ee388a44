"""`DecodingConstraint`: what a decode loop asks of a constraint.

`beam_search` and `ConstrainedBeamSearch` take any subclass: the automaton
layers (`AutomatonConstraint`: semantic IDs and string sets) and the
baselines the benchmarks measure them against (a CPU trie, PPV, a hash
bitmap). No Keras import: a baseline may be a plain object.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

#: The default of the deprecated `top_k` keyword: not passed.
NOT_GIVEN = object()


def dense_top_k_argument(dense_top_k, top_k, method: str):
    """The tokens-per-beam setting a step method was given: `dense_top_k`,
    or the value of `top_k`, its deprecated name, with a DeprecationWarning
    (`top_k` is `NOT_GIVEN` when the caller did not pass it)."""
    if top_k is NOT_GIVEN:
        return dense_top_k
    if dense_top_k is not None:
        raise TypeError(f"`{method}` got `dense_top_k` and its deprecated name `top_k`")
    warnings.warn(
        f"`{method}(top_k=...)` is deprecated: pass `dense_top_k=...`, the name "
        "`beam_search` gives the same setting (tokens kept per beam)",
        DeprecationWarning,
        stacklevel=3,
    )
    return top_k


@dataclasses.dataclass(frozen=True)
class StepProposal:
    """A constraint's answer for one step of a beam search (`propose`).

    Attributes:
        scores: float32 `[rows, K]` candidate scores, or `[rows, V]` (the
            whole vocabulary, `-inf` where disallowed) when `tokens` is None.
        tokens: int32 `[rows, K]`, or None: the column is the token.
        next_states: int32 `[rows, K]`, or None: the search `advance`s the
            survivors (where a candidate's next state is a cold table read).
        needs_cap: whether the search still caps each row at `dense_top_k`
            tokens (ranking whole batch rows, `capped_top_k`).
    """

    scores: Any
    tokens: Any = None
    next_states: Any = None
    needs_cap: bool = False


class DecodingConstraint:
    """Base of every constraint a decode loop can run (see the module doc).

    Subclasses provide `length` (an int attribute or property: decoding
    steps) and `candidates`; the defaults below describe a fixed-length set
    without item ids.
    """

    length: int

    #: Token that ends a member (variable-length sets), or None.
    eos_token_id: int | None = None
    #: Whether `item_ids(states)` maps final states to catalogue ids.
    has_item_ids: bool = False

    def candidates(self, log_probs, states, step: int, dense_top_k: int | None = None):
        """`(scores, tokens, next_states)`, each `[R, K_t]`, for one step.

        `dense_top_k`: int or None, tokens kept per row (a beam search's
        `dense_top_k`, passed positionally: a subclass may name it as it
        likes). Padding candidates have token -1, score `-inf`, state -1.
        """
        raise NotImplementedError

    def propose(
        self,
        log_probs,
        states,
        step: int,
        dense_top_k: int | None = None,
        *,
        eligibility=None,
        need_next_states: bool = False,
        rank_rows: bool = False,
        top_k=NOT_GIVEN,
    ) -> StepProposal:
        """One step of a beam search, in the form cheapest for this constraint.

        Args:
            log_probs: float32 `[R, V]` scores of the next token.
            states: int32 `[R]`.
            step: int, the tokens decoded so far.
            dense_top_k: int or None: tokens kept per row, as in
                `candidates` (a beam search's `dense_top_k`, where it binds;
                None: no cap binds).
            eligibility: a request's eligibility (constraints that hold
                sets), or None.
            need_next_states: whether the search needs every candidate's
                next state (a variable-length set's finished beams).
            rank_rows: whether the search may apply a binding `dense_top_k`
                itself by ranking whole batch rows (`needs_cap` in the answer).
            top_k: deprecated name of `dense_top_k`.

        The default: `candidates`.
        """
        dense_top_k = dense_top_k_argument(dense_top_k, top_k, "propose")
        kwargs = {} if eligibility is None else {"eligibility": eligibility}
        return StepProposal(*self.candidates(log_probs, states, step, dense_top_k, **kwargs))

    def advance(self, states, tokens, step):
        """The state after appending `tokens [R]` to each row (-1 if not allowed)."""
        raise NotImplementedError

    def item_ids(self, states):
        """Catalogue ids of final states, -1 for the others."""
        raise ValueError(f"{type(self).__name__} has no item ids")
