"""`PPVApproximate`: binary search for the top logits only (baseline)."""

from __future__ import annotations

import numpy as np
from keras import ops

from static_keras.baselines._common import check_step
from static_keras.baselines._common import pad_invalid
from static_keras.baselines.ppv_exact import PPVExact
from static_keras.baselines.ppv_exact import SortedPrefixKeys


class PPVApproximate(PPVExact):
    """Approximate PPV: search only the `num_probe` best tokens of each row.

    Same sorted per-level keys and states as `PPVExact`, but at each step a
    row tests only its `num_probe` highest log-probs (the STATIC paper's
    set-up uses 50) with `num_probe` binary searches instead of `V`. Every
    candidate it returns is valid, but a valid token outside a row's top
    `num_probe` is never considered: the search can miss sequences, or return
    fewer results than exist (a row whose probes are all invalid dies). The
    benchmarks report its recall against the exact result.

    Candidates per row: `min(num_probe, V)` (`dense_top_k` is ignored), sorted by
    score with invalid probes as padding (score -inf, token -1, state -1).

    Args:
        sequences: int array-like `[N, L]`, the valid set.
        vocab_size: int, V.
        keys: a prebuilt `SortedPrefixKeys` instead of `sequences` (shares
            the device arrays with a `PPVExact`).
        num_probe: int, tokens searched per row. Defaults to 50.
        search: `"native"` or `"unrolled"` (see `PPVExact`). Defaults to
            `"native"`.

    Example:

    >>> import numpy as np
    >>> ppv = PPVApproximate([[1, 2], [1, 3], [0, 2]], vocab_size=4, num_probe=1)
    >>> logits = np.log(np.array([[0.1, 0.2, 0.3, 0.4]], "float32"))
    >>> scores, tokens, states = ppv.candidates(logits, np.zeros(1, "int32"), 0)
    >>> np.asarray(tokens).tolist()  # token 3 is the best but invalid
    [[-1]]

    References:
        Ye et al., "Efficient and Accurate Prefix-Constrained Decoding"
        (AISTATS 2025); Su et al., "Vectorizing the Trie" (arXiv:2602.22647).
    """

    def __init__(
        self,
        sequences=None,
        vocab_size: int | None = None,
        *,
        keys: SortedPrefixKeys | None = None,
        num_probe: int = 50,
        search: str = "native",
    ):
        if isinstance(num_probe, bool) or not isinstance(num_probe, (int, np.integer)):
            raise ValueError(f"`num_probe` must be an int. Received: num_probe={num_probe!r}")
        if num_probe < 1:
            raise ValueError(f"`num_probe` must be positive. Received: num_probe={num_probe}")
        super().__init__(sequences, vocab_size, keys=keys, search=search)
        self.num_probe = int(min(num_probe, self.vocab_size))

    def candidates(self, log_probs, states, step: int, dense_top_k: int | None = None):
        """`(scores, tokens, next_states)`, each `[R, min(num_probe, V)]`."""
        check_step(step, self.length)
        log_probs = ops.cast(log_probs, "float32")
        scores, tokens = ops.top_k(log_probs, self.num_probe, sorted=True)
        tokens = ops.cast(tokens, "int32")
        found, position = self._search(states, tokens, step)
        return pad_invalid(scores, tokens, position, found)
