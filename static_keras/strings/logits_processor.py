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
        self.eligibility = _checked_eligibility(index, eligibility)
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
        """`(set of each row int64 [R], -1: none; sorted keys row * (M + 1) +
        member of the excluded members that count: distinct, eligible in
        the row's set)`."""
        sets = self._set_ids(set_ids, rows)
        num_members = self.index.num_members
        keys = []
        if excluded_item_ids is not None:
            raw = _excluded(excluded_item_ids, rows, "excluded_item_ids")
            if raw.size:
                query, member = self.catalogue.lookup(raw)
                keys.append((query // raw.shape[1]) * (num_members + 1) + member)
        if excluded_members is not None:
            raw = _excluded(excluded_members, rows, "excluded_members")
            if raw.size and (raw.min() < -1 or raw.max() >= num_members):
                raise ValueError(
                    f"`excluded_members` must lie in [0, {num_members}) (member numbers), "
                    f"padded with -1. Received values in [{raw.min()}, {raw.max()}]"
                )
            flat = raw.reshape(-1)
            where = np.flatnonzero(flat >= 0)
            if where.size:
                keys.append((where // raw.shape[1]) * (num_members + 1) + flat[where])
        keys = np.unique(np.concatenate(keys)) if keys else np.zeros(0, np.int64)
        if keys.size and self.eligibility is not None:
            row, member = np.divmod(keys, num_members + 1)
            counted = np.ones(keys.size, bool)
            restricted = np.flatnonzero(sets[row] >= 0)
            counted[restricted] = self.eligibility.contains(
                sets[row[restricted]], member[restricted]
            )
            keys = keys[counted]
        return sets, keys

    def _set_ids(self, set_ids, rows: int) -> np.ndarray:
        if set_ids is None:
            return np.full(rows, -1, np.int64)
        array = np.asarray(set_ids)
        if array.dtype == object:
            array = np.array([-1 if v is None else v for v in array.reshape(-1)])
            array = array.reshape(np.shape(set_ids))
        if array.size and (array.dtype == bool or not np.issubdtype(array.dtype, np.integer)):
            raise ValueError(
                f"`set_ids` must hold integers (-1: no restriction). Received dtype {array.dtype}"
            )
        if array.ndim == 0:
            array = np.full(rows, int(array), np.int64)
        elif array.shape != (rows,):
            raise ValueError(
                f"`set_ids` must have shape ({rows},), one per row of `states`. "
                f"Received shape {array.shape}"
            )
        array = array.astype(np.int64, copy=False)
        names = () if self.eligibility is None else self.eligibility.names
        bad = (array < -1) | (array >= len(names))
        if bad.any():
            value = int(array[np.flatnonzero(bad)[0]])
            if not names:
                raise ValueError(
                    "`set_ids` needs eligibility sets: this processor has none (only -1 is "
                    "valid). Make it with StringLogitsProcessor(index, eligibility="
                    f"EligibilitySets.build(index, {{name: item_ids}})). Received: {value}"
                )
            raise ValueError(
                f"`set_ids` must lie in [-1, {len(names)}) (-1: no restriction; sets "
                f"{list(names)}). Received: {value}"
            )
        return array

    def _enterable(self, restriction, rows, states) -> np.ndarray:
        """bool: whether `states[i]` (reached by row `rows[i]`) has an eligible,
        non-excluded member in its member range."""
        sets, keys = restriction
        lo, hi = self.index.member_ranges(states)
        row_sets = sets[rows]
        total = hi - lo
        restricted = np.flatnonzero(row_sets >= 0)
        if restricted.size:
            total[restricted] = self.eligibility.count(
                row_sets[restricted], lo[restricted], hi[restricted]
            )
        if keys.size:
            base = rows.astype(np.int64) * (self.index.num_members + 1)
            total -= np.searchsorted(keys, base + hi) - np.searchsorted(keys, base + lo)
        return total > 0


def _row_states(states) -> np.ndarray:
    array = np.asarray(states)
    if array.size and (array.dtype == bool or not np.issubdtype(array.dtype, np.integer)):
        raise ValueError(f"`states` must hold integers. Received dtype {array.dtype}")
    return array.astype(np.int64, copy=False).reshape(-1)


def _excluded(values, rows: int, name: str) -> np.ndarray:
    array = np.asarray(values)
    if array.size and (array.dtype == bool or not np.issubdtype(array.dtype, np.integer)):
        raise ValueError(f"`{name}` must hold integers (-1: padding). Received dtype {array.dtype}")
    if array.ndim != 2 or array.shape[0] != rows:
        raise ValueError(
            f"`{name}` must have shape ({rows}, E): one padded row per row of `states`. "
            f"Received shape {array.shape}"
        )
    return array.astype(np.int64, copy=False)


def _checked_eligibility(index: StringIndex, eligibility) -> EligibilitySets | None:
    if eligibility is None:
        return None
    if not isinstance(eligibility, EligibilitySets):
        raise ValueError(
            "`eligibility` must be EligibilitySets (EligibilitySets.build(index, {name: "
            f"item_ids}})) or None. Received: {type(eligibility).__name__}"
        )
    ids = index.archive_arrays()[index.layout.member_ids_array] if index.has_item_ids else None
    same = eligibility.num_members == index.num_members and (
        np.array_equal(eligibility.catalogue.item_ids, np.arange(index.num_members))
        if ids is None
        else np.array_equal(eligibility.catalogue.item_ids, ids)
    )
    if not same:
        raise ValueError(
            f"`eligibility` was built over another index ({eligibility.num_members} members, "
            f"this one has {index.num_members}, or its member -> item id map differs): "
            "build it with EligibilitySets.build(index, sets)"
        )
    return eligibility
