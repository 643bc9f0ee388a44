"""`DecodingConstraint`: what a decode loop asks of a constraint.

`beam_search` and `ConstrainedBeamSearch` take any subclass: the automaton
layers (`AutomatonConstraint`: semantic IDs and string sets) and the
baselines the benchmarks measure them against (a CPU trie, PPV, a hash
bitmap). No Keras import: a baseline may be a plain object.
"""

from __future__ import annotations


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

    def candidates(self, log_probs, states, step: int, top_k: int | None = None):
        """`(scores, tokens, next_states)`, each `[R, K_t]`, for one step.

        Padding candidates have token -1, score `-inf`, state -1.
        """
        raise NotImplementedError

    def vocabulary_scores(self, log_probs, states, step: int):
        """`[R, V]`: `log_probs` with disallowed tokens at `-inf`, or None.

        A constraint returns the matrix at steps where it is cheap (a dense
        mask), and `advance` then gives the states after the chosen tokens.
        `beam_search` uses it where no per-beam cap applies: the best beams
        of a batch row are then one top-k over all its beams' tokens, not a
        top-k per beam followed by a second one. None (the default) means
        "use `candidates`".
        """
        return None

    def caps(self, step: int) -> bool:
        """Whether `top_k` caps the candidates of int `step` per row.

        Where it does, `beam_search` may ask for uncapped candidates
        (`top_k=None`) and apply the cap itself, ranking every beam's
        candidates at once (`layers.capped_top_k`); the result must be the
        same as the constraint's own cap: each row's best `top_k` by score,
        ties by position. False (the default): `top_k` is always passed.
        """
        return False

    def candidate_tokens(self, log_probs, states, step: int, top_k: int | None = None):
        """`(scores, tokens)`, each `[R, K_t]`, or None: `candidates` without
        the next states.

        A constraint returns them at steps where a candidate's next state
        costs a cold read of a large table (a dense head's state map: one
        per candidate, R x K_t of them), and `beam_search` then `advance`s
        only the survivors (R). None (the default) means "use
        `candidates`".
        """
        return None

    def advance(self, states, tokens, step):
        """The state after appending `tokens [R]` to each row (-1 if not allowed)."""
        raise NotImplementedError

    def item_ids(self, states):
        """Catalogue ids of final states, -1 for the others."""
        raise ValueError(f"{type(self).__name__} has no item ids")
