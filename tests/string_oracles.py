"""Shared builders for the string-constraint tests (no tests here).

Vocabularies are built in the test process: hand-written byte lists, and BPE
tokenizers trained with `tokenizers` on text written below. A pure-Python
oracle gives the allowed tokens of a byte prefix by brute force over the
vocabulary.
"""

from __future__ import annotations

import functools
import json
import os

import numpy as np

from static_keras.strings import TokenVocabulary

EOS_TEXT = "<|endoftext|>"

#: Members used across tests: shared long prefixes, one member a prefix of
#: another, multi-byte UTF-8 (accents, CJK, emoji).
MEMBERS = [
    "Electronics > Computers > Laptops",
    "Electronics > Computers > Laptop Bags",
    "Electronics > Computers",
    "Electronics > Cameras",
    "Home > Kitchen > Knives",
    "Home > Kitchen",
    "Café crème",
    "東京都",
    "東京タワー",
    "Pizza 🍕",
    "🍕🍕",
    "get_weather",
    "get_weather_forecast",
    "search",
]

TRAINING_TEXT = (
    " ".join(MEMBERS)
    * 3
    + " The quick brown fox jumps over the lazy dog. Electronics and computers, cameras"
    " and laptops; kitchen knives at home. 東京 大阪 京都 タワー 🍕 🍔 😀 café crème brûlée"
    " get weather forecast search results for the home page. "
)


@functools.lru_cache(maxsize=None)
def byte_level_tokenizer_json(vocab_size: int = 420) -> str:
    """A byte-level BPE (GPT-2 style) trained on `TRAINING_TEXT`, as JSON text."""
    from tokenizers import Tokenizer
    from tokenizers import decoders
    from tokenizers import models
    from tokenizers import pre_tokenizers
    from tokenizers import trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([TRAINING_TEXT] * 4, trainer=trainer)
    return tokenizer.to_str()


