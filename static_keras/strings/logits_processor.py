"""`StringLogitsProcessor`: a stateless string constraint for any decode loop.

Host-side NumPy. The caller keeps one int state per row (0 at the start of
the answer) and, at each step, asks for masked logits (or candidates, or an
XGrammar-style bitmask), picks tokens however it likes (greedy, sampling,
beam search), then asks for the next states. Nothing is stored between
calls, so rows can be added, dropped or reordered freely.

Per-request subsets: every query also takes, per row, an eligibility set
(`set_ids`, rows of the processor's `EligibilitySets`) and excluded members
(`excluded_item_ids` or `excluded_members`); a token is then allowed only if
the state it leads to still has an eligible, non-excluded member below it
(`member_ranges` of that state, a rank difference over the set's bits).
Without them the unrestricted path runs, unchanged.
"""

from __future__ import annotations

import numpy as np

from static_keras.constants import MASKED_LOGIT
from static_keras.index.eligibility import EligibilitySets
from static_keras.index.member_catalogue import MemberCatalogue
from static_keras.strings import host_restriction
from static_keras.strings.string_index import StringIndex


class StringLogitsProcessor:
    """Masks logits so that decoding spells exactly one member of a `StringIndex`.

    Per-request subsets (keyword arguments of `allowed`, `mask_logits`,
    `fill_bitmask`, `candidates` and `advance`, one entry per row, aligned
    with `states`; reorder them with the rows):

    - `set_ids`: int `[R]` (or one int for every row): the row of
      `eligibility` (`eligibility.set_id(name)`) each row must end in; -1
      (or None in a list) leaves a row unrestricted.
    - `excluded_item_ids`: int `[R, E]`, padded with -1: item ids (positions
      in the string list) a row must not end in (already shown, already
      bought). Duplicates and ids outside the catalogue are ignored.
    - `excluded_members`: int `[R, E]`, padded with -1: the same as member
      numbers (`[0, num_members)`, sorted order of the distinct strings).

    A token is allowed when the unrestricted index allows it and the state
    it leads to has at least one eligible, non-excluded member in its
    `member_ranges`; EOS leads to the member itself, so a row only ever
    finishes on an eligible, non-excluded member. A row with nothing left
    (an empty set, everything excluded) allows no token: `mask_logits`
    gives it `MASKED_LOGIT` everywhere, `candidates` token -1, `advance` -1.
    When `index.member_ranges_exact` is False (a vocabulary missing some
    single byte), the range of a state may cover members that cannot be
    spelled from it: a row may then enter a state whose remaining eligible
    members are unreachable and find no allowed token later (a dead end,
    state -1 after `advance`; stop such rows). It still never finishes on
    an ineligible or excluded member. With every single byte in the
    vocabulary (byte-level BPE, SentencePiece with byte fallback) ranges
    are exact and a restricted row that starts with an allowed token always
    finishes.

    Args:
        index: `StringIndex`.
        eligibility: `EligibilitySets` built over `index`, or None (then
            only exclusions apply). Defaults to None.

    Example (greedy decoding with a random "model"):

    >>> from static_keras.strings import TokenVocabulary
    >>> vocab = TokenVocabulary.from_token_bytes(
    ...     [b"c", b"a", b"t", b"ca", b"at", b"d", b"o", b"g", b"do", b"."],
    ...     special=[9])
    >>> index = StringIndex.from_strings(["cat", "dog"], vocab, eos_token_id=9)
    >>> processor = StringLogitsProcessor(index)
    >>> rng = np.random.default_rng(0)
    >>> states, out = processor.initial_states(3), [[], [], []]
    >>> while not processor.is_finished(states).all():
    ...     logits = processor.mask_logits(rng.normal(size=(3, 10)), states)
    ...     tokens = logits.argmax(axis=1)
    ...     states = processor.advance(states, tokens)
    ...     for row, token in enumerate(tokens):
    ...         out[row].append(int(token))
    >>> sorted({vocab.decode(row).decode() for row in out}) <= ["cat", "dog"]
    True

    Per-request subsets (row 0 only "dog", row 1 anything but "cat"):

    >>> sets = EligibilitySets.build(index, {"dogs": [1]})
    >>> processor = StringLogitsProcessor(index, eligibility=sets)
    >>> allowed = processor.allowed(
    ...     processor.initial_states(2), set_ids=[sets.set_id("dogs"), -1],
    ...     excluded_item_ids=[[-1], [0]])
    >>> [[vocab.token_bytes[t] for t in np.flatnonzero(row)] for row in allowed]
    [[b'd', b'do'], [b'd', b'do']]
    """

    def __init__(self, index: StringIndex, eligibility: EligibilitySets | None = None):
        if not isinstance(index, StringIndex):
            raise ValueError(f"`index` must be a StringIndex. Received: {type(index).__name__}")
        self.index = index
        self.eligibility = host_restriction.checked_eligibility(index, eligibility)
        self._catalogue = None if eligibility is None else eligibility.catalogue

    @property
    def eos_token_id(self) -> int:
        return self.index.eos_token_id

    @property
    def vocab_size(self) -> int:
        return self.index.vocab_size

    def initial_states(self, rows: int) -> np.ndarray:
        """int32 `[rows]` zeros: the state before the first token."""
        return np.zeros(int(rows), np.int32)

    def allowed(
        self, states, *, set_ids=None, excluded_item_ids=None, excluded_members=None
    ) -> np.ndarray:
        """bool `[R, V]`: the allowed tokens of each row (per-request subsets:
        see the class docstring)."""
        if set_ids is None and excluded_item_ids is None and excluded_members is None:
            return self.index.allowed_tokens(states)
        states = _row_states(states)
        restriction = self._restriction(states.size, set_ids, excluded_item_ids, excluded_members)
        row, tokens, nxt = self.index.edges(states)
        keep = self._enterable(restriction, row, nxt)
        out = np.zeros((states.size, self.vocab_size), bool)
        out[row[keep], tokens[keep]] = True
        return out

    def mask_logits(
        self, logits, states, *, set_ids=None, excluded_item_ids=None, excluded_members=None
    ) -> np.ndarray:
        """float32 `[R, V]`: `logits` with disallowed tokens at `MASKED_LOGIT`
        (finite, so a softmax over a row never turns into NaN)."""
        logits = np.asarray(logits, np.float32)
        allowed = self.allowed(
            states,
            set_ids=set_ids,
            excluded_item_ids=excluded_item_ids,
            excluded_members=excluded_members,
        )
        if logits.shape != allowed.shape:
            raise ValueError(f"`logits` must have shape {allowed.shape}. Received {logits.shape}")
        return np.where(allowed, logits, np.float32(MASKED_LOGIT))

    def fill_bitmask(
        self,
        states,
        out: np.ndarray | None = None,
        set_ids=None,
        excluded_item_ids=None,
        excluded_members=None,
    ) -> np.ndarray:
        """int32 `[R, ceil(V / 32)]`: the allowed tokens as bits (XGrammar's layout).

        With per-request subsets (pass them by name), the unrestricted row is
        written, then the bits of the tokens whose next state has nothing
        left are cleared."""
        # Not keyword-only, unlike the other methods: CPython 3.11 does not
        # specialise calls to a function with keyword-only defaults, a cost
        # this per-step hot path feels.
        if set_ids is None and excluded_item_ids is None and excluded_members is None:
            return self.index.fill_bitmask(states, out)
        rows = _row_states(states)
        restriction = self._restriction(rows.size, set_ids, excluded_item_ids, excluded_members)
        out = self.index.fill_bitmask(states, out)
        row, tokens, nxt = self.index.edges(rows)
        drop = ~self._enterable(restriction, row, nxt)
        if drop.any():
            tokens = tokens[drop].astype(np.uint32)
            bits = np.left_shift(np.uint32(1), tokens & np.uint32(31))
            np.bitwise_and.at(out.view(np.uint32), (row[drop], tokens >> 5), ~bits)
        return out

    def candidates(
        self,
        logits,
        states,
        top_k: int | None = None,
        *,
        set_ids=None,
        excluded_item_ids=None,
        excluded_members=None,
    ):
        """`(scores, tokens, next_states)`, each `[R, K]`, best first.

        `K` is the largest number of allowed tokens among the rows (or
        `top_k`, if smaller); padding has score `-inf`, token -1, state -1.
        """
        logits = np.asarray(logits, np.float32)
        states = np.asarray(states).reshape(-1)
        row, tokens, nxt = self.index.edges(states)
        if not (set_ids is None and excluded_item_ids is None and excluded_members is None):
            restriction = self._restriction(
                states.size, set_ids, excluded_item_ids, excluded_members
            )
            keep = self._enterable(restriction, row, nxt)
            row, tokens, nxt = row[keep], tokens[keep], nxt[keep]
        counts = np.bincount(row, minlength=states.size)
        width = max(1, int(counts.max(initial=0)))
        if top_k is not None:
            width = max(1, min(width, int(top_k)))
        scores = logits[row, tokens]
        # Best first within each row: sort by (row, -score).
        order = np.lexsort((-scores, row))
        row, tokens, nxt, scores = row[order], tokens[order], nxt[order], scores[order]
        first = np.cumsum(counts) - counts
        slot = np.arange(row.size) - first[row]
        keep = slot < width
        out_scores = np.full((states.size, width), -np.inf, np.float32)
        out_tokens = np.full((states.size, width), -1, np.int32)
        out_states = np.full((states.size, width), -1, np.int32)
        out_scores[row[keep], slot[keep]] = scores[keep]
        out_tokens[row[keep], slot[keep]] = tokens[keep]
        out_states[row[keep], slot[keep]] = nxt[keep]
        return out_scores, out_tokens, out_states

    def advance(
        self, states, tokens, *, set_ids=None, excluded_item_ids=None, excluded_members=None
    ) -> np.ndarray:
        """int32 `[R]`: the next states; -1 where a token is not allowed
        (with per-request subsets: also where it leaves nothing eligible)."""
        if set_ids is None and excluded_item_ids is None and excluded_members is None:
            return self.index.next_states(states, tokens)
        rows = _row_states(states)
        restriction = self._restriction(rows.size, set_ids, excluded_item_ids, excluded_members)
        nxt = self.index.next_states(states, tokens)
        keep = self._enterable(restriction, np.arange(rows.size), nxt)
        return np.where(keep, nxt, -1).astype(nxt.dtype, copy=False)

    def is_finished(self, states) -> np.ndarray:
        """bool `[R]`: rows that have emitted EOS."""
        return self.index.is_finished(states)

    def item_ids(self, states) -> np.ndarray:
        """int32 `[R]`: the member (position in the caller's list) of finished
        rows, -1 for the others."""
        return self.index.item_ids(states)

    # Per-request subsets -------------------------------------------------------

    @property
    def catalogue(self) -> MemberCatalogue:
        """Item id -> member number map of the index (the sets', when given)."""
        if self._catalogue is None:
            self._catalogue = MemberCatalogue.from_index(self.index)
        return self._catalogue

    def _restriction(self, rows: int, set_ids, excluded_item_ids, excluded_members):
        return host_restriction.restriction(
            self.index, self.eligibility, lambda: self.catalogue, rows, set_ids,
            excluded_item_ids, excluded_members,
        )  # fmt: skip

    def _enterable(self, restriction, rows, states) -> np.ndarray:
        return host_restriction.enterable(self.index, self.eligibility, restriction, rows, states)


def _row_states(states) -> np.ndarray:
    array = np.asarray(states)
    if array.size and (array.dtype == bool or not np.issubdtype(array.dtype, np.integer)):
        raise ValueError(f"`states` must hold integers. Received dtype {array.dtype}")
    return array.astype(np.int64, copy=False).reshape(-1)
