"""`TransformersLogitsProcessor`: a string set inside Hugging Face `generate()`.

A logits processor for `transformers` (greedy, sampling, beam search) on top
of the stateless `StringLogitsProcessor`. It duck-types
`transformers.LogitsProcessor` (`__call__(input_ids, scores) -> scores`), so
this module imports neither torch nor transformers: torch is imported on the
first call, from the tensors `generate()` passes.
"""

from __future__ import annotations

import numpy as np

from static_keras.strings.logits_processor import StringLogitsProcessor
from static_keras.strings.string_index import StringIndex


def max_padding_columns(vocab_size: int) -> int:
    """How many more scores than tokens a model may have: models pad their
    embedding rows to a round multiple (a few hundred rows at most), never
    by a whole tokenizer's worth. More means the index speaks another
    tokenizer (GPT-2's 50,257 tokens under a Qwen2 model's 151,936 scores)."""
    return max(1024, vocab_size // 64)


class TransformersLogitsProcessor:
    """Makes `model.generate()` answer with exactly one member of a `StringIndex`.

    Pass it in `logits_processor=[processor]` with the index's EOS as
    `eos_token_id` (or `**processor.generate_kwargs()`, which also sets
    `pad_token_id` and `max_new_tokens=index.length`). The answer starts
    after the prompt: `prompt_length`, or the width of `input_ids` at the
    first call (left padding gives every row that width; encoder-decoder
    models start with one decoder token). Each row's automaton state is
    derived from its own generated tokens, so the row reordering of beam
    search is followed: a row's state is the state of its previous-step
    prefix (a dict keyed by that prefix's bytes) advanced by its last token,
    one `next_states` call per step for all rows; a row whose prefix was not
    seen at the previous step is walked from the start.

    Disallowed scores become `-inf`, as transformers' own
    `PrefixConstrainedLogitsProcessor` does: beam search adds processed
    log-probs to running scores initialised at `-1e9` for duplicate beams,
    where the kit's finite `MASKED_LOGIT` (`-1e9`) would tie with or beat
    allowed tokens; `-inf` never does. No row is ever fully masked (no NaN
    in sampling): after EOS a row allows only EOS and `pad_token_id` (greedy
    batches keep feeding finished rows), and a row with nothing allowed (it
    left the set: a `-inf` beam, or an empty per-request subset) allows EOS
    and ends outside the set (`item_ids` -1).

    A new `generate()` call is recognised when `input_ids` is not one token
    longer than at the previous call, with as many rows (or after
    `reset()`); `prompt_length`, when given, is kept across calls. A new
    prompt exactly one token longer than the previous call's last input
    would pass for the next step: call `reset()` between calls if that can
    happen.

    Args:
        index: `StringIndex`, or a `StringLogitsProcessor` (with its
            eligibility sets).
        prompt_length: int or None. Width of the prompt part of `input_ids`.
            Defaults to None (the width at the first call).
        pad_token_id: int or None. Also allowed after EOS. Defaults to None.
        set_ids: int `[B]` or None: per batch row, the eligibility set
            (`StringLogitsProcessor` `set_ids`); row r of `input_ids` uses
            batch row `r // (R // B)` (beams and `num_return_sequences`).
            Defaults to None.
        excluded_item_ids: int `[B, E]` or None, padded with -1: per batch
            row, item ids it must not answer. Defaults to None.

    Call arguments:
        input_ids: int tensor `[R, T]`: the prompts and the tokens so far.
        scores: float tensor `[R, V]`, `V >= index.vocab_size`: masked in
            place (and returned).

    Example (the member of each generated sequence; prompt of width 2):

    >>> from static_keras.strings import TokenVocabulary
    >>> vocab = TokenVocabulary.from_token_bytes(
    ...     [b"c", b"a", b"t", b"ca", b"d", b"o", b"g", b"<eos>"], special=[7])
    >>> index = StringIndex.from_strings(["cat", "dog"], vocab, eos_token_id=7)
    >>> processor = TransformersLogitsProcessor(index, prompt_length=2)
    >>> sequences = np.array([[5, 5, 3, 2, 7], [5, 5, 4, 5, 6], [5, 5, 4, 5, 7]])
    >>> processor.item_ids(sequences).tolist(), processor.members(sequences)
    ([0, -1, -1], ['cat', None, None])
    """

    def __init__(
        self,
        index: StringIndex | StringLogitsProcessor,
        *,
        prompt_length: int | None = None,
        pad_token_id: int | None = None,
        set_ids=None,
        excluded_item_ids=None,
    ):
        if isinstance(index, StringIndex):
            index = StringLogitsProcessor(index)
        if not isinstance(index, StringLogitsProcessor):
            raise ValueError(
                "`index` must be a StringIndex or a StringLogitsProcessor. "
                f"Received: {type(index).__name__}"
            )
        self.processor = index
        self.index = index.index
        if prompt_length is not None and int(prompt_length) < 0:
            raise ValueError(f"`prompt_length` must be >= 0. Received: {prompt_length}")
        self._given_prompt = None if prompt_length is None else int(prompt_length)
        self.pad_token_id = None if pad_token_id is None else int(pad_token_id)
        self._subsets = _batch_subsets(set_ids, excluded_item_ids)
        if self._subsets and self.processor.eligibility is None and set_ids is not None:
            raise ValueError("`set_ids` needs a StringLogitsProcessor with eligibility sets")
        self.reset()

    @property
    def eos_token_id(self) -> int:
        return self.index.eos_token_id

    @property
    def prompt_length(self) -> int | None:
        """The prompt width in use (None before the first call)."""
        return self._prompt

    def reset(self) -> None:
        """Forgets the current generation (the next call starts a new one)."""
        self._prompt = self._given_prompt
        self._last_shape = None
        self._parents: dict[bytes, int] = {}

    def generate_kwargs(self) -> dict:
        """Keyword arguments of `generate()` that this processor needs."""
        pad = self.eos_token_id if self.pad_token_id is None else self.pad_token_id
        return {
            "logits_processor": [self],
            "eos_token_id": self.eos_token_id,
            "pad_token_id": pad,
            "max_new_tokens": self.index.length,
        }

    def __call__(self, input_ids, scores):
        """Masks `scores` (`[R, V]`, `V >= index.vocab_size`, padding columns
        included: `max_padding_columns`) in place and returns it."""
        import torch

        rows, width = scores.shape
        if width < self.index.vocab_size:
            raise ValueError(
                f"The model's scores have {width} columns but the index was compiled for a "
                f"vocabulary of {self.index.vocab_size} tokens: compile it with the model's "
                "tokenizer vocabulary"
            )
        padding = width - self.index.vocab_size
        if padding > max_padding_columns(self.index.vocab_size):
            raise ValueError(
                f"The model's scores have {width:,} columns, {padding:,} more than the "
                f"{self.index.vocab_size:,} tokens the index was compiled for; models pad a "
                "few hundred columns at most, so the index was compiled for another tokenizer "
                "than the model's (its answers would decode as other strings): compile it with "
                "the model's own tokenizer vocabulary (TokenVocabulary.load('tokenizer.json'))"
            )
        if input_ids.shape[0] != rows:
            raise ValueError(
                f"`input_ids` has {input_ids.shape[0]} rows and `scores` {rows}: they must match"
            )
        for name in ("eos_token_id", "pad_token_id"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < width:
                raise ValueError(f"`{name}` {value} lies outside the model's {width} scores")
        states = self._track(input_ids)
        row, token = self._allowed_pairs(states)
        device = scores.device
        keep = torch.zeros(scores.shape, dtype=torch.bool, device=device)
        keep[torch.from_numpy(row).to(device), torch.from_numpy(token).to(device)] = True
        return scores.masked_fill_(~keep, float("-inf"))

    def item_ids(self, sequences, prompt_length: int | None = None) -> np.ndarray:
        """int32 `[N]`: the item id (position in the string list) each sequence
        answers (`generate()` output, prompt included); -1 where it does not
        end on a member with EOS. Tokens after the first EOS are ignored."""
        prompt = self._prompt if prompt_length is None else int(prompt_length)
        if prompt is None:
            raise ValueError(
                "`prompt_length` is unknown: pass it, or call this after generate() used "
                "the processor"
            )
        return self.index.item_ids(self._walk(self._answer(_ids(sequences), prompt)))

    def members(self, sequences, prompt_length: int | None = None) -> list[str | None]:
        """The member string each sequence answers, None where it answers none."""
        return [
            None if i < 0 else self.index.string_bytes(int(i)).decode("utf-8", "replace")
            for i in self.item_ids(sequences, prompt_length)
        ]

    def prefix_allowed_tokens_fn(self, batch_id: int, input_ids) -> list[int]:
        """For `generate(prefix_allowed_tokens_fn=...)` (needs `prompt_length`):
        walks the row from the start at each call, so it costs O(length);
        prefer the processor itself."""
        if self._given_prompt is None:
            raise ValueError("`prefix_allowed_tokens_fn` needs `prompt_length=` in the constructor")
        row = _ids(_numpy(input_ids).reshape(1, -1))
        state = self._walk(self._answer(row, self._given_prompt))
        _, token = self._allowed_pairs(state, batch_rows=np.array([batch_id]))
        return token.tolist()

    # Helpers ---------------------------------------------------------------

    def _track(self, input_ids) -> np.ndarray:
        """int32 `[R]`: each row's automaton state (-1: left the set), tracked
        across the calls of one `generate()`."""
        ids = _ids(input_ids)
        shape = ids.shape
        if self._last_shape is None or shape != (self._last_shape[0], self._last_shape[1] + 1):
            self.reset()  # a new generate() call
        if self._prompt is None:
            self._prompt = shape[1]
        answer = self._answer(ids, self._prompt)
        if answer.shape[1] == 0:
            states = np.zeros(shape[0], np.int32)
        else:
            miss = -2
            parents = np.array([self._parents.get(row[:-1].tobytes(), miss) for row in answer])
            unseen = np.flatnonzero(parents == miss)
            if unseen.size:
                parents[unseen] = self._walk(answer[unseen, :-1])
            states = self._step(parents, answer[:, -1])
        self._parents = {row.tobytes(): int(state) for row, state in zip(answer, states)}
        self._last_shape = shape
        return states

    def _allowed_pairs(self, states, batch_rows=None) -> tuple[np.ndarray, np.ndarray]:
        """`(row, token)` int64: the allowed tokens of each state (`batch_rows`:
        the batch row of each state for per-request subsets; defaults to
        `r // (R // B)`)."""
        states = np.asarray(states, np.int64).reshape(-1)
        finished = self.index.is_finished(states)
        live = np.where(finished | (states < 0), -1, states)
        if self._subsets:
            subsets = self._row_subsets(states.size, batch_rows)
            row, token = np.nonzero(self.processor.allowed(live, **subsets))
        else:
            row, token, _ = self.index.edges(live)
        # Finished rows: EOS and pad; rows with nothing allowed: EOS.
        stuck = np.flatnonzero(finished | (np.bincount(row, minlength=states.size) == 0))
        extra = [(stuck, np.full(stuck.size, self.eos_token_id))]
        if self.pad_token_id is not None and self.pad_token_id != self.eos_token_id:
            done = np.flatnonzero(finished)
            extra.append((done, np.full(done.size, self.pad_token_id)))
        row = np.concatenate([row] + [r for r, _ in extra]).astype(np.int64)
        token = np.concatenate([token] + [t for _, t in extra]).astype(np.int64)
        return row, token

    def _step(self, states, tokens) -> np.ndarray:
        """The next states; finished and dead (-1) rows keep their state."""
        states = np.asarray(states, np.int64)
        nxt = self.index.next_states(np.maximum(states, 0), tokens)
        keep = self.index.is_finished(states) | (states < 0)
        return np.where(keep, states, nxt).astype(np.int32)

    def _walk(self, answers: np.ndarray) -> np.ndarray:
        states = np.zeros(answers.shape[0], np.int32)
        for column in range(answers.shape[1]):
            states = self._step(states, answers[:, column])
        return states

    def _answer(self, ids: np.ndarray, prompt: int) -> np.ndarray:
        if ids.shape[1] < prompt:
            raise ValueError(
                f"`input_ids` has {ids.shape[1]} columns, fewer than the prompt length {prompt}"
            )
        return np.ascontiguousarray(ids[:, prompt:], np.int64)

    def _row_subsets(self, rows: int, batch_rows) -> dict:
        batch = len(next(iter(self._subsets.values())))
        if batch_rows is None:
            if rows % batch:
                raise ValueError(
                    f"{rows} rows are not a multiple of the {batch} batch rows of the "
                    "per-request subsets"
                )
            batch_rows = np.arange(rows) // (rows // batch)
        return {name: value[batch_rows] for name, value in self._subsets.items()}


def _numpy(values) -> np.ndarray:
    if hasattr(values, "detach"):  # a torch tensor, on any device
        values = values.detach().cpu().numpy()
    return np.asarray(values)


def _ids(values) -> np.ndarray:
    array = _numpy(values)
    if array.ndim != 2 or (array.size and not np.issubdtype(array.dtype, np.integer)):
        raise ValueError(
            f"Token ids must be an int matrix [rows, length]. Received shape {array.shape}, "
            f"dtype {array.dtype}"
        )
    return array


def _batch_subsets(set_ids, excluded_item_ids) -> dict:
    subsets = {}
    if set_ids is not None:
        subsets["set_ids"] = np.asarray(set_ids).reshape(-1)
    if excluded_item_ids is not None:
        subsets["excluded_item_ids"] = np.asarray(excluded_item_ids)
        if subsets["excluded_item_ids"].ndim != 2:
            raise ValueError("`excluded_item_ids` must have shape [batch, E]")
    sizes = {len(v) for v in subsets.values()}
    if len(sizes) > 1:
        raise ValueError(f"`set_ids` and `excluded_item_ids` must have as many rows: {sizes}")
    return subsets