@functools.lru_cache(maxsize=None)
def sentencepiece_tokenizer_json(vocab_size: int = 300) -> str:
    """A SentencePiece-style BPE (Metaspace, byte fallback) as JSON text.

    Trained without bytes, then rebuilt with the 256 `<0xNN>` pieces ahead of
    the learned pieces and `byte_fallback=True`, as Llama 2's tokenizer is.
    """
    from tokenizers import Tokenizer
    from tokenizers import decoders
    from tokenizers import models
    from tokenizers import pre_tokenizers
    from tokenizers import trainers

    base = Tokenizer(models.BPE(unk_token="<unk>"))
    base.pre_tokenizer = pre_tokenizers.Metaspace()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<unk>", "<s>", "</s>"],
        show_progress=False,
        limit_alphabet=60,  # keep rare characters (CJK, emoji) out: bytes cover them
    )
    base.train_from_iterator([TRAINING_TEXT] * 4, trainer=trainer)
    config = json.loads(base.to_str())
    learned = config["model"]["vocab"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for value in range(256):
        vocab[f"<0x{value:02X}>"] = len(vocab)
    for piece, _ in sorted(learned.items(), key=lambda item: item[1]):
        vocab.setdefault(piece, len(vocab))
    merges = [
        tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in config["model"]["merges"]
    ]
    tokenizer = Tokenizer(
        models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True)
    )
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Sequence(
        [
            decoders.Replace("\u2581", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    tokenizer.add_special_tokens(["<unk>", "<s>", "</s>"])
    return tokenizer.to_str()


def tokenizer_from_json(text: str):
    from tokenizers import Tokenizer

    return Tokenizer.from_str(text)


def byte_level_vocabulary(tmp_dir=None) -> TokenVocabulary:
    """The byte-level BPE as a `TokenVocabulary`, through a tokenizer.json file."""
    text = byte_level_tokenizer_json()
    if tmp_dir is None:
        return TokenVocabulary.from_tokenizer_json(tokenizer_from_json(text))
    path = os.path.join(tmp_dir, "tokenizer.json")
    with open(path, "w") as file:
        file.write(text)
    return TokenVocabulary.from_tokenizer_json(path)


def random_byte_vocabulary(seed: int, size: int, alphabet: bytes, max_len: int = 4):
    """All single bytes of `alphabet`, then random multi-byte tokens, then EOS."""
    rng = np.random.default_rng(seed)
    tokens = [bytes([b]) for b in alphabet]
    seen = set(tokens)
    while len(tokens) < size - 1:
        n = int(rng.integers(2, max_len + 1))
        token = bytes(rng.choice(list(alphabet), n).tolist())
        if token not in seen:
            seen.add(token)
            tokens.append(token)
    tokens.append(b"</s>")
    return TokenVocabulary.from_token_bytes(
        tokens, special=[len(tokens) - 1], eos_token_id=len(tokens) - 1
    )


class Oracle:
    """Brute force over the vocabulary: the allowed tokens of a byte prefix.

    `allowed(prefix)` = {t : prefix + bytes(t) is a prefix of some member}
    plus EOS when `prefix` is a member. With `prune=True` a token must also
    leave a completable prefix (some member through it whose remaining bytes
    some token sequence spells); in a vocabulary with every single byte the
    two coincide.
    """

    def __init__(self, members, vocabulary: TokenVocabulary, eos: int, prune: bool = True):
        self.members = {m.encode() if isinstance(m, str) else m for m in members}
        self.prefixes = {m[:i] for m in self.members for i in range(len(m) + 1)}
        text = vocabulary.text_tokens.copy()
        text[eos] = False
        self.tokens = [(t, vocabulary.token_bytes[t]) for t in np.flatnonzero(text)]
        self.token_set = {b for _, b in self.tokens}
        self.max_token = max(len(b) for _, b in self.tokens)
        self.eos = eos
        self.prune = prune
        self._completable = {}

    def spellable(self, data: bytes) -> bool:
        reach = [True] + [False] * len(data)
        for i in range(len(data)):
            if reach[i]:
                for j in range(i + 1, min(len(data), i + self.max_token) + 1):
                    if data[i:j] in self.token_set:
                        reach[j] = True
        return reach[-1]

    def completable(self, prefix: bytes) -> bool:
        if prefix not in self._completable:
            self._completable[prefix] = any(
                m.startswith(prefix) and self.spellable(m[len(prefix) :]) for m in self.members
            )
        return self._completable[prefix]

    def allowed(self, prefix: bytes) -> set[int]:
        out = set()
        for token, data in self.tokens:
            q = prefix + data
            if q in self.prefixes and (not self.prune or self.completable(q)):
                out.add(int(token))
        if prefix in self.members:
            out.add(self.eos)
        return out


def explore(index, vocabulary, limit: int | None = None, seed: int = 0):
    """(state, prefix bytes, step) of states reached by breadth-first search.

    Every reachable trie state once (with the bytes of the first path that
    reached it); with `limit`, a random sample of that many per step.
    """
    rng = np.random.default_rng(seed)
    frontier = {0: b""}
    seen = {}
    for step in range(index.length):
        items = list(frontier.items())
        if limit is not None and len(items) > limit:
            pick = rng.choice(len(items), limit, replace=False)
            items = [items[i] for i in pick]
        nxt = {}
        for state, prefix in items:
            seen.setdefault(state, (prefix, step))
            row, tokens, states = index.edges([state])
            for token, target in zip(tokens.tolist(), states.tolist()):
                if token != index.eos_token_id:
                    nxt.setdefault(target, prefix + vocabulary.token_bytes[token])
        frontier = nxt
        if not frontier:
            break
    return [(state, prefix, step) for state, (prefix, step) in seen.items()]


def reachable_by_step(index):
    """Exact set of states reachable after exactly t tokens, t < length."""
    frontier = {0}
    out = []
    for _ in range(index.length):
        out.append(frontier)
        _, _, states = index.edges(sorted(frontier))
        frontier = set(states.tolist())
    return out


# Beam search oracles -------------------------------------------------------

_ROWS = 97
_WEIGHTS = np.array([31, 17, 13, 7, 5, 3, 2, 11, 19, 23, 29, 37, 41, 43, 47, 53] * 4)


def string_table(vocab, seed=0):
    return np.random.default_rng(seed).normal(size=(_ROWS, vocab)).astype("float32") * 3


def prefix_code(prefix):
    """The `string_table` row `string_step_fn` reads after `prefix`."""
    t = len(prefix)
    return (int((np.array(prefix, dtype=np.int64) * _WEIGHTS[:t]).sum()) + 29 * t) % _ROWS


def string_step_fn(table):
    """A decoder step whose logits are `table`'s row for a hash of the prefix."""
    from keras import ops  # this module stays free of Keras until a decode needs it

    tensor = ops.convert_to_tensor(table)

    def step(prefix, state):
        t = prefix.shape[1]
        code = ops.zeros((ops.shape(prefix)[0],), "int32") + 29 * t
        if t:
            code = code + ops.sum(prefix * ops.convert_to_tensor(_WEIGHTS[:t], "int32"), axis=1)
        return ops.take(tensor, ops.mod(code, _ROWS), axis=0), state

    return step


def _sequences(oracle, vocabulary, eos, limit):
    """Every token sequence (EOS included) that spells a member, by brute force."""
    out, stack = [], [((), b"")]
    while stack:
        tokens, prefix = stack.pop()
        for token in sorted(oracle.allowed(prefix)):
            if token == eos:
                out.append(tokens + (eos,))
            elif len(tokens) + 1 < limit:
                stack.append((tokens + (token,), prefix + vocabulary.token_bytes[token]))
    return out


def ranked_tokenizations(vocab, members, index, table):
    oracle = Oracle(members, vocab, index.eos_token_id)
    sequences = _sequences(oracle, vocab, index.eos_token_id, index.length)
    log_probs = table - np.log(np.exp(table).sum(1, keepdims=True))
    scores = [sum(log_probs[prefix_code(s[:t]), s[t]] for t in range(len(s))) for s in sequences]
    order = np.argsort(-np.array(scores), kind="stable")
    return [sequences[i] for i in order], [scores[i] for i in order]
