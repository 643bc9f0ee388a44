"""`StringLogitsProcessor`: a stateless string constraint for any decode loop.

Host-side NumPy. The caller keeps one int state per row (0 at the start of
the answer) and, at each step, asks for masked logits (or candidates, or an
XGrammar-style bitmask), picks tokens however it likes (greedy, sampling,
beam search), then asks for the next states. Nothing is stored between
calls, so rows can be added, dropped or reordered freely.
"""

from __future__ import annotations

import numpy as np

from static_keras.constants import MASKED_LOGIT
from static_keras.strings.string_index import StringIndex


class StringLogitsProcessor:
    """Masks logits so that decoding spells exactly one member of a `StringIndex`.

    Args:
        index: `StringIndex`.

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
    """

    def __init__(self, index: StringIndex):
        if not isinstance(index, StringIndex):
            raise ValueError(f"`index` must be a StringIndex. Received: {type(index).__name__}")
        self.index = index

    @property
    def eos_token_id(self) -> int:
        return self.index.eos_token_id

    @property
    def vocab_size(self) -> int:
        return self.index.vocab_size

    def initial_states(self, rows: int) -> np.ndarray:
        """int32 `[rows]` zeros: the state before the first token."""
        return np.zeros(int(rows), np.int32)

    def allowed(self, states) -> np.ndarray:
        """bool `[R, V]`: the allowed tokens of each row."""
        return self.index.allowed_tokens(states)

    def mask_logits(self, logits, states) -> np.ndarray:
        """float32 `[R, V]`: `logits` with disallowed tokens at `MASKED_LOGIT`
        (finite, so a softmax over a row never turns into NaN)."""
        logits = np.asarray(logits, np.float32)
        allowed = self.allowed(states)
        if logits.shape != allowed.shape:
            raise ValueError(f"`logits` must have shape {allowed.shape}. Received {logits.shape}")
        return np.where(allowed, logits, np.float32(MASKED_LOGIT))

    def fill_bitmask(self, states, out: np.ndarray | None = None) -> np.ndarray:
        """int32 `[R, ceil(V / 32)]`: the allowed tokens as bits (XGrammar's layout)."""
        return self.index.fill_bitmask(states, out)

    def candidates(self, logits, states, top_k: int | None = None):
        """`(scores, tokens, next_states)`, each `[R, K]`, best first.

        `K` is the largest number of allowed tokens among the rows (or
        `top_k`, if smaller); padding has score `-inf`, token -1, state -1.
        """
        logits = np.asarray(logits, np.float32)
        states = np.asarray(states).reshape(-1)
        row, tokens, nxt = self.index.edges(states)
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

    def advance(self, states, tokens) -> np.ndarray:
        """int32 `[R]`: the next states; -1 where a token is not allowed."""
        return self.index.next_states(states, tokens)

    def is_finished(self, states) -> np.ndarray:
        """bool `[R]`: rows that have emitted EOS."""
        return self.index.is_finished(states)

    def item_ids(self, states) -> np.ndarray:
        """int32 `[R]`: the member (position in the caller's list) of finished
        rows, -1 for the others."""
        return self.index.item_ids(states)
